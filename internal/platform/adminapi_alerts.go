package platform

import (
	"net/http"

	"github.com/platformgw/gateway/internal/apierror"
)

// listAlerts: GET /platform/alerts[?userId=&serviceId=&status=&limit=&cursor=],
// newest first, through ListAlerts (the console shows the same).
func (a *adminAPI) listAlerts(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "userId", "serviceId", "status", "limit", "cursor"); err != nil {
		return err
	}
	// Given but empty is a mistake, not "every user".
	if q.Has("userId") {
		if err := checkUserID("userId", q.Get("userId")); err != nil {
			return err
		}
	}
	for _, name := range []string{"serviceId", "status"} {
		if q.Has(name) && q.Get(name) == "" {
			return apierror.Invalid(name, name+" is empty; leave it out to list every alert")
		}
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	page, err := app.ListAlerts(r.Context(), AlertQuery{UserID: q.Get("userId"), ServiceID: q.Get("serviceId"),
		Status: q.Get("status"), Cursor: cursor, Limit: limit})
	if err != nil {
		return err
	}
	out := alertRecordPage{Alerts: make([]alertRecord, len(page.Alerts)), NextCursor: page.NextCursor}
	for i, al := range page.Alerts {
		out.Alerts[i] = viewAlert(al)
	}
	return writeJSON(w, http.StatusOK, out)
}

// alertRecordPage is a page of alerts as the admin API writes it.
type alertRecordPage struct {
	Alerts     []alertRecord `json:"alerts"`
	NextCursor string        `json:"nextCursor,omitempty"`
}
