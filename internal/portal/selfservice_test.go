package portal

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// shopService is a public service with a plan of each kind the plans
// page shows: two free ones, a trial, one that costs money, one the
// operator assigns and a private one.
func shopService() *catalog.Service {
	small, big := billing.Whole(100), billing.Whole(1000)
	sub := func(id string, q *billing.Units) *billing.Product {
		return &billing.Product{ID: id, BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
			UnitLabel: "request", Quota: q, Overage: "block"}
	}
	price := billing.Whole(29)
	return &catalog.Service{
		ID: "shop", DisplayName: "Shop API", Public: true, Backend: "http://127.0.0.1:9", Secrets: []string{echoSecret},
		Endpoints: []*catalog.Endpoint{{ID: "hello", Methods: []string{"GET", "POST"}, Path: "/hello"}},
		Products:  []*billing.Product{sub("free", &small), sub("bigfree", &big), sub("trial", &big), sub("pro", &big), sub("assigned", &small), sub("hidden", &small)},
		ProductListings: []*catalog.ProductListing{
			{Product: "free", DisplayName: "Free", SelfService: true},
			{Product: "bigfree", DisplayName: "Bigger free", SelfService: true},
			{Product: "trial", DisplayName: "Team", SelfService: true, TrialDays: 14, Currency: "EUR", PeriodPrice: &price},
			{Product: "pro", DisplayName: "Pro", SelfService: true, Currency: "EUR", PeriodPrice: &price},
			{Product: "assigned", DisplayName: "Partner"},
			{Product: "hidden", DisplayName: "Secret deal", Private: true},
		},
	}
}

// keyOnly gives a user a key and no subscription.
func (e *env) keyOnly(id string) string {
	e.t.Helper()
	key, hash, err := servicekey.Generate()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.store().CreateKey(context.Background(), store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: id, Created: time.Now().UTC()}); err != nil {
		e.t.Fatal(err)
	}
	return key
}

func (e *env) subscription(user string) (store.Subscription, bool) {
	e.t.Helper()
	s, err := e.store().GetSubscription(context.Background(), user, "shop")
	return s, err == nil
}

// plansForm posts a plans form with the page's token.
func (c *client) plansForm(action, product string) (*http.Response, string) {
	c.t.Helper()
	_, page := c.get("/portal/plans/shop")
	return c.post("/portal/plans/shop/"+action, url.Values{"csrf": {csrf(c.t, page)}, "product": {product}})
}

