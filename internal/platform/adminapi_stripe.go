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

// noPayments is the answer of the stripe routes when the running config
// has no payments block.
func noPayments() error {
	return apierror.New(apierror.NotFound, "the running config has no payments block (payments stripe { … }); add one and reload")
}

// stripeSync: POST /platform/stripe/sync creates the Stripe Products and
// Prices of the paid products that have no Price configured, and answers
// the `price …` lines to put in the payments block.
func (a *adminAPI) stripeSync(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	if err := checkQuery(r.URL.Query()); err != nil {
		return err
	}
	if app.pay == nil {
		return noPayments()
	}
	res, err := app.pay.SyncCatalog(r.Context())
	if err != nil {
		return apierror.New(apierror.ServiceError, "stripe sync stopped: "+err.Error()+"; what was created before is kept, run it again")
	}
	if res.Created == nil {
		res.Created = []payments.SyncedPrice{}
	}
	return writeJSON(w, http.StatusOK, res)
}

// stripeResync: POST /platform/stripe/resync reads the subscriptions and
// recent invoices of every known customer back from Stripe and applies
// them as the webhooks would.
func (a *adminAPI) stripeResync(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	if err := checkQuery(r.URL.Query()); err != nil {
		return err
	}
	if app.pay == nil {
		return noPayments()
	}
	res, err := app.pay.Resync(r.Context())
	if err != nil {
		return apierror.New(apierror.ServiceError, "stripe resync stopped: "+err.Error()+"; what was applied before is kept, run it again")
	}
	return writeJSON(w, http.StatusOK, res)
}
