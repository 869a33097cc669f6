package portal

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// Self-service: a signed-in caller's plans page for a public service
// (GET /plans/{service}), where they take a free or trial plan and get a
// key at once, change plan, cancel, or ask for a plan that costs money.
// What a caller may take is the catalog's rule (Service.SelfServiceOffer)
// and which change is an upgrade too (Service.Pricier); every change goes
// through the admin API's own functions, audited as "portal:<user>".
//
// A service has one subscription per caller (the store's key is the user
// and the service), so a second subscription is refused and the caller
// changes plan instead. An upgrade takes effect at once; a change to a
// cheaper plan waits for the end of the period and is kept in the audit
// log until then (ops.ScheduleChange), applied by the platform's sweep
// within a minute of the period's end, or when the caller next opens or
// changes their plans if that is sooner. A trial ends (EXPIRED) after its
// days and a cancellation (CANCELLED) at the period's end: both are the
// subscription's end (store.Subscription.EndsAt), which the call itself
// checks, so access stops exactly then. A plan that costs money goes through
// payments; until those exist the caller asks for it and the operator
// answers in the console.

// planNotices are the messages after a change, chosen by a fixed code.
var planNotices = map[string]string{
	"changed":    "Your plan was changed; it applies from now.",
	"scheduled":  "Your plan changes at the end of this period; until then you keep the plan you have.",
	"cancelling": "Your subscription is cancelling: you keep access until the end of this period.",
	"requested":  "Your request was sent to the operator. This page shows it until they answer.",
	// Back from Stripe Checkout (payments.go).
	"subscribed":         "Thank you: your payment went through Stripe. Your plan applies as soon as Stripe confirms it, usually within seconds; reload this page to see it.",
	"checkout-cancelled": "You left Stripe's checkout; nothing was charged and nothing was changed.",
	// A click on a paid plan after the caller paid its Checkout, before
	// Stripe's webhook came: the payment was applied instead of a second
	// Checkout opened.
	"checkout-paid": "Stripe has the payment you made for this service: your plan is shown below. No second checkout was opened and nothing more was charged.",
}

// awaitingStripe stands for a paid plan's button on the page Stripe's
// Checkout sends a caller back to, while Stripe has not yet confirmed the
// payment they made.
const awaitingStripe = "Stripe is confirming the payment you just made: reload this page in a few seconds to see your plan. Paying again would start a second subscription."

// plansView is the plans page of one service.
type plansView struct {
	ServiceID, Name string
	Plans           []planRow
	// Current is the caller's subscription to the service, nil if none.
	Current *currentPlan
	// Pending is a change to a cheaper plan waiting for the period's end.
	Pending     *ops.ScheduledChange
	PendingName string
	// ConfirmCancel is the confirmation step before cancelling.
	ConfirmCancel bool
	// StripeBilled: the caller's live plan is paid through Stripe, so it
	// is cancelled or changed in Stripe's customer portal (Billing), not
	// here: the page shows a link to Billing instead of those controls.
	StripeBilled bool
	// KeysOff: the operator makes the keys; subscribing makes none.
	KeysOff bool
	// Services are the public services, for the index (GET /plans/).
	Services []serviceLink
	// Credits is the balance and packs of a prepaid plan (topups.go).
	Credits *creditsView
}

type serviceLink struct{ ID, Name string }

// currentPlan is the caller's subscription as the plans page shows it.
type currentPlan struct {
	ProductID, Name, Status, StatusWords string
	// Live: the status grants access now; Cancelling: it ends at EndsAt.
	Live, Cancelling bool
	PeriodEnd        time.Time
	// EndsAt is when access ends (a trial's or a cancellation's end).
	EndsAt time.Time
}

// planRow is one listed product and what the caller may do with it.
type planRow struct {
	ID, Name, Description string
	// Price is the headline ("29.00 EUR a month", "Free"), Terms the
	// pricing in the portal's words, Trial "14-day free trial".
	Price, Terms, Trial string
	Current             bool
	// Action is subscribe, upgrade, downgrade or request; "" for none,
	// with Note saying why.
	Action, Note string
	// BillingLink: Note points to the Billing page, linked after it.
	BillingLink bool
	// Requested is when the caller asked for it, zero if they did not.
	Requested time.Time
}

