package portal

import (
	"errors"
	"net/http"
	"net/url"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/payments"
)

// Payments in the portal, when the platform app has a payments block
// (docs/payments.md): a paid plan's Subscribe opens Stripe Checkout
// (POST /plans/{service}/checkout, 303 to Stripe), Stripe sends the
// caller back to the plans page with a message, and the billing page
// (GET /billing) lists the caller's invoices with Stripe's links and
// opens Stripe's customer portal (POST /billing/portal, 303) to change
// the card. Without a payments block a paid plan is asked for
// ("Request access"), as before.

// paymentsCSP is the portal's CSP with the two Stripe origins a form may
// end at: a browser applies form-action to the 303 after the POST too.
const paymentsCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self' https://checkout.stripe.com https://billing.stripe.com; frame-ancestors 'none'; base-uri 'none'"

// sells reports whether a paid plan is bought through Stripe here.
func (h *Handler) sells(serviceID, productID string) bool {
	return h.pay != nil && h.pay.Sells(serviceID, productID)
}

// absolute is the portal's URL of path, for Stripe to send the caller
// back to.
func (h *Handler) absolute(q *request, path string) string {
	base, _ := h.gatewayBase(q)
	return base + q.base + path
}

// checkout starts a Stripe Checkout for a paid plan and sends the caller
// there. A caller whose subscription grants access to a plan Stripe
// bills changes plan in Stripe's customer portal instead.
func (h *Handler) checkout(q *request, sess session, svc *catalog.Service, productID string) {
	if svc.SelfServiceOffer(productID) == catalog.NotOffered {
		h.refusePlan(q, sess, svc, http.StatusForbidden, "The operator assigns this plan; you cannot take it yourself. Nothing was changed.")
		return
	}
	if !h.sells(svc.ID, productID) {
		h.refusePlan(q, sess, svc, http.StatusConflict, "That plan is not sold through Stripe here: ask the operator for it with “Request access”. Nothing was changed.")
		return
	}
	if r, err := h.mayTake(q, sess, svc, catalog.OfferPaid); r != nil || err != nil {
		// A caller on a free or trial plan may still buy a paid one.
		cur, gerr := h.rt.Store().GetSubscription(q.r.Context(), sess.UserID, svc.ID)
		if r != nil && gerr == nil && cur.ProductID != productID && !h.sells(svc.ID, cur.ProductID) && r.status == http.StatusConflict {
			r = nil
		}
		if r != nil && r.status == http.StatusForbidden && gerr == nil && h.sells(svc.ID, cur.ProductID) {
			r.message = "Your subscription to " + svc.Name() + " is suspended because a payment failed: pay the open invoice or change your card on the Billing page, and it serves again. Nothing was changed."
		}
		if r != nil {
			h.refusePlan(q, sess, svc, r.status, r.message)
			return
		}
		if err != nil {
			h.planFailed(q, sess, svc, err)
			return
		}
	}
	back := "/plans/" + url.PathEscape(svc.ID)
	to, err := h.pay.StartSubscriptionCheckout(q.r.Context(), payments.CheckoutRequest{
		UserID: sess.UserID, ServiceID: svc.ID, ProductID: productID,
		SuccessURL: h.absolute(q, back+"?m=subscribed"), CancelURL: h.absolute(q, back+"?m=checkout-cancelled")})
	if errors.Is(err, payments.ErrCheckoutBusy) {
		// Another tab, a double submit or another node is opening this
		// caller's Checkout right now: a second one would be a second
		// subscription and a second charge.
		h.refusePlan(q, sess, svc, http.StatusConflict, "A Stripe checkout for "+svc.Name()+" is being opened for you in another tab or window; try again in a few seconds and you are taken to it. Nothing was charged.")
		return
	}
	if errors.Is(err, payments.ErrCheckoutPaid) {
		// The caller paid their last Checkout of the service and came
		// back before Stripe's webhook did: the click applied it, and
		// the plans page shows the plan. A second Checkout would be a
		// second subscription and a second charge.
		q.redirect(back + "?m=checkout-paid")
		return
	}
	if errors.Is(err, payments.ErrCheckoutConfirming) {
		h.refusePlan(q, sess, svc, http.StatusConflict, "Your payment for "+svc.Name()+" is being confirmed with Stripe; try again in a minute. No second checkout was opened and nothing more was charged.")
		return
	}
	if err != nil {
		h.logger.Error("portal: Stripe Checkout not started", zap.String("user_id", sess.UserID),
			zap.String("service_id", svc.ID), zap.String("product_id", productID), zap.Error(err))
		h.refusePlan(q, sess, svc, http.StatusBadGateway, "Stripe could not be reached to take your payment; try again in a minute. Nothing was changed and nothing was charged.")
		return
	}
	http.Redirect(q.w, q.r, to, http.StatusSeeOther)
}

// billingView is the billing page.
type billingView struct {
	Invoices []invoiceRow
	// TopUps are the caller's credit purchases, newest first.
	TopUps []topUpRow
	// CanManage: the caller has a Stripe customer, so the customer portal
	// opens.
	CanManage bool
}

type invoiceRow struct {
	ID, Service, Product, Status string
	// StatusWords is Status in words (invoiceWords).
	StatusWords string
	// Amount is money with its currency ("29.00 EUR").
	Amount              string
	Period              string
	Date                time.Time
	HostedURL, PDFURL   string
	Paid, PaymentFailed bool
}

