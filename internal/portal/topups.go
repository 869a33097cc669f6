package portal

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// Prepaid top-ups in the portal (docs/payments.md, "Prepaid top-ups"): a
// caller on a prepaid plan sees their balance, what of it expires when,
// and the packs of credits the operator sells (`topup` in the payments
// block), each with its price in money and a Buy button that opens
// Stripe Checkout. The credits arrive when Stripe's signed webhook says
// the payment is paid, not when the caller comes back.

// topUpNotices are the messages on the way back from Checkout.
var topUpNotices = map[string]string{
	"paid":      "Thank you: your payment went through. Your credits are added as soon as Stripe confirms it, usually within a minute; reload this page to see them.",
	"cancelled": "You left the checkout; nothing was paid and nothing was changed.",
}

// creditsView is the prepaid part of a plans page.
type creditsView struct {
	ProductID string
	// Balance is the caller's credits; Negative when refunds took back
	// more than was left, and calls are refused until they buy more.
	Balance  billing.Units
	Negative bool
	// Expiring are the grants with an expiry and what of them ends then
	// if nothing more is spent, soonest first.
	Expiring []expiringCredits
	// HeldExpiring is what grants that expired left to calls and jobs
	// running at their expiry (their Deferred): what those calls do not
	// use expires when they finish.
	HeldExpiring billing.Units
	// Packs are what the caller can buy; none when payments are off.
	Packs []packView
}

type expiringCredits struct {
	Credits billing.Units
	At      time.Time
}

// packView is a pack of credits and its price, money with its currency,
// never added to credits.
type packView struct {
	Name    string
	Credits billing.Units
	// Price is "10.00 USD"; when Stripe cannot say, PriceNote says the
	// currency and that Checkout shows the amount.
	Price, PriceNote string
	// Lasts is "credits last 30 days" for a pack with an expiry.
	Lasts string
}

// prepaidWithPacks reports whether productID of svc is a prepaid plan
// whose credits callers buy here: then subscribing to it costs nothing
// (a zero balance) and the caller buys credits on its page, rather than
// asking the operator for it. A listing with a period price (a fee on
// top of the credits) is not one: taking it costs that fee.
func (h *Handler) prepaidWithPacks(svc *catalog.Service, productID string) bool {
	if h.pay == nil || svc.SelfServiceOffer(productID) != catalog.OfferPaid {
		return false
	}
	p, ok := svc.Product(productID)
	if !ok || p.BillingModel != billing.Prepaid {
		return false
	}
	if l, ok := svc.Listing(productID); !ok || l.PeriodPrice != nil && *l.PeriodPrice > 0 {
		return false
	}
	cfg := h.pay.Config()
	return len(cfg.TopUpsFor(svc.ID, productID)) > 0
}

// prepaidPlanAction is the button of a prepaid plan with packs on the
// plans page.
func prepaidPlanAction(productID string, cur *currentPlan) (action, note string) {
	switch {
	case cur != nil && cur.Live && cur.ProductID == productID:
		return "", "Your plan. Buy credits above."
	case cur != nil && cur.Live:
		return "", "You have another plan of this service; cancel it to take this one."
	}
	return "subscribe", "Free to take: you pay for the credits you buy, and calls spend them."
}

// creditsOf reads the prepaid part of the plans page for the caller's
// subscription sub to svc; nil when its product is not prepaid.
func (h *Handler) creditsOf(q *request, svc *catalog.Service, sub store.Subscription) *creditsView {
	p, ok := svc.Product(sub.ProductID)
	if !ok || p.BillingModel != billing.Prepaid {
		return nil
	}
	v := &creditsView{ProductID: p.ID, Balance: sub.Credits, Negative: sub.Credits < 0}
	if pay, ok := h.rt.Store().(store.Payments); ok {
		grants, err := pay.ListCreditGrants(q.r.Context(), sub.UserID, sub.ServiceID)
		if err != nil {
			h.logger.Error("portal: reading credit grants", zap.String("user_id", sub.UserID), zap.Error(err))
		}
		v.Expiring = expiringOf(sub.Credits, grants)
		v.HeldExpiring = heldExpiringOf(grants)
	}
	if h.pay == nil {
		return v
	}
	cfg := h.pay.Config()
	for _, t := range cfg.TopUpsFor(svc.ID, p.ID) {
		pv := packView{Name: t.Name, Credits: t.Credits}
		if m, ok := h.pay.PackPrice(q.r.Context(), t); ok {
			pv.Price = m.String()
		} else if l, ok := svc.Listing(p.ID); ok && l.Currency != "" {
			pv.PriceNote = "paid in " + l.Currency + "; the amount is shown at checkout"
		} else {
			pv.PriceNote = "the amount is shown at checkout"
		}
		if t.ExpiresAfter > 0 {
			pv.Lasts = "credits last " + durationWords(time.Duration(t.ExpiresAfter))
		}
		v.Packs = append(v.Packs, pv)
	}
	return v
}