// NewKeyShown is the key just made on a plans page, nil when none was:
// the page's dashboard holds it when set.
func (p page) NewKeyShown() *dashboard {
	if p.dashboard == nil || p.dashboard.NewKey == "" {
		return nil
	}
	return p.dashboard
}

// servePlans routes /plans/{service}[/{action}].
func (h *Handler) servePlans(q *request, rest string) {
	serviceID, action, _ := strings.Cut(rest, "/")
	switch action {
	case "":
		if !h.allow(q, http.MethodGet, http.MethodHead) {
			return
		}
		if serviceID == "" {
			h.plansIndex(q)
			return
		}
		h.plans(q, serviceID, false)
	case "subscribe", "change", "request", "checkout":
		if !h.allow(q, http.MethodPost) {
			return
		}
		h.planAction(q, serviceID, action)
	case "buy":
		if !h.allow(q, http.MethodPost) {
			return
		}
		h.buyCredits(q, serviceID)
	case "cancel":
		if !h.allow(q, http.MethodGet, http.MethodHead, http.MethodPost) {
			return
		}
		if q.r.Method == http.MethodPost {
			h.planAction(q, serviceID, action)
			return
		}
		h.plans(q, serviceID, true)
	default:
		h.message(q, http.StatusNotFound, "Not found", "There is no such page in the portal.")
	}
}

// nextCookie names the public service whose plans page a caller asked
// for before signing in; home sends them there once they have. It holds
// only a service id, checked again when read, so it cannot send anyone
// elsewhere.
const (
	nextCookie = "platform_portal_next"
	nextTTL    = 15 * time.Minute
)

// hasSession reports whether the request carries a live session.
func (h *Handler) hasSession(q *request) bool {
	c, err := q.r.Cookie(sessionCookie)
	if err != nil {
		return false
	}
	_, live := sessions.get(c.Value, q.now)
	return live
}

// afterSignIn is where a signed-in caller goes instead of the
// dashboard: the plans page they asked for before signing in, once. ""
// when there is none.
func (h *Handler) afterSignIn(q *request) string {
	c, err := q.r.Cookie(nextCookie)
	if err != nil {
		return ""
	}
	http.SetCookie(q.w, q.cookie(nextCookie, "", -1))
	if svc, ok := h.publicService(c.Value); ok {
		return "/plans/" + url.PathEscape(svc.ID)
	}
	return ""
}

// publicService is a service of the catalog that callers may see.
func (h *Handler) publicService(id string) (*catalog.Service, bool) {
	svc, ok := h.rt.Catalog.Service(id)
	return svc, ok && svc.Public
}

func (h *Handler) plansIndex(q *request) {
	_, sess, _, ok := h.signedIn(q)
	if !ok {
		return
	}
	v := &plansView{}
	for _, svc := range h.rt.Catalog.Services() {
		if svc.Public {
			v.Services = append(v.Services, serviceLink{ID: svc.ID, Name: svc.Name()})
		}
	}
	h.render(q, http.StatusOK, "plans-index", page{Title: "Plans", Base: q.base, CSRF: sess.CSRF, UserID: sess.UserID, Plans: v})
}