// topUpRow is a credit purchase on the billing page.
type topUpRow struct {
	ID, Service, Pack, Credits string
	// Amount is what was paid, money with its currency; Refunded what
	// refunds and a lost dispute took back, also money ("" for none).
	Amount, Refunded string
	Date             time.Time
	ReceiptURL       string
}

// billingNotices are the billing page's messages, by a fixed code.
var billingNotices = map[string]string{
	"returned": "Back from Stripe. A change of card applies to your next invoice.",
}

// serveBilling routes /billing and /billing/portal.
func (h *Handler) serveBilling(q *request, rest string) {
	if h.pay == nil {
		h.message(q, http.StatusNotFound, "Not found", "This portal takes no payments; the operator bills you.")
		return
	}
	switch rest {
	case "":
		if !h.allow(q, http.MethodGet, http.MethodHead) {
			return
		}
		h.billing(q, "", http.StatusOK)
	case "/portal":
		if !h.allow(q, http.MethodPost) {
			return
		}
		h.billingPortal(q)
	default:
		h.message(q, http.StatusNotFound, "Not found", "There is no such page in the portal.")
	}
}

func (h *Handler) billing(q *request, problem string, status int) {
	_, sess, _, ok := h.signedIn(q)
	if !ok {
		return
	}
	ctx := q.r.Context()
	invs, err := h.pay.InvoicesOf(ctx, sess.UserID)
	if err != nil {
		h.logger.Error("portal billing", zap.String("user_id", sess.UserID), zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "Your invoices could not be read; try again.")
		return
	}
	v := &billingView{CanManage: h.pay.HasCustomer(ctx, sess.UserID)}
	for _, inv := range invs {
		row := invoiceRow{ID: inv.ID, Service: inv.ServiceID, Product: inv.ProductID, Status: inv.Status,
			HostedURL: httpsOnly(inv.HostedURL), PDFURL: httpsOnly(inv.PDFURL), Paid: inv.Status == "paid"}
		if svc, ok := h.rt.Catalog.Service(inv.ServiceID); ok {
			row.Service, row.Product = svc.Name(), productName(svc, inv.ProductID)
		}
		amount := inv.AmountDue
		if row.Paid {
			amount = inv.AmountPaid
		}
		row.Amount = payments.MinorMoney(amount, inv.Currency).String()
		row.Date = inv.PaidAt
		if row.Date.IsZero() {
			row.Date = inv.UpdatedAt
		}
		if !inv.PeriodStart.IsZero() && !inv.PeriodEnd.IsZero() && inv.PeriodEnd.After(inv.PeriodStart) {
			row.Period = inv.PeriodStart.UTC().Format("2 Jan 2006") + " – " + inv.PeriodEnd.UTC().Format("2 Jan 2006")
		}
		row.PaymentFailed = inv.Status == "open" && inv.AmountPaid < inv.AmountDue
		row.StatusWords = invoiceWords(inv.Status, row.PaymentFailed)
		v.Invoices = append(v.Invoices, row)
	}
	tops, err := h.pay.TopUpsOf(ctx, sess.UserID)
	if err != nil {
		h.logger.Error("portal billing", zap.String("user_id", sess.UserID), zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "Your credit purchases could not be read; try again.")
		return
	}
	for _, t := range tops {
		row := topUpRow{ID: t.ID, Service: t.ServiceID, Pack: t.Pack, Credits: storedCreditsText(t.Credits),
			Amount: payments.MinorMoney(t.Amount, t.Currency).String(), Date: t.PaidAt, ReceiptURL: httpsOnly(t.ReceiptURL)}
		if svc, ok := h.rt.Catalog.Service(t.ServiceID); ok {
			row.Service = svc.Name()
		}
		if back := t.Refunded + t.Disputed; back > 0 {
			row.Refunded = payments.MinorMoney(min(back, t.Amount), t.Currency).String()
		}
		v.TopUps = append(v.TopUps, row)
	}
	h.render(q, status, "billing", page{Title: "Billing", Base: q.base, CSRF: sess.CSRF, UserID: sess.UserID,
		Notice: billingNotices[q.r.URL.Query().Get("m")], Error: problem, Billing: v})
}

// httpsOnly keeps a link of Stripe's only when it is an https URL, so a
// record can never put a javascript: or plain link on the page.
func httpsOnly(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return ""
	}
	return s
}

// billingPortal opens Stripe's customer portal (303 there).
func (h *Handler) billingPortal(q *request) {
	_, sess, _, ok := h.signedIn(q)
	if !ok {
		return
	}
	if !h.checkCSRF(q, sess.CSRF) {
		return
	}
	to, err := h.pay.BillingPortalURL(q.r.Context(), sess.UserID, h.absolute(q, "/billing?m=returned"))
	if errors.Is(err, payments.ErrNoCustomer) {
		h.billing(q, "You have not paid through Stripe here yet, so there is no payment method to manage.", http.StatusConflict)
		return
	}
	if err != nil {
		h.logger.Error("portal: Stripe customer portal not opened", zap.String("user_id", sess.UserID), zap.Error(err))
		h.billing(q, "Stripe could not be reached; try again in a minute.", http.StatusBadGateway)
		return
	}
	http.Redirect(q.w, q.r, to, http.StatusSeeOther)
}