// expiringOf is what of the balance each grant with an expiry removes at
// its time if nothing more is spent: the store's expiry rule
// (store.ExpireGrants), applied at each expiry in turn.
func expiringOf(balance billing.Units, grants []store.CreditGrant) []expiringCredits {
	grants = slices.Clone(grants)
	var out []expiringCredits
	for {
		var next time.Time
		for _, g := range grants {
			if g.ExpiredAt.IsZero() && !g.ExpiresAt.IsZero() && (next.IsZero() || g.ExpiresAt.Before(next)) {
				next = g.ExpiresAt
			}
		}
		if next.IsZero() {
			return out
		}
		expired, after := store.ExpireGrants(balance, grants, next)
		var gone billing.Units
		for _, e := range expired {
			gone += e.Expired
			for i := range grants {
				if grants[i].ID == e.ID {
					grants[i] = e
				}
			}
		}
		if gone > 0 {
			out = append(out, expiringCredits{Credits: gone, At: next})
		}
		balance = after
	}
}

// heldExpiringOf is what the grants that expired still leave to the
// calls and jobs that held it at their expiry (store.CreditGrant's
// Deferred): it expires as far as those calls do not use it.
func heldExpiringOf(grants []store.CreditGrant) billing.Units {
	var n billing.Units
	for _, g := range grants {
		n += max(g.Deferred, 0)
	}
	return n
}

// durationWords is an expires_after in days ("30 days"), or hours below a
// day.
func durationWords(d time.Duration) string {
	switch days := int(d / (24 * time.Hour)); {
	case d%(24*time.Hour) != 0:
		return d.String()
	case days == 1:
		return "1 day"
	default:
		return strconv.Itoa(days) + " days"
	}
}

// buyCredits opens Stripe Checkout for a pack (POST
// /plans/{service}/buy, with product and pack).
func (h *Handler) buyCredits(q *request, serviceID string) {
	_, sess, _, ok := h.signedIn(q)
	if !ok {
		return
	}
	if !h.checkCSRF(q, sess.CSRF) {
		return
	}
	svc, ok := h.publicService(serviceID)
	if !ok {
		h.message(q, http.StatusNotFound, "No such service", "There is no public service with that id. Nothing was changed.")
		return
	}
	if h.pay == nil {
		h.refusePlan(q, sess, svc, http.StatusNotFound, "Credits are not sold here: ask the operator. Nothing was changed.")
		return
	}
	productID, pack := q.r.PostForm.Get("product"), q.r.PostForm.Get("pack")
	base, _ := h.gatewayBase(q)
	back := base + q.base + "/plans/" + url.PathEscape(svc.ID) + "?m="
	to, err := h.pay.StartTopUp(q.r.Context(), sess.UserID, svc.ID, productID, pack, back+"paid", back+"cancelled")
	switch {
	case errors.Is(err, payments.ErrUnknownPack):
		h.refusePlan(q, sess, svc, http.StatusNotFound, "That plan has no such pack of credits. Nothing was changed.")
		return
	case errors.Is(err, payments.ErrNoSubscription):
		h.refusePlan(q, sess, svc, http.StatusConflict, "You have no running subscription to "+svc.Name()+
			": subscribe to its prepaid plan first, then buy credits. Nothing was changed.")
		return
	case err != nil:
		h.logger.Error("portal: opening checkout", zap.String("user_id", sess.UserID), zap.String("service_id", svc.ID), zap.Error(err))
		h.refusePlan(q, sess, svc, http.StatusBadGateway, "The payment page could not be opened; try again in a moment. Nothing was charged.")
		return
	}
	http.Redirect(q.w, q.r, to, http.StatusSeeOther)
}