// plans renders the plans page of a service (with the cancel
// confirmation when confirm).
func (h *Handler) plans(q *request, serviceID string, confirm bool) {
	svc, public := h.publicService(serviceID)
	if public && !h.hasSession(q) {
		// Back to this page after signing in (home): a caller who came
		// from the storefront's Subscribe lands on the plans they chose.
		http.SetCookie(q.w, q.cookie(nextCookie, svc.ID, int(nextTTL/time.Second)))
	}
	_, sess, _, ok := h.signedIn(q)
	if !ok {
		return
	}
	svc, ok = h.publicService(serviceID)
	if !ok {
		h.message(q, http.StatusNotFound, "No such service", "There is no public service with that id.")
		return
	}
	h.applyDue(q, sess.UserID, svc.ID)
	v, err := h.plansView(q, sess.UserID, svc)
	if err != nil {
		h.logger.Error("portal plans", zap.String("user_id", sess.UserID), zap.String("service_id", svc.ID), zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "Your plans could not be read; try again.")
		return
	}
	if confirm {
		if v.StripeBilled {
			h.renderPlans(q, http.StatusConflict, sess, v, "", billedInStripe, nil)
			return
		}
		if v.Current == nil || !v.Current.Live || v.Current.Cancelling {
			h.message(q, http.StatusConflict, "Nothing to cancel", "You have no running subscription to "+svc.Name()+" to cancel.")
			return
		}
		v.ConfirmCancel = true
	}
	notice := planNotices[q.r.URL.Query().Get("m")]
	if n, ok := topUpNotices[q.r.URL.Query().Get("m")]; ok {
		notice = n
	}
	if q.r.URL.Query().Get("m") == "subscribed" && !v.StripeBilled {
		// Back from paying, before Stripe's event made the plan the
		// caller's: no second Checkout beside the old plan, which a
		// caller who thinks the payment failed would pay again.
		for i := range v.Plans {
			if v.Plans[i].Action == "checkout" {
				v.Plans[i].Action, v.Plans[i].Note = "", awaitingStripe
			}
		}
	}
	h.renderPlans(q, http.StatusOK, sess, v, notice, "", nil)
}

// renderPlans renders a plans page, with a key just made shown once.
func (h *Handler) renderPlans(q *request, status int, sess session, v *plansView, notice, problem string, key *ops.KeyView) {
	p := page{Title: "Plans of " + v.Name, Base: q.base, CSRF: sess.CSRF, UserID: sess.UserID, Notice: notice, Error: problem, Plans: v}
	if key != nil && key.Key != "" {
		p.dashboard = &dashboard{NewKey: key.Key, NewKeyID: key.ID}
		if svc, ok := h.rt.Catalog.Service(v.ServiceID); ok {
			base, prefix := h.gatewayBase(q)
			if lines := curlLines(base, prefix, svc, key.Key); len(lines) > 0 {
				p.dashboard.NewKeyCurl = lines[0].Line
			}
		}
	}
	h.render(q, status, "plans", p)
}

// applyDue applies a change whose period has ended before the page or
// the action reads the subscription. A failure is logged; the page shows
// the subscription as it is.
func (h *Handler) applyDue(q *request, userID, serviceID string) {
	ch, err := h.ops.ApplyDueChange(q.r.Context(), userID, serviceID, q.now)
	if err != nil && !ops.IsNoScheduledChange(err) {
		h.logger.Error("portal: a scheduled change of plan was not applied", zap.String("user_id", userID),
			zap.String("service_id", serviceID), zap.String("product_id", ch.ProductID), zap.Error(err))
	}
}

