package platform

import (
	"net/http"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/payments"
)

// codePaymentsNotConfigured: the running config has no payments block.
const codePaymentsNotConfigured = "payments_not_configured"

// paymentsOf is the running app's payments integration; without one it
// answers 409 payments_not_configured and returns nil.
func paymentsOf(app *App, w http.ResponseWriter) *payments.Service {
	if app.pay == nil {
		writeErrorStatus(w, http.StatusConflict, apierror.New(codePaymentsNotConfigured,
			"the running config has no payments block (payments stripe { … }); add one and reload"))
	}
	return app.pay
}

// stripeSync: POST /platform/stripe/sync creates the Stripe Products and
// Prices of the paid products that have no Price configured, and answers
// the `price …` lines to put in the payments block.
func (a *adminAPI) stripeSync(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	if err := checkQuery(r.URL.Query()); err != nil {
		return err
	}
	svc := paymentsOf(app, w)
	if svc == nil {
		return nil
	}
	res, err := svc.SyncCatalog(r.Context())
	if err != nil {
		writeErrorStatus(w, http.StatusBadGateway, apierror.New(apierror.ServiceError, "stripe sync stopped: "+err.Error()+"; what was created before is kept, run it again"))
		return nil
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
	svc := paymentsOf(app, w)
	if svc == nil {
		return nil
	}
	res, err := svc.Resync(r.Context())
	if err != nil {
		writeErrorStatus(w, http.StatusBadGateway, apierror.New(apierror.ServiceError, "stripe resync stopped: "+err.Error()+"; what was applied before is kept, run it again"))
		return nil
	}
	return writeJSON(w, http.StatusOK, res)
}
