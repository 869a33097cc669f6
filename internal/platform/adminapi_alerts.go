package platform

import (
	"net/http"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/ops"
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
		if err := ops.CheckUserID("userId", q.Get("userId")); err != nil {
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
	page, err := app.ops.ListAlerts(r.Context(), ops.AlertQuery{UserID: q.Get("userId"), ServiceID: q.Get("serviceId"),
		Status: q.Get("status"), Cursor: cursor, Limit: limit})
	if err != nil {
		return err
	}
	out := alertRecordPage{Alerts: make([]ops.AlertRecord, len(page.Alerts)), NextCursor: page.NextCursor}
	for i, al := range page.Alerts {
		out.Alerts[i] = ops.ViewAlert(al)
	}
	return writeJSON(w, http.StatusOK, out)
}

// alertRecordPage is a page of alerts as the admin API writes it.
type alertRecordPage struct {
	Alerts     []ops.AlertRecord `json:"alerts"`
	NextCursor string            `json:"nextCursor,omitempty"`
}