// plansView reads what the plans page of svc shows userID.
func (h *Handler) plansView(q *request, userID string, svc *catalog.Service) (*plansView, error) {
	ctx := q.r.Context()
	v := &plansView{ServiceID: svc.ID, Name: svc.Name(), KeysOff: !h.AllowKeyManagement}
	sub, err := h.rt.Store().GetSubscription(ctx, userID, svc.ID)
	switch {
	case err == nil:
		v.Current = h.currentPlan(svc, sub, q.now)
		v.Credits = h.creditsOf(q, svc, sub)
	case !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrNoAccount):
		return nil, err
	}
	v.StripeBilled = v.Current != nil && v.Current.Live && h.sells(svc.ID, v.Current.ProductID)
	if v.Current != nil && v.Current.Live {
		ch, ok, err := h.ops.PendingChange(ctx, userID, svc.ID)
		if err != nil {
			return nil, err
		}
		// A change scheduled from another product than the current one
		// is void (ops.ApplyDueChange never applies it).
		if ok && (ch.Was == "" || ch.Was == sub.ProductID) {
			v.Pending, v.PendingName = &ch, productName(svc, ch.ProductID)
		}
	}
	requests, err := h.ops.PendingAccessRequests(ctx, userID)
	if err != nil {
		return nil, err
	}
	for _, p := range svc.Products {
		if !svc.Listed(p.ID) {
			continue
		}
		l, _ := svc.Listing(p.ID)
		row := planRow{ID: p.ID, Name: l.Name(), Description: l.Description, Price: priceHeadline(p, l), Terms: pricingWords(p)}
		if l.TrialDays > 0 {
			row.Trial = catalog.TrialWords(l.TrialDays, p)
		}
		for _, r := range requests {
			if r.ServiceID == svc.ID && r.ProductID == p.ID {
				row.Requested = r.At
			}
		}
		row.Action, row.Note = planAction(svc, p.ID, v.Current, !row.Requested.IsZero())
		if h.prepaidWithPacks(svc, p.ID) {
			row.Action, row.Note = prepaidPlanAction(p.ID, v.Current)
		} else if h.sells(svc.ID, p.ID) && svc.SelfServiceOffer(p.ID) != catalog.NotOffered && row.Requested.IsZero() {
			curPaid := v.Current != nil && h.sells(svc.ID, v.Current.ProductID)
			row.Action, row.Note, row.BillingLink = paidAction(svc, p.ID, v.Current, curPaid)
		}
		row.Current = v.Current != nil && v.Current.Live && v.Current.ProductID == p.ID
		if v.StripeBilled && !row.Current && (row.Action == "upgrade" || row.Action == "downgrade" || h.prepaidWithPacks(svc, p.ID)) {
			// Stripe bills the plan the caller is on: a change made here
			// would leave Stripe charging for it, and Stripe's next
			// update would put it back.
			row.Action, row.Note, row.BillingLink = "", "To change to this plan, use “Manage payment method” on the Billing page (Stripe's customer portal).", true
		}
		v.Plans = append(v.Plans, row)
	}
	return v, nil
}

// EndsFirst reports whether the subscription ends (a trial's end)
// before this period does: a cancellation then ends it at that end, not
// at the period's (cancel), and the confirmation says so.
func (c *currentPlan) EndsFirst() bool {
	return !c.EndsAt.IsZero() && c.EndsAt.Before(c.PeriodEnd)
}

func (h *Handler) currentPlan(svc *catalog.Service, sub store.Subscription, now time.Time) *currentPlan {
	st := subscription.EffectiveStatus(sub, now)
	c := &currentPlan{ProductID: sub.ProductID, Name: productName(svc, sub.ProductID), Status: string(st),
		StatusWords: endingWords(string(st), sub.EndsAt), Live: st.GrantsAccess(), Cancelling: cancelling(string(st)),
		EndsAt: sub.EndsAt}
	if p, ok := svc.Product(sub.ProductID); ok {
		c.PeriodEnd = periodEnd(p, sub, now)
	}
	return c
}

// periodEnd is the end of the subscription's period that holds now. A
// subscription stamped by the store after this request began is in its
// first period, not in the one before its start.
func periodEnd(p *billing.Product, sub store.Subscription, now time.Time) time.Time {
	if now.Before(sub.StartedAt) {
		now = sub.StartedAt
	}
	_, end := billing.PeriodBounds(p.Period, p.CalendarPeriods, sub.StartedAt, now)
	return end
}

func productName(svc *catalog.Service, productID string) string {
	if l, ok := svc.Listing(productID); ok {
		return l.Name()
	}
	return productID
}

// planAction is what the caller may do with a plan, given their
// subscription: the button, or a note saying why there is none.
func planAction(svc *catalog.Service, productID string, cur *currentPlan, requested bool) (action, note string) {
	live := cur != nil && cur.Live
	offer := svc.SelfServiceOffer(productID)
	switch {
	case live && cur.ProductID == productID:
		return "", "Your plan."
	case offer == catalog.NotOffered:
		return "", "The operator assigns this plan; ask them for it."
	case requested:
		return "", "You asked for this plan; the operator has not answered yet."
	case offer == catalog.OfferPaid:
		return "request", "This plan costs money. Payments are not open here yet: ask for it and the operator sets it up."
	case !live:
		return "subscribe", ""
	case cur.Cancelling:
		return "", "Your subscription is cancelling; take a plan again once it has ended."
	case offer == catalog.OfferTrial:
		return "", "This plan starts with a trial for callers without a subscription here; ask the operator for it."
	case svc.Pricier(productID, cur.ProductID):
		return "upgrade", "Applies at once."
	}
	return "downgrade", "Applies at the end of this period."
}