// audited reports whether the audit log has an entry of action by actor.
func (e *env) audited(action, actor string) bool {
	e.t.Helper()
	entries, _, err := e.store().ListAudit(context.Background(), "", 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, a := range entries {
		if a.Action == action && a.Actor == actor {
			return true
		}
	}
	return false
}

// TestSelfService: a caller takes a free plan and gets a key at once,
// upgrades at once, downgrades at the period's end, asks for a plan that
// costs money and cancels; each audited as them.
func TestSelfService(t *testing.T) {
	e := localWith(t, "allow_key_management\nsign_in_limit 1000", shopService())
	c := e.newClient()
	annKey := e.keyOnly("ann")
	c.signIn(annKey)

	resp, body := c.get("/portal/plans/shop")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("plans: %d\n%s", resp.StatusCode, body)
	}
	for _, want := range []string{"Plans of Shop API", "You have no subscription to Shop API", "Subscribe (free trial)",
		"29.00 EUR a month", "Request access", "The operator assigns this plan", "14-day free trial"} {
		if !strings.Contains(body, want) {
			t.Errorf("the plans page lacks %q", want)
		}
	}
	if strings.Contains(body, "Secret deal") {
		t.Error("the plans page shows a private plan")
	}

	resp, body = c.plansForm("subscribe", "free")
	m := newKeyField.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusCreated || m == nil {
		t.Fatalf("subscribe: %d\n%s", resp.StatusCode, body)
	}
	if _, aerr := e.rt.AuthenticateServiceKey(context.Background(), m[1]); aerr != nil {
		t.Errorf("the new key: %v", aerr)
	}
	if s, ok := e.subscription("ann"); !ok || s.ProductID != "free" || s.Status != "ACTIVE" {
		t.Errorf("subscription %+v", s)
	}
	if _, body = c.get("/portal/plans/shop"); strings.Contains(body, m[1]) {
		t.Error("the key is shown again")
	}
	if !e.audited(ops.AuditSubscriptionPut, "portal:ann") || !e.audited(ops.AuditKeyCreate, "portal:ann") {
		t.Error("the subscription or the key is not audited as the caller")
	}

	resp, body = c.plansForm("subscribe", "bigfree")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "You already have a subscription to Shop API") {
		t.Errorf("a second subscription: %d\n%s", resp.StatusCode, body)
	}

	resp, _ = c.plansForm("change", "bigfree")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasSuffix(resp.Header.Get("Location"), "?m=changed") {
		t.Fatalf("upgrade: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if s, _ := e.subscription("ann"); s.ProductID != "bigfree" {
		t.Errorf("after the upgrade: %+v", s)
	}

	resp, _ = c.plansForm("change", "free")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasSuffix(resp.Header.Get("Location"), "?m=scheduled") {
		t.Fatalf("downgrade: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if s, _ := e.subscription("ann"); s.ProductID != "bigfree" {
		t.Errorf("a downgrade applied before the period's end: %+v", s)
	}
	if _, body = c.get("/portal/plans/shop"); !strings.Contains(body, "Your plan changes to <strong>Free</strong>") {
		t.Errorf("the pending change is not shown:\n%s", body)
	}
	if !e.audited(ops.AuditChangeScheduled, "portal:ann") {
		t.Error("the scheduled change is not audited")
	}
	e.setClock(func() time.Time { return time.Now().AddDate(0, 1, 1) })
	c.signIn(annKey) // the session of a month ago has ended
	if _, body = c.get("/portal/plans/shop"); strings.Contains(body, "Your plan changes to") {
		t.Errorf("the change is still pending past the period's end:\n%s", body)
	}
	if s, _ := e.subscription("ann"); s.ProductID != "free" {
		t.Errorf("after the period's end: %+v", s)
	}
	e.setClock(nil) // the new session, made a month ahead, lasts

	resp, _ = c.plansForm("request", "pro")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasSuffix(resp.Header.Get("Location"), "?m=requested") {
		t.Fatalf("request access: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, body = c.plansForm("request", "pro")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "the operator has not answered yet") {
		t.Errorf("a second request: %d\n%s", resp.StatusCode, body)
	}
	reqs, err := e.ops.PendingAccessRequests(context.Background(), "")
	if err != nil || len(reqs) != 1 || reqs[0].UserID != "ann" || reqs[0].ProductID != "pro" {
		t.Errorf("pending requests %+v %v", reqs, err)
	}

	resp, body = c.get("/portal/plans/shop/cancel")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Cancel my subscription") {
		t.Fatalf("cancel confirmation: %d\n%s", resp.StatusCode, body)
	}
	if s, _ := e.subscription("ann"); s.Status != "ACTIVE" {
		t.Errorf("the confirmation page changed the subscription: %+v", s)
	}
	resp, _ = c.post("/portal/plans/shop/cancel", url.Values{"csrf": {csrf(t, body)}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("cancel: %d", resp.StatusCode)
	}
	if s, _ := e.subscription("ann"); s.Status != "CANCELLING" {
		t.Errorf("after cancelling: %+v", s)
	}
	resp, _ = c.plansForm("change", "bigfree")
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("a change while cancelling: %d", resp.StatusCode)
	}
}

// TestSelfServiceRefusals: each refusal changes nothing and says why.
func TestSelfServiceRefusals(t *testing.T) {
	e := localWith(t, "allow_key_management\nsign_in_limit 1000\nmax_active_keys 1", shopService())
	c := e.newClient()
	c.signIn(e.keyOnly("bob"))

	for _, tc := range []struct {
		name, action, product string
		status                int
		says                  string
	}{
		{"not self_service", "subscribe", "assigned", http.StatusForbidden, "The operator assigns this plan"},
		{"private", "subscribe", "hidden", http.StatusNotFound, "no such plan"},
		{"unknown", "subscribe", "nothing", http.StatusNotFound, "no such plan"},
		{"costs money", "subscribe", "pro", http.StatusConflict, "Request access"},
		{"key limit", "subscribe", "free", http.StatusConflict, "1 active keys, the most this portal allows"},
		{"change with no subscription", "change", "bigfree", http.StatusConflict, "no running subscription"},
		{"request a free plan", "request", "free", http.StatusConflict, "not one to request"},
	} {
		resp, body := c.plansForm(tc.action, tc.product)
		if resp.StatusCode != tc.status || !strings.Contains(body, tc.says) {
			t.Errorf("%s: %d, want %d saying %q\n%s", tc.name, resp.StatusCode, tc.status, tc.says, body)
		}
		if s, ok := e.subscription("bob"); ok {
			t.Errorf("%s: a subscription was made: %+v", tc.name, s)
		}
	}

	resp, body := c.post("/portal/plans/shop/subscribe", url.Values{"product": {"free"}})
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "security token is missing") {
		t.Errorf("no CSRF token: %d\n%s", resp.StatusCode, body)
	}
	if _, ok := e.subscription("bob"); ok {
		t.Error("a form with no token made a subscription")
	}
	resp, _ = c.get("/portal/plans/shop/subscribe")
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET subscribe: %d", resp.StatusCode)
	}
	resp, _ = c.get("/portal/plans/echo-not-public")
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("a service that is not public: %d", resp.StatusCode)
	}

	// Already subscribed, at the key limit too: told about the
	// subscription, not the keys. Suspended: the operator's to lift.
	for status, says := range map[string]string{"ACTIVE": "You already have a subscription to Shop API", "SUSPENDED": "is suspended"} {
		if _, err := e.store().PutSubscription(context.Background(), store.Subscription{UserID: "bob", ServiceID: "shop", ProductID: "free", Status: status, UpdatedAt: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
		if resp, body := c.plansForm("subscribe", "bigfree"); resp.StatusCode < 400 || !strings.Contains(body, says) {
			t.Errorf("subscribe with a subscription %s: %d\n%s", status, resp.StatusCode, body)
		}
		if s, _ := e.subscription("bob"); s.ProductID != "free" || s.Status != status {
			t.Errorf("the refusal changed the subscription: %+v", s)
		}
	}

	// A trial plan, once under the key limit: a TRIAL subscription.
	e2 := localWith(t, "allow_key_management\nsign_in_limit 1000", shopService())
	c2 := e2.newClient()
	c2.signIn(e2.keyOnly("cid"))
	if resp, body := c2.plansForm("subscribe", "trial"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("trial: %d\n%s", resp.StatusCode, body)
	}
	if s, _ := e2.subscription("cid"); s.Status != "TRIAL" || s.ProductID != "trial" {
		t.Errorf("trial subscription %+v", s)
	}
	// Cancelled, the trial is not offered again.
	if _, err := e2.store().PutSubscription(context.Background(), store.Subscription{UserID: "cid", ServiceID: "shop", ProductID: "trial", Status: "CANCELLED", UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if resp, body := c2.plansForm("subscribe", "trial"); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "trial is not offered again") {
		t.Errorf("a second trial: %d\n%s", resp.StatusCode, body)
	}
}

// TestPlansAfterSignIn: a caller who opens a plans page before signing
// in is sent back to it once signed in, once; a service that is not
// public leaves no such way back.
func TestPlansAfterSignIn(t *testing.T) {
	e := localWith(t, "allow_key_management\nsign_in_limit 1000", shopService())
	c := e.newClient()
	resp, _ := c.get("/portal/plans/nothing-here")
	if resp.StatusCode != http.StatusSeeOther || c.cookie(nextCookie) != nil {
		t.Fatalf("a plans page of no public service: %d, cookie %v", resp.StatusCode, c.cookie(nextCookie))
	}
	resp, _ = c.get("/portal/plans/shop")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/portal/" {
		t.Fatalf("plans before signing in: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if ck := c.cookie(nextCookie); ck == nil || ck.Value != "shop" {
		t.Fatalf("the way back: %v", ck)
	}
	_, page := c.get("/portal/")
	resp, body := c.post("/portal/signin", url.Values{"csrf": {csrf(t, page)}, "key": {e.keyOnly("dee")}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in: %d\n%s", resp.StatusCode, body)
	}
	resp, _ = c.get("/portal/")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/portal/plans/shop" {
		t.Fatalf("after signing in: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, body = c.get("/portal/")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Your usage") {
		t.Errorf("the dashboard the second time: %d", resp.StatusCode)
	}
}

// TestSelfServiceEnds: a trial ends after its days and a cancellation at
// the period's end, exactly, by the subscription's end (the call refuses
// from then, whatever the stored status); the sweep applies a scheduled
// downgrade without the caller coming back, once, and tidies an ended
// status; an operator's put clears an end.
func TestSelfServiceEnds(t *testing.T) {
	e := localWith(t, "allow_key_management\nsign_in_limit 1000", shopService())
	ctx := context.Background()
	svc, _ := e.rt.Catalog.Service("shop")
	lookup := e.store().GetSubscription
	start := time.Now().UTC()

	// A trial: ends 14 days on, EXPIRED.
	tess := e.newClient()
	tessKey := e.keyOnly("tess")
	tess.signIn(tessKey)
	if resp, body := tess.plansForm("subscribe", "trial"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("trial: %d\n%s", resp.StatusCode, body)
	}
	trial, _ := e.subscription("tess")
	if trial.Status != "TRIAL" || trial.EndStatus != "EXPIRED" ||
		trial.EndsAt.Before(start.AddDate(0, 0, 14)) || trial.EndsAt.After(time.Now().UTC().AddDate(0, 0, 14)) {
		t.Fatalf("a trial taken: %+v; want TRIAL ending 14 days on as EXPIRED", trial)
	}
	ends := trial.EndsAt.Format(time.DateOnly)
	if _, body := tess.get("/portal/plans/shop"); !strings.Contains(body, "Trial — ends "+ends) {
		t.Errorf("the plans page does not say when the trial ends:\n%s", body)
	}
	if _, err := subscription.Resolve(ctx, svc, "tess", trial.EndsAt.Add(-time.Second), lookup); err != nil {
		t.Errorf("a call before the trial's end: %v", err)
	}
	var refusal *subscription.Error
	if _, err := subscription.Resolve(ctx, svc, "tess", trial.EndsAt, lookup); !errors.As(err, &refusal) ||
		refusal.Reason != subscription.Inactive || refusal.Status != subscription.Expired {
		t.Errorf("a call at the trial's end: %v, want refused as EXPIRED", err)
	}

	// A cancellation: ends at the period's end, CANCELLED.
	cal := e.newClient()
	cal.signIn(e.keyOnly("cal"))
	if resp, body := cal.plansForm("subscribe", "free"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("subscribe: %d\n%s", resp.StatusCode, body)
	}
	_, body := cal.get("/portal/plans/shop/cancel")
	if resp, _ := cal.post("/portal/plans/shop/cancel", url.Values{"csrf": {csrf(t, body)}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("cancel: %d", resp.StatusCode)
	}
	cancelled, _ := e.subscription("cal")
	p, _ := svc.Product("free")
	_, periodEnd := billing.PeriodBounds(p.Period, p.CalendarPeriods, cancelled.StartedAt, time.Now())
	if cancelled.Status != "CANCELLING" || cancelled.EndStatus != "CANCELLED" || !cancelled.EndsAt.Equal(periodEnd) {
		t.Fatalf("after cancelling: %+v; want CANCELLING ending %s as CANCELLED", cancelled, periodEnd)
	}
	if _, body := cal.get("/portal/plans/shop"); !strings.Contains(body, "Cancelling — ends "+periodEnd.Format(time.DateOnly)) {
		t.Errorf("the plans page does not say when the cancellation ends:\n%s", body)
	}
	if _, err := subscription.Resolve(ctx, svc, "cal", periodEnd, lookup); !errors.As(err, &refusal) || refusal.Status != subscription.Cancelled {
		t.Errorf("a call at the period's end: %v, want refused as CANCELLED", err)
	}

	// A downgrade scheduled for the period's end.
	dan := e.newClient()
	dan.signIn(e.keyOnly("dan"))
	dan.plansForm("subscribe", "free")
	dan.plansForm("change", "bigfree")
	if resp, _ := dan.plansForm("change", "free"); !strings.HasSuffix(resp.Header.Get("Location"), "?m=scheduled") {
		t.Fatalf("downgrade: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	pending, ok, err := e.ops.PendingChange(ctx, "dan", "shop")
	if err != nil || !ok {
		t.Fatalf("no pending change: %v", err)
	}
	// A sweep before the period's end applies nothing; it tidies the
	// trial, whose 14 days are over by then.
	if res, err := e.ops.SweepSubscriptions(ctx, pending.From.Add(-time.Second)); err != nil || res.Applied != 0 || res.Ended != 1 {
		t.Errorf("a sweep before the period's end: %+v, %v; want only the trial ended", res, err)
	}
	if s, _ := e.subscription("dan"); s.ProductID != "bigfree" {
		t.Errorf("the downgrade applied early: %+v", s)
	}

	// A month on, nobody comes back: one sweep applies the downgrade and
	// tidies the cancelled status; a second (another node) does nothing.
	later := start.AddDate(0, 1, 1)
	res, err := e.ops.SweepSubscriptions(ctx, later)
	if err != nil || res.Applied != 1 || res.Ended != 1 {
		t.Errorf("the sweep: %+v, %v; want 1 change applied and 1 subscription ended", res, err)
	}
	if s, _ := e.subscription("dan"); s.ProductID != "free" || s.Status != "ACTIVE" {
		t.Errorf("after the sweep: %+v, want product free, ACTIVE", s)
	}
	for user, want := range map[string]string{"tess": "EXPIRED", "cal": "CANCELLED"} {
		if s, _ := e.subscription(user); s.Status != want || s.EndsAt.IsZero() {
			t.Errorf("%s after the sweep: %+v, want %s with its end kept", user, s, want)
		}
	}
	if !e.audited(ops.AuditSubscriptionPut, ops.SweepActor) {
		t.Error("the sweep's tidying is not audited")
	}
	if res, err := e.ops.SweepSubscriptions(ctx, later); err != nil || res != (ops.SweepResult{}) {
		t.Errorf("a second sweep: %+v, %v; want nothing done", res, err)
	}
	e.setClock(func() time.Time { return later })
	tess.signIn(tessKey)
	if _, body := tess.get("/portal/plans/shop"); !strings.Contains(body, "Expired") || strings.Contains(body, "Trial — ends") {
		t.Errorf("the plans page after the trial:\n%s", body)
	}
	if resp, _ := tess.plansForm("subscribe", "trial"); resp.StatusCode != http.StatusConflict {
		t.Errorf("a second trial: %d", resp.StatusCode)
	}
	e.setClock(nil)

	// An operator sets ACTIVE: the end is gone and calls go through.
	if _, err := e.ops.PutSubscription(ctx, "admin", "cal", "shop", "free", "ACTIVE"); err != nil {
		t.Fatal(err)
	}
	if s, _ := e.subscription("cal"); !s.EndsAt.IsZero() || s.EndStatus != "" {
		t.Errorf("an operator's put kept the end: %+v", s)
	}
	if _, err := subscription.Resolve(ctx, svc, "cal", later, lookup); err != nil {
		t.Errorf("a call after the operator's ACTIVE: %v", err)
	}
}

// TestChangeToTrialPlanRefused: a caller on the free plan "changing" to
// the trial plan (29 EUR a month after a 14-day trial) got it with the
// free plan's status and end: ACTIVE, no end, a paid plan for nothing,
// and a way round "a trial is taken once". A trial is for a caller
// without a subscription; the change is refused and changes nothing, and
// the plans page offers no upgrade to it.
func TestChangeToTrialPlanRefused(t *testing.T) {
	e := localWith(t, "allow_key_management\nsign_in_limit 1000", shopService())
	c := e.newClient()
	c.signIn(e.keyOnly("ann"))
	if resp, body := c.plansForm("subscribe", "free"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("subscribe: %d\n%s", resp.StatusCode, body)
	}
	resp, body := c.plansForm("change", "trial")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "starts with a trial") {
		t.Errorf("change to the trial plan: %d %s, want 409 with the reason", resp.StatusCode, resp.Header.Get("Location"))
	}
	if s, _ := e.subscription("ann"); s.ProductID != "free" || s.Status != "ACTIVE" {
		t.Errorf("after the refused change: %s %s, want free ACTIVE", s.ProductID, s.Status)
	}
	if _, page := c.get("/portal/plans/shop"); !strings.Contains(page, "starts with a trial for callers without a subscription") {
		t.Errorf("the plans page does not say why the trial plan is not an upgrade:\n%s", page)
	}
	// A free plan that costs more is still an upgrade at once.
	if resp, _ := c.plansForm("change", "bigfree"); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("change to the bigger free plan: %d", resp.StatusCode)
	}
	if s, _ := e.subscription("ann"); s.ProductID != "bigfree" {
		t.Errorf("after the upgrade: %s", s.ProductID)
	}
}
