package platform

import (
	"errors"
	"net/http"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/payments"
)

// stripeReconcile: GET /platform/stripe/reconcile?period=<YYYY-MM|from..to>
// compares the period's metered usage per Stripe customer and meter with
// Stripe's meter event summaries (docs/payments.md, "Metered usage"). It
// answers 200 whether or not rows differ; `caddy platform stripe
// reconcile` exits non-zero when any do.
func (a *adminAPI) stripeReconcile(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "period"); err != nil {
		return err
	}
	if app.pay == nil {
		return apierror.New(apierror.NotFound, "the running config has no payments block: nothing is metered to Stripe")
	}
	if q.Get("period") == "" {
		return apierror.Invalid("period", "period is required: a month (2026-11) or from..to (2026-11-01..2026-11-15)")
	}
	from, to, err := payments.ParsePeriod(q.Get("period"), app.Now())
	if err != nil {
		return apierror.Invalid("period", err.Error())
	}
	rec, err := app.pay.Reconcile(r.Context(), from, to)
	var se *payments.StripeError
	if errors.As(err, &se) {
		return apierror.New(apierror.ServiceError, se.Error())
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, rec)
}