// paidAction is what the caller may do with a plan paid through Stripe:
// buy it in Checkout, unless they are on it, or on another plan Stripe
// bills (a change between paid plans is made in Stripe's customer
// portal, and its webhook moves the plan here). billing: the note points
// to the Billing page.
func paidAction(svc *catalog.Service, productID string, cur *currentPlan, curPaid bool) (action, note string, billing bool) {
	live := cur != nil && cur.Live
	switch {
	case cur != nil && cur.Status == string(subscription.Suspended) && curPaid:
		return "", "Your subscription is suspended because a payment failed: pay the open invoice or change your card on the Billing page, and it serves again.", true
	case live && cur.ProductID == productID:
		return "", "Your plan. Its invoices and card are on the Billing page.", true
	case live && cur.Cancelling:
		return "", "Your subscription is cancelling; take a plan again once it has ended.", false
	case live && curPaid:
		return "", "To change between paid plans, use “Manage payment method” on the Billing page (Stripe's customer portal).", true
	}
	return "checkout", "Paid through Stripe: you are taken to Stripe's checkout to pay.", false
}

// priceHeadline is a plan's price in one line, every money amount with
// its currency.
func priceHeadline(p *billing.Product, l *catalog.ProductListing) string {
	if m, ok := l.PeriodPriceMoney(); ok && m.Amount > 0 {
		return m.String() + " a " + periodNoun(p.Period)
	}
	if m, ok := l.UnitPriceMoney(p); ok && p.BillingModel != billing.Subscription {
		return catalog.Money{Amount: billing.Mul(billing.Whole(priceBlock(p)), m.Amount), Currency: m.Currency}.String() + " " + perText(p)
	}
	if p.BillingModel == billing.Prepaid && p.Price > 0 {
		return "Prepaid credits"
	}
	return "Free"
}

// planAction does a change of the caller's own (POST
// /plans/{service}/{subscribe,change,cancel,request}).
func (h *Handler) planAction(q *request, serviceID, action string) {
	_, sess, sessionKey, ok := h.signedIn(q)
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
	h.applyDue(q, sess.UserID, svc.ID)
	productID := q.r.PostForm.Get("product")
	if action != "cancel" && !svc.Listed(productID) {
		// A private product is answered like one that does not exist.
		h.refusePlan(q, sess, svc, http.StatusNotFound, "That service has no such plan. Nothing was changed.")
		return
	}
	var (
		notice string // the code of planNotices the page then shows
		r      *refusal
		err    error
	)
	switch action {
	case "subscribe":
		h.subscribe(q, sess, sessionKey, svc, productID)
		return
	case "checkout":
		h.checkout(q, sess, svc, productID)
		return
	case "change":
		notice, r, err = h.changePlan(q, sess, svc, productID)
	case "cancel":
		notice = "cancelling"
		r, err = h.cancel(q, sess, svc)
	case "request":
		notice = "requested"
		r, err = h.requestAccess(q, sess, svc, productID)
	}
	if r != nil {
		h.refusePlan(q, sess, svc, r.status, r.message)
		return
	}
	if err != nil {
		h.planFailed(q, sess, svc, err)
		return
	}
	q.redirect("/plans/" + url.PathEscape(svc.ID) + "?m=" + notice)
}

// refusePlan shows the plans page again with why nothing was changed.
func (h *Handler) refusePlan(q *request, sess session, svc *catalog.Service, status int, msg string) {
	v, err := h.plansView(q, sess.UserID, svc)
	if err != nil {
		h.message(q, status, "Nothing was changed", msg)
		return
	}
	h.renderPlans(q, status, sess, v, "", msg, nil)
}

