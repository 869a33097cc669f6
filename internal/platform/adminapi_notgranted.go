package platform

import (
	"errors"
	"net/http"

	"github.com/platformgw/gateway/internal/payments"
)

// notGrantedPage is a page of top-ups paid and not granted.
type notGrantedPage struct {
	TopUps     []payments.IgnoredTopUp `json:"topUps"`
	NextCursor string                  `json:"nextCursor,omitempty"`
}

// listNotGranted: GET /platform/stripe/notgranted[?status=&limit=&cursor=]
// lists the top-ups paid and not granted that the console's Revenue page
// shows (docs/payments.md, "Money in the console"), open and resolved,
// with who marked each resolved, when and the note. It only reads: a
// top-up is marked resolved on the Revenue page.
func (a *adminAPI) listNotGranted(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "status", "limit", "cursor"); err != nil {
		return err
	}
	if app.pay == nil {
		return noPayments()
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	pay, err := app.pay.Payments()
	if errors.Is(err, payments.ErrNoPayments) {
		return noPayments()
	} else if err != nil {
		return err
	}
	rows, next, err := payments.ListNotGranted(r.Context(), pay, q.Get("status"), cursor, limit)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, notGrantedPage{TopUps: rows, NextCursor: next})
}