func (h *Handler) planFailed(q *request, sess session, svc *catalog.Service, err error) {
	var ae *apierror.Error
	if errors.As(err, &ae) {
		h.refusePlan(q, sess, svc, http.StatusBadRequest, ae.Message)
		return
	}
	h.logger.Error("portal self-service", zap.String("user_id", sess.UserID), zap.String("service_id", svc.ID), zap.Error(err))
	h.message(q, http.StatusInternalServerError, "Something went wrong", "Your plan could not be changed; try again.")
}

// subscribe takes a free or trial plan and makes a key for it, shown
// once. The subscription and the key are decided together: a caller at
// their key limit gets neither.
func (h *Handler) subscribe(q *request, sess session, sessionKey store.KeyRecord, svc *catalog.Service, productID string) {
	ctx := q.r.Context()
	offer := svc.SelfServiceOffer(productID)
	if offer != catalog.NotOffered && h.sells(svc.ID, productID) {
		// Sold through Stripe, a trial included: Checkout takes the card.
		h.checkout(q, sess, svc, productID)
		return
	}
	if h.prepaidWithPacks(svc, productID) {
		offer = catalog.OfferFree // a zero balance; credits are bought (topups.go)
	}
	switch offer {
	case catalog.NotOffered:
		h.refusePlan(q, sess, svc, http.StatusForbidden, "The operator assigns this plan; you cannot take it yourself. Nothing was changed.")
		return
	case catalog.OfferPaid:
		if h.sells(svc.ID, productID) {
			h.checkout(q, sess, svc, productID)
			return
		}
		h.refusePlan(q, sess, svc, http.StatusConflict, "This plan costs money: ask the operator for it with “Request access”. Nothing was changed.")
		return
	}
	// Checked first, so a caller already subscribed hears that rather
	// than about their keys, and again under the lock with the key.
	if r, err := h.mayTake(q, sess, svc, offer); r != nil || err != nil {
		if r != nil {
			h.refusePlan(q, sess, svc, r.status, r.message)
		} else {
			h.planFailed(q, sess, svc, err)
		}
		return
	}
	take := func() (*refusal, error) {
		if r, err := h.mayTake(q, sess, svc, offer); r != nil || err != nil {
			return r, err
		}
		status, end := subscription.Active, ops.End{}
		if offer == catalog.OfferTrial {
			status, end = subscription.Trial, trialEnd(svc, productID, q.now)
		}
		// A subscription whose audit entry failed is still made (the
		// server log says so), as the admin API's.
		if ch, err := h.ops.PutSubscriptionUntil(ctx, "portal:"+sess.UserID, sess.UserID, svc.ID, productID, string(status), end); ch.UserID == "" {
			return nil, err
		}
		h.logger.Info("subscription taken in the portal", zap.String("user_id", sess.UserID),
			zap.String("service_id", svc.ID), zap.String("product_id", productID))
		return nil, nil
	}
	var key ops.KeyView
	var r *refusal
	var err error
	if h.AllowKeyManagement {
		key, r, err = h.mint(q, sess, sessionKey, "for "+svc.ID, take)
		if err != nil && key.ID != "" {
			err = nil // made; only its audit entry failed
		}
	} else {
		minting.Lock()
		r, err = take()
		minting.Unlock()
	}
	if r != nil {
		if r.retryAfter > 0 {
			q.w.Header().Set("Retry-After", retryAfter(r.retryAfter))
		}
		h.refusePlan(q, sess, svc, r.status, r.message)
		return
	}
	if errors.Is(err, errParentEnded) {
		q.redirect("/?m=ended")
		return
	}
	if err != nil {
		h.planFailed(q, sess, svc, err)
		return
	}
	v, verr := h.plansView(q, sess.UserID, svc)
	if verr != nil {
		h.planFailed(q, sess, svc, verr)
		return
	}
	h.renderPlans(q, http.StatusCreated, sess, v, "You are subscribed to "+svc.Name()+".", "", &key)
}

// trialEnd is the end of a trial of productID taken at now: its listing's
// TrialDays later, EXPIRED from then.
func trialEnd(svc *catalog.Service, productID string, now time.Time) ops.End {
	l, ok := svc.Listing(productID)
	if !ok || l.TrialDays <= 0 {
		return ops.End{}
	}
	return ops.End{At: now.UTC().AddDate(0, 0, l.TrialDays), Status: string(subscription.Expired)}
}

// mayTake refuses a subscription to svc when the caller has one: one
// that grants access (one subscription per service), a suspended one
// (the operator's to lift), or any earlier one for a trial (a trial is
// taken once).
func (h *Handler) mayTake(q *request, sess session, svc *catalog.Service, offer catalog.Offer) (*refusal, error) {
	prev, err := h.rt.Store().GetSubscription(q.r.Context(), sess.UserID, svc.ID)
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrNoAccount) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	switch st := subscription.EffectiveStatus(prev, q.now); {
	case st.GrantsAccess():
		return &refusal{status: http.StatusConflict, message: "You already have a subscription to " + svc.Name() +
			" (plan " + productName(svc, prev.ProductID) + "); a service has one subscription per caller. Change plan below instead. Nothing was changed."}, nil
	case st == subscription.Suspended:
		return &refusal{status: http.StatusForbidden, message: "Your subscription to " + svc.Name() +
			" is suspended; only the operator can lift that. Nothing was changed."}, nil
	case offer == catalog.OfferTrial:
		return &refusal{status: http.StatusConflict, message: "You had a subscription to " + svc.Name() +
			" before, so its trial is not offered again; ask the operator. Nothing was changed."}, nil
	}
	return nil, nil
}

// live is the caller's subscription to svc when its status grants
// access, else a refusal.
func (h *Handler) live(q *request, sess session, svc *catalog.Service) (store.Subscription, *refusal, error) {
	sub, err := h.rt.Store().GetSubscription(q.r.Context(), sess.UserID, svc.ID)
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrNoAccount) ||
		err == nil && !subscription.EffectiveStatus(sub, q.now).GrantsAccess() {
		return sub, &refusal{status: http.StatusConflict, message: "You have no running subscription to " + svc.Name() + ". Nothing was changed."}, nil
	}
	return sub, nil, err
}

// billedInStripe is the refusal of a cancel or a change of plan of a
// subscription Stripe bills: Stripe's subscription is what charges the
// caller, and its next customer.subscription.updated would undo a change
// made only here, so the caller makes it in Stripe's customer portal and
// the webhooks bring it to the gateway.
const billedInStripe = "Your plan is paid through Stripe: to cancel it or change plan, use “Manage payment method” on the Billing page (Stripe's customer portal); the change then applies here too. Nothing was changed."

// stripeBilled is the refusal of a change to sub when Stripe bills its
// product, else nil.
func (h *Handler) stripeBilled(svc *catalog.Service, sub store.Subscription) *refusal {
	if h.sells(svc.ID, sub.ProductID) {
		return &refusal{status: http.StatusConflict, message: billedInStripe}
	}
	return nil
}

// trialForNewcomers is the refusal of a change to a plan offered with a
// trial.
const trialForNewcomers = "That plan starts with a trial, which is for callers without a subscription to this service; ask the operator for it. Nothing was changed."

// changePlan moves the caller to another free plan: at once to
// a pricier one ("changed"), at the period's end to a cheaper one
// ("scheduled"). A plan Stripe bills is changed in Stripe instead.
func (h *Handler) changePlan(q *request, sess session, svc *catalog.Service, productID string) (string, *refusal, error) {
	sub, r, err := h.live(q, sess, svc)
	if r != nil || err != nil {
		return "", r, err
	}
	if r := h.stripeBilled(svc, sub); r != nil {
		return "", r, nil
	}
	switch {
	case sub.ProductID == productID:
		return "", &refusal{status: http.StatusConflict, message: "You are on that plan already. Nothing was changed."}, nil
	case cancelling(sub.Status):
		return "", &refusal{status: http.StatusConflict, message: "Your subscription is cancelling; it cannot change plan. Nothing was changed."}, nil
	}
	switch svc.SelfServiceOffer(productID) {
	case catalog.NotOffered:
		return "", &refusal{status: http.StatusForbidden, message: "The operator assigns that plan; you cannot take it yourself. Nothing was changed."}, nil
	case catalog.OfferPaid:
		return "", &refusal{status: http.StatusConflict, message: "That plan costs money: ask the operator for it with “Request access”. Nothing was changed."}, nil
	case catalog.OfferTrial:
		// A trial plan is a trial for a new subscriber (mayTake: taken
		// once, never after an earlier subscription). Changed into, it
		// kept the current status and end: a plan that costs money
		// after its trial, ACTIVE with no end.
		return "", &refusal{status: http.StatusConflict, message: trialForNewcomers}, nil
	}
	actor := "portal:" + sess.UserID
	if svc.Pricier(productID, sub.ProductID) {
		// A trial's end stays: an upgrade does not lengthen it.
		if ch, err := h.ops.PutSubscriptionUntil(q.r.Context(), actor, sess.UserID, svc.ID, productID, sub.Status, ops.EndOf(sub)); ch.UserID == "" {
			return "", nil, err
		}
		return "changed", nil, nil
	}
	from := q.now
	if p, ok := svc.Product(sub.ProductID); ok {
		from = periodEnd(p, sub, q.now)
	}
	return "scheduled", nil, h.ops.ScheduleChange(q.r.Context(), actor, sess.UserID, svc.ID, sub.ProductID, productID, from)
}

// cancelling reports whether a status is one of the cancelling ones,
// which still grant access until the period's end.
func cancelling(status string) bool {
	st := subscription.Status(strings.ToUpper(status))
	return st == subscription.Cancelling || st == subscription.CancellingPending
}

// cancel sets the caller's subscription CANCELLING: it keeps access to
// the end of the period, when it becomes CANCELLED (its end, checked at
// every call), or to its trial's end if that is sooner. A change to a
// cheaper plan waiting is dropped (the subscription change supersedes it
// in the audit log). A plan Stripe bills is cancelled in Stripe instead.
func (h *Handler) cancel(q *request, sess session, svc *catalog.Service) (*refusal, error) {
	sub, r, err := h.live(q, sess, svc)
	if r != nil || err != nil {
		return r, err
	}
	if r := h.stripeBilled(svc, sub); r != nil {
		return r, nil
	}
	if cancelling(sub.Status) {
		return &refusal{status: http.StatusConflict, message: "Your subscription is cancelling already. Nothing was changed."}, nil
	}
	end := ops.End{At: q.now.UTC(), Status: string(subscription.Cancelled)}
	if p, ok := svc.Product(sub.ProductID); ok {
		end.At = periodEnd(p, sub, q.now)
	}
	if !sub.EndsAt.IsZero() && sub.EndsAt.Before(end.At) {
		end.At = sub.EndsAt
	}
	if ch, err := h.ops.PutSubscriptionUntil(q.r.Context(), "portal:"+sess.UserID, sess.UserID, svc.ID, sub.ProductID, string(subscription.Cancelling), end); ch.UserID == "" {
		return nil, err
	}
	return nil, nil
}

// requestAccess records the caller's request for a plan that costs
// money, for the operator to answer in the console.
func (h *Handler) requestAccess(q *request, sess session, svc *catalog.Service, productID string) (*refusal, error) {
	if svc.SelfServiceOffer(productID) != catalog.OfferPaid {
		return &refusal{status: http.StatusConflict, message: "That plan is not one to request: take it yourself, or ask the operator if they assign it. Nothing was changed."}, nil
	}
	if sub, err := h.rt.Store().GetSubscription(q.r.Context(), sess.UserID, svc.ID); err == nil &&
		subscription.EffectiveStatus(sub, q.now).GrantsAccess() && sub.ProductID == productID {
		return &refusal{status: http.StatusConflict, message: "You are on that plan already. Nothing was changed."}, nil
	}
	pending, err := h.ops.PendingAccessRequests(q.r.Context(), sess.UserID)
	if err != nil {
		return nil, err
	}
	for _, p := range pending {
		if p.ServiceID == svc.ID {
			return &refusal{status: http.StatusConflict, message: "You asked for a plan of " + svc.Name() +
				" already; the operator has not answered yet. Nothing was changed."}, nil
		}
	}
	return nil, h.ops.RequestAccess(q.r.Context(), "portal:"+sess.UserID, sess.UserID, svc.ID, productID)
}
