package stripewebhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	"golang.org/x/crypto/bcrypt"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/platform"
	"github.com/platformgw/gateway/internal/store"

	_ "github.com/platformgw/gateway/internal/console"
	_ "github.com/platformgw/gateway/internal/platformgw"
	_ "github.com/platformgw/gateway/internal/stripewebhook"
)

// The ports of the in-process server, moved by E2E_ADMIN_PORT and
// E2E_HTTP_PORT as in the e2e package.
var (
	adminPort = envInt("E2E_ADMIN_PORT", 2999)
	httpPort  = envInt("E2E_HTTP_PORT", 9080)
	site      = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	endpoint  = site + "/stripe/webhook"
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

const whsec = "whsec_test_0123456789abcdef0123456789abcdef"

// gw is a running gateway with a payments block on stripe-mock.
type gw struct {
	t    *testing.T
	mock *stripetest.Mock
	app  *platform.App
	pay  *payments.Service
}

// startGateway runs Caddy with the platform app (service svc: products
// pro and basic in USD, each with a Stripe Price), the webhook endpoint
// at /stripe/webhook and the console at /console/ (g.console), on a
// bbolt file of its own.
func startGateway(t *testing.T, grace string) *gw {
	t.Helper()
	mock := stripetest.Start(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
	platform {
		store %s
		service svc {
			backend http://127.0.0.1:1
			secret svc-secret-0123456789abcdef0123
			public
			endpoint echo
			product pro {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 1000 per month
				currency USD
				period_price 29
				trial 14d
				self_service
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 100 per month
				currency USD
				period_price 9
				self_service
			}
			product team {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 100000 per month
				currency USD
				period_price 99.5
			}
		}
		payments stripe {
			secret_key sk_test_123
			webhook_secret %s
			api_base %s
			past_due_grace %s
			price svc pro price_pro
			price svc basic price_basic
		}
	}
}
:%d {
	bind 127.0.0.1
	handle /stripe/webhook {
		platform_stripe_webhook
	}
	handle_path /console/* {
		basic_auth {
			op %s
		}
		platform_console {
			prefix /console
		}
	}
}
`, adminPort, httpPort, filepath.Join(dir, "platform.db"), whsec, mock.URL, grace, httpPort, consoleHash())
	unloadOtherStore()
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	a, err := caddy.ActiveContext().App("platform")
	if err != nil {
		t.Fatal(err)
	}
	app := a.(*platform.App)
	if app.PaymentsService() == nil {
		t.Fatal("no payments service")
	}
	return &gw{t: t, mock: mock, app: app, pay: app.PaymentsService()}
}

// unloadOtherStore unloads the config a previous test left running: a
// reload never switches stores, a restart does.
func unloadOtherStore() {
	if _, err := caddy.ActiveContext().AppIfConfigured("platform"); err == nil {
		admin := fmt.Sprintf("localhost:%d", adminPort)
		if resp, err := http.Post("http://"+admin+"/load", "application/json",
			strings.NewReader(fmt.Sprintf(`{"admin": {"listen": %q}}`, admin))); err == nil {
			resp.Body.Close()
		}
	}
}

// customer makes user's Stripe customer through the gateway.
func (g *gw) customer(user string) string {
	g.t.Helper()
	id, err := g.pay.CustomerFor(context.Background(), user, "")
	if err != nil {
		g.t.Fatal(err)
	}
	return id
}

func (g *gw) sub(user string) (store.Subscription, bool) {
	g.t.Helper()
	s, err := g.app.DataStore().GetSubscription(context.Background(), user, "svc")
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrNoAccount) {
		return store.Subscription{}, false
	}
	if err != nil {
		g.t.Fatal(err)
	}
	return s, true
}

func (g *gw) record(kind, id string) ([]byte, bool) {
	g.t.Helper()
	b, err := g.app.DataStore().(store.Payments).GetPaymentRecord(context.Background(), kind, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false
	}
	if err != nil {
		g.t.Fatal(err)
	}
	return b, true
}

// deliver signs and posts an event now and checks the status.
func (g *gw) deliver(payload []byte, want int) string {
	g.t.Helper()
	status, body := stripetest.Deliver(g.t, endpoint, payload, whsec, time.Now())
	if status != want {
		g.t.Fatalf("delivery: %d %s, want %d", status, body, want)
	}
	return body
}

// subObj is a Stripe subscription object as its events carry it.
func subObj(id, customer, status, price string, cancelAtPeriodEnd bool, periodEnd time.Time) map[string]any {
	return map[string]any{"id": id, "object": "subscription", "customer": customer, "status": status,
		"cancel_at_period_end": cancelAtPeriodEnd, "metadata": map[string]string{},
		"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_" + id, "object": "subscription_item",
			"price": map[string]any{"id": price, "object": "price"}, "current_period_end": periodEnd.Unix()}}}}
}

func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Code string `json:"code"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not a JSON error: %s", body)
	}
	return e.Code
}

// TestWebhookRefusals: a wrong signature, a stale timestamp, a GET, a
// body over 1 MiB change nothing and say why; an unknown event type is
// 200 and recorded as ignored; a duplicate is 200 and changes nothing.
func TestWebhookRefusals(t *testing.T) {
	g := startGateway(t, "1h")
	cust := g.customer("u-ref")
	now := time.Now()
	ev := stripetest.Event("evt_ref_1", "customer.subscription.created", now,
		subObj("sub_ref", cust, "active", "price_pro", false, now.Add(720*time.Hour)))

	// Wrong secret.
	status, body := stripetest.Deliver(t, endpoint, ev, "whsec_wrong_secret_0000000000000000", now)
	if status != 400 || errorCode(t, body) != "invalid_signature" {
		t.Errorf("wrong signature: %d %s", status, body)
	}
	// Signed correctly but tampered with after signing.
	req, _ := http.NewRequest(http.MethodPost, endpoint, bytes.NewReader(bytes.Replace(ev, []byte("active"), []byte("unpaid"), 1)))
	req.Header.Set("Stripe-Signature", stripetest.Sign(ev, whsec, now))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 400 {
		t.Errorf("tampered body: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// No signature at all.
	if resp, err := http.Post(endpoint, "application/json", bytes.NewReader(ev)); err != nil || resp.StatusCode != 400 {
		t.Errorf("unsigned: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// Stale.
	status, body = stripetest.Deliver(t, endpoint, ev, whsec, now.Add(-10*time.Minute))
	if status != 400 || errorCode(t, body) != "stale_timestamp" {
		t.Errorf("stale: %d %s", status, body)
	}
	// GET.
	resp, err := http.Get(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET: %d %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	// Over 1 MiB, signed.
	big := stripetest.Event("evt_big", "customer.subscription.created", now,
		map[string]any{"id": "sub_big", "object": "subscription", "pad": strings.Repeat("x", payments.MaxWebhookBytes)})
	status, body = stripetest.Deliver(t, endpoint, big, whsec, now)
	if status != 413 || errorCode(t, body) != "payload_too_large" {
		t.Errorf("1 MiB: %d %s", status, body)
	}
	if _, ok := g.sub("u-ref"); ok {
		t.Fatal("a refused delivery made a subscription")
	}
	for _, id := range []string{"evt_ref_1", "evt_big"} {
		if _, ok := g.record(payments.KindEvent, id); ok {
			t.Errorf("refused event %s recorded as handled", id)
		}
	}

	// Unknown type: 200, recorded as ignored.
	g.deliver(stripetest.Event("evt_unknown", "customer.tax_id.created", now, map[string]any{"id": "txi_1", "object": "tax_id"}), 200)
	if b, ok := g.record(payments.KindEvent, "evt_unknown"); !ok || !strings.Contains(string(b), `"ignored":true`) {
		t.Errorf("unknown type: %s %v", b, ok)
	}

	// Applied once, then a duplicate changes nothing, even after the
	// state moved on.
	if body := g.deliver(ev, 200); !strings.Contains(body, `"duplicate":false`) {
		t.Errorf("first delivery: %s", body)
	}
	s, ok := g.sub("u-ref")
	if !ok || s.Status != "ACTIVE" || s.ProductID != "pro" {
		t.Fatalf("after created: %+v %v", s, ok)
	}
	g.deliver(stripetest.Event("evt_ref_2", "customer.subscription.updated", now.Add(time.Second),
		subObj("sub_ref", cust, "unpaid", "price_pro", false, now.Add(720*time.Hour))), 200)
	if s, _ := g.sub("u-ref"); s.Status != "SUSPENDED" {
		t.Fatalf("after unpaid: %+v", s)
	}
	if body := g.deliver(ev, 200); !strings.Contains(body, `"duplicate":true`) {
		t.Errorf("duplicate: %s", body)
	}
	if s, _ := g.sub("u-ref"); s.Status != "SUSPENDED" {
		t.Errorf("a duplicate changed the subscription: %+v", s)
	}

	// Unknown customer, unknown price, no data.object: they verify but can
	// never apply, so 200 (Stripe would retry anything else for days and
	// disable the endpoint), recorded as ignored with the reason, audited,
	// and nothing changes.
	ignored := func(id string, payload []byte, reason string) {
		t.Helper()
		status, body := stripetest.Deliver(t, endpoint, payload, whsec, now)
		var got struct {
			Received bool   `json:"received"`
			Ignored  string `json:"ignored"`
		}
		if status != 200 || json.Unmarshal([]byte(body), &got) != nil || !got.Received || !strings.Contains(got.Ignored, reason) {
			t.Errorf("%s: %d %s, want 200 ignored (%s)", id, status, body, reason)
		}
		b, ok := g.record(payments.KindEvent, id)
		if !ok || !strings.Contains(string(b), `"ignored":true`) || !strings.Contains(string(b), reason) {
			t.Errorf("%s recorded as %s %v, want ignored with its reason", id, b, ok)
		}
		// A redelivery is a duplicate.
		if body := g.deliver(payload, 200); !strings.Contains(body, `"duplicate":true`) {
			t.Errorf("%s again: %s", id, body)
		}
	}
	ignored("evt_ref_3", stripetest.Event("evt_ref_3", "customer.subscription.created", now,
		subObj("sub_stranger", "cus_nobody", "active", "price_pro", false, now.Add(time.Hour))), "customer cus_nobody is not one the gateway made")
	cust2 := g.customer("u-ref2")
	ignored("evt_ref_4", stripetest.Event("evt_ref_4", "customer.subscription.created", now,
		subObj("sub_odd", cust2, "active", "price_somethingelse", false, now.Add(time.Hour))), "no configured product has its price price_somethingelse")
	for i, typ := range []string{"customer.subscription.updated", "invoice.paid", "checkout.session.completed",
		"charge.refunded", "charge.dispute.closed", "checkout.session.async_payment_failed"} {
		id := fmt.Sprintf("evt_nodata_%d", i)
		nodata, _ := json.Marshal(map[string]any{"id": id, "object": "event", "type": typ, "created": now.Unix(), "api_version": "2025-03-31.basil"})
		ignored(id, nodata, "no data.object")
	}
	if _, ok := g.sub("u-ref2"); ok {
		t.Error("an unknown price made a subscription")
	}
	for _, id := range []string{"sub_stranger", "sub_odd"} {
		if _, ok := g.record(payments.KindSubscription, id); ok {
			t.Errorf("%s recorded", id)
		}
	}
	entries, _, err := g.app.DataStore().ListAudit(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var audited int
	for _, e := range entries {
		if e.Action == payments.AuditEventIgnored && e.Actor == "stripe" && strings.Contains(e.Detail, "nothing changed") {
			audited++
		}
	}
	if audited != 8 {
		t.Errorf("%d ignored events audited, want 8", audited)
	}
}

// TestWebhookOrder: the gateway applies a subscription as Stripe has it,
// not in the order its events came: an update before its create, an
// older update after the delete; events of the same second make it ask
// Stripe.
func TestWebhookOrder(t *testing.T) {
	g := startGateway(t, "1h")
	cust := g.customer("u-ord")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	end := t0.Add(30 * 24 * time.Hour)

	// updated (t0+2: cancelling) comes before created (t0: active).
	g.deliver(stripetest.Event("evt_o2", "customer.subscription.updated", t0.Add(2*time.Second),
		subObj("sub_o", cust, "active", "price_pro", true, end)), 200)
	g.deliver(stripetest.Event("evt_o1", "customer.subscription.created", t0,
		subObj("sub_o", cust, "active", "price_pro", false, end)), 200)
	s, ok := g.sub("u-ord")
	if !ok || s.Status != "CANCELLING" || !s.EndsAt.Equal(end) || s.EndStatus != "CANCELLED" {
		t.Fatalf("updated then an older created: %+v, want CANCELLING until %s", s, end)
	}
	// deleted (t0+5) then an older updated (t0+3: active again).
	g.deliver(stripetest.Event("evt_o4", "customer.subscription.deleted", t0.Add(5*time.Second),
		subObj("sub_o", cust, "canceled", "price_pro", false, end)), 200)
	g.deliver(stripetest.Event("evt_o3", "customer.subscription.updated", t0.Add(3*time.Second),
		subObj("sub_o", cust, "active", "price_pro", false, end)), 200)
	if s, _ := g.sub("u-ord"); s.Status != "EXPIRED" {
		t.Fatalf("deleted then an older updated: %+v, want EXPIRED", s)
	}

	// Trial, then the price switched in Stripe: the product follows.
	cust2 := g.customer("u-trial")
	trialEnd := t0.Add(14 * 24 * time.Hour)
	tr := subObj("sub_t", cust2, "trialing", "price_basic", false, trialEnd)
	tr["trial_end"] = trialEnd.Unix()
	g.deliver(stripetest.Event("evt_t1", "customer.subscription.created", t0, tr), 200)
	// It ends past_due_grace (1h) after trial_end: a late event that the
	// first payment went through does not refuse a paying caller.
	if s, _ := g.sub("u-trial"); s.Status != "TRIAL" || s.ProductID != "basic" || !s.EndsAt.Equal(trialEnd.Add(time.Hour)) || s.EndStatus != "EXPIRED" {
		t.Fatalf("trialing: %+v, want TRIAL, EXPIRED from trial_end + 1h", s)
	}
	g.deliver(stripetest.Event("evt_t2", "customer.subscription.updated", t0.Add(time.Second),
		subObj("sub_t", cust2, "active", "price_pro", false, end)), 200)
	if s, _ := g.sub("u-trial"); s.Status != "ACTIVE" || s.ProductID != "pro" || !s.EndsAt.IsZero() {
		t.Fatalf("switched to pro: %+v", s)
	}

	// The same second as the last applied: Stripe is asked (stripe-mock's
	// subscription is active with cancel_at_period_end set, its period
	// long over), and its state applies, not the event's.
	before := len(g.mock.Requests("/v1/subscriptions/sub_t"))
	g.deliver(stripetest.Event("evt_t3", "customer.subscription.updated", t0.Add(time.Second),
		subObj("sub_t", cust2, "past_due", "price_pro", false, end)), 200)
	if n := len(g.mock.Requests("/v1/subscriptions/sub_t")); n != before+1 {
		t.Errorf("same second: %d reads of the subscription from Stripe, want 1", n-before)
	}
	if s, _ := g.sub("u-trial"); s.Status != "CANCELLING" || s.EndStatus != "CANCELLED" || s.ProductID != "pro" {
		t.Errorf("same second: %+v, want Stripe's state (cancelling at its period's end)", s)
	}

	// Each change audited as stripe, in words.
	entries, _, err := g.app.DataStore().ListAudit(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Action == payments.AuditSubscriptionStripe && e.Actor == "stripe" && e.UserID == "u-ord" {
			n++
			if !strings.Contains(e.Detail, "→") {
				t.Errorf("audit detail not before → after: %q", e.Detail)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d audit entries for u-ord, want 2 (cancelling, expired)", n)
	}
}

// TestPastDueGrace: a failed payment leaves a subscription working for
// past_due_grace, then the call path reads it SUSPENDED; a paid invoice
// makes it ACTIVE again. The status after an invoice event is Stripe's,
// read back from Stripe, never guessed from the invoice: an older
// invoice paid while the subscription is still past due leaves it past
// due. Invoices are kept in minor units.
func TestPastDueGrace(t *testing.T) {
	g := startGateway(t, "2h")
	cust := g.customer("u-due")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	g.deliver(stripetest.Event("evt_d1", "customer.subscription.created", t0,
		subObj("sub_d", cust, "active", "price_pro", false, t0.Add(720*time.Hour))), 200)
	inv := func(id, status string, paid int64) map[string]any {
		return map[string]any{"id": id, "object": "invoice", "customer": cust, "status": status,
			"amount_due": 2900, "amount_paid": paid, "currency": "usd",
			"hosted_invoice_url": "https://invoice.stripe.com/i/" + id, "invoice_pdf": "https://pay.stripe.com/invoice/" + id + "/pdf",
			"parent": map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_d"}}}
	}
	// What Stripe answers when the gateway reads sub_d back.
	stripeSays := func(status string) {
		g.mock.Answer("/v1/subscriptions/sub_d", map[string]any{"id": "sub_d", "customer": cust, "status": status,
			"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil})
	}
	stripeSays("past_due")
	reads := len(g.mock.Requests("/v1/subscriptions/sub_d"))
	g.deliver(stripetest.Event("evt_d2", "invoice.payment_failed", t0.Add(time.Second), inv("in_d1", "open", 0)), 200)
	if n := len(g.mock.Requests("/v1/subscriptions/sub_d")) - reads; n != 1 {
		t.Errorf("payment failed: %d reads of the subscription from Stripe, want 1", n)
	}
	s, _ := g.sub("u-due")
	if s.Status != "ACTIVE" || s.EndStatus != "SUSPENDED" || !s.EndsAt.Equal(t0.Add(time.Second).Add(2*time.Hour)) {
		t.Fatalf("payment failed: %+v, want ACTIVE, SUSPENDED 2h after", s)
	}
	b, ok := g.record(payments.KindInvoice, "in_d1")
	var ir payments.InvoiceRecord
	if !ok || json.Unmarshal(b, &ir) != nil || ir.AmountDue != 2900 || ir.Currency != "USD" || ir.UserID != "u-due" || ir.ProductID != "pro" {
		t.Fatalf("invoice record: %s", b)
	}
	// An older invoice paid late while in_d1 is still due: Stripe says
	// past_due, so the grace runs on, from when it began.
	g.deliver(stripetest.Event("evt_d0", "invoice.paid", t0.Add(2*time.Second), inv("in_d0", "paid", 2900)), 200)
	if s, _ := g.sub("u-due"); s.Status != "ACTIVE" || s.EndStatus != "SUSPENDED" || !s.EndsAt.Equal(t0.Add(time.Second).Add(2*time.Hour)) {
		t.Fatalf("an older invoice paid while still past due: %+v, want ACTIVE, SUSPENDED 2h after the failure", s)
	}
	if b, ok := g.record(payments.KindInvoice, "in_d0"); !ok || json.Unmarshal(b, &ir) != nil || ir.Status != "paid" {
		t.Errorf("older invoice record: %s", b)
	}
	stripeSays("active")
	g.deliver(stripetest.Event("evt_d3", "invoice.paid", t0.Add(3*time.Second), inv("in_d1", "paid", 2900)), 200)
	if s, _ := g.sub("u-due"); s.Status != "ACTIVE" || !s.EndsAt.IsZero() {
		t.Fatalf("paid: %+v, want ACTIVE with no end", s)
	}
	// A late payment_failed of the same invoice does not make it unpaid,
	// nor the subscription past due: Stripe says active.
	g.deliver(stripetest.Event("evt_d4", "invoice.payment_failed", t0.Add(time.Second), inv("in_d1", "open", 0)), 200)
	b, _ = g.record(payments.KindInvoice, "in_d1")
	if json.Unmarshal(b, &ir) != nil || ir.Status != "paid" || ir.AmountPaid != 2900 {
		t.Errorf("paid invoice after a late failure: %s", b)
	}
	if s, _ := g.sub("u-due"); s.Status != "ACTIVE" || !s.EndsAt.IsZero() {
		t.Errorf("an older failure suspended a paid subscription: %+v", s)
	}
}

// TestCheckoutTrialOnce: the listing's trial goes to Stripe's Checkout
// only for a caller who never had a subscription to the service: not
// after one ended, nor when a Stripe subscription was ever linked.
func TestCheckoutTrialOnce(t *testing.T) {
	g := startGateway(t, "1h")
	ctx := context.Background()
	start := func(user string) url.Values {
		t.Helper()
		before := len(g.mock.Requests("/v1/checkout/sessions"))
		if _, err := g.pay.StartSubscriptionCheckout(ctx, payments.CheckoutRequest{UserID: user, ServiceID: "svc", ProductID: "pro",
			SuccessURL: site + "/ok", CancelURL: site + "/cancel"}); err != nil {
			t.Fatal(err)
		}
		reqs := g.mock.Requests("/v1/checkout/sessions")
		if len(reqs) != before+1 {
			t.Fatalf("%d Checkout requests, want 1", len(reqs)-before)
		}
		return reqs[len(reqs)-1].Form
	}
	const trial = "subscription_data[trial_period_days]"
	if f := start("u-first"); f.Get(trial) != "14" {
		t.Errorf("a first subscription: trial %q, want 14", f.Get(trial))
	}
	// A subscription that ended (EXPIRED after a trial or a cancel).
	if _, err := g.app.DataStore().PutSubscription(ctx, store.Subscription{UserID: "u-again", ServiceID: "svc", ProductID: "pro",
		Status: "EXPIRED", UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if f := start("u-again"); f.Has(trial) {
		t.Errorf("after an ended subscription: trial %q, want none", f.Get(trial))
	}
	// A Stripe subscription linked to the user and service before.
	link, _ := json.Marshal(map[string]any{"subscriptionId": "sub_before", "updatedAt": time.Now().UTC()})
	if _, err := g.app.DataStore().(store.Payments).InsertPaymentRecord(ctx, payments.KindSubscriptionOf, "svc/u-linked", link, time.Now()); err != nil {
		t.Fatal(err)
	}
	if f := start("u-linked"); f.Has(trial) {
		t.Errorf("after a Stripe subscription: trial %q, want none", f.Get(trial))
	}
}

// TestCheckoutOpenedOnce: a second Subscribe while the caller's Checkout
// Session is still open (another tab, a double submit) goes back to the
// same session: two sessions would make two Stripe subscriptions and two
// charges. Once Stripe says the session is no longer open, or for another
// product, a new one is made.
func TestCheckoutOpenedOnce(t *testing.T) {
	g := startGateway(t, "1h")
	ctx := context.Background()
	start := func(product string) string {
		t.Helper()
		u, err := g.pay.StartSubscriptionCheckout(ctx, payments.CheckoutRequest{UserID: "u-tabs", ServiceID: "svc", ProductID: product,
			SuccessURL: site + "/ok", CancelURL: site + "/cancel"})
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	creates := func() int {
		n := 0
		for _, r := range g.mock.Requests("/v1/checkout/sessions") {
			if r.Method == http.MethodPost {
				n++
			}
		}
		return n
	}
	first := start("pro")
	b, ok := g.record(payments.KindCheckoutOpen, "svc/u-tabs")
	var open struct {
		SessionID string `json:"sessionId"`
	}
	if !ok || json.Unmarshal(b, &open) != nil || open.SessionID == "" {
		t.Fatalf("the open session was not kept: %s", b)
	}
	path := "/v1/checkout/sessions/" + open.SessionID
	g.mock.Answer(path, map[string]any{"status": "open", "expires_at": time.Now().Add(time.Hour).Unix()})
	if again := start("pro"); again != first || creates() != 1 {
		t.Fatalf("a second click while open: %q (first %q), %d sessions created, want the same one", again, first, creates())
	}
	g.mock.Answer(path, map[string]any{"status": "complete"})
	start("pro")
	if creates() != 2 {
		t.Errorf("after the session completed: %d sessions created, want a new one (2)", creates())
	}
}

// loadConfig posts a Caddyfile to the admin API's /load and returns the
// status and body.
func loadConfig(t *testing.T, caddyfile string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://localhost:%d/load", adminPort), strings.NewReader(caddyfile))
	req.Header.Set("Content-Type", "text/caddyfile")
	// A connection of its own: Caddy replaces its admin server as a load
	// applies or rolls back, and a kept-alive connection of an earlier
	// load could be closed under this one (EOF).
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b := new(bytes.Buffer)
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// TestStartChecksPrices: at start the gateway reads each configured
// Price from Stripe; stripe-mock's Prices are in USD, so a product
// listed in EUR fails the start with what to fix, while Stripe out of
// reach is a warning and the gateway starts.
func TestStartChecksPrices(t *testing.T) {
	mock := stripetest.Start(t)
	unloadOtherStore()
	// An admin endpoint to load the configs at.
	caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort}).InitServer(fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
}
`, adminPort, httpPort), "caddyfile")
	cfg := func(currency, apiBase string) string {
		return fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	platform {
		store %s
		service svc {
			backend http://127.0.0.1:1
			secret svc-secret-0123456789abcdef0123
			public
			endpoint echo
			product pro {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 1000 per month
				currency %s
				period_price 29
				self_service
			}
		}
		payments stripe {
			secret_key sk_test_123
			webhook_secret %s
			api_base %s
			price svc pro price_pro_eur
		}
	}
}
:%d {
	bind 127.0.0.1
	handle /stripe/webhook {
		platform_stripe_webhook
	}
}
`, adminPort, httpPort, filepath.Join(t.TempDir(), "platform.db"), currency, whsec, apiBase, httpPort)
	}
	status, body := loadConfig(t, cfg("EUR", mock.URL))
	if status == 200 || !strings.Contains(body, "Price price_pro_eur is in USD but the product's listing is in EUR") {
		t.Fatalf("a USD Price on a EUR product: %d %s", status, body)
	}
	if n := len(mock.Requests("/v1/prices/price_pro_eur")); n == 0 {
		t.Error("the Price was not read from Stripe")
	}
	// Stripe unreachable: a closed loopback port.
	status, body = loadConfig(t, cfg("USD", "http://127.0.0.1:1"))
	if status != 200 {
		t.Fatalf("Stripe unreachable at start: %d %s, want the gateway started", status, body)
	}
	unloadOtherStore()
}

func adminPost(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Post(fmt.Sprintf("http://localhost:%d%s", adminPort, path), "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b := new(bytes.Buffer)
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// TestStripeSyncAndResync: sync creates a Product and a Price (in minor
// units, the listing's currency, the period as interval, with idempotency
// keys) only for the paid product without a Price and answers its config
// line; resync lists every known customer's subscriptions and invoices
// and applies what maps to a product (stripe-mock's fixtures map to none,
// so they are skipped and nothing changes). Without a payments block both
// are 404 not_found.
func TestStripeSyncAndResync(t *testing.T) {
	g := startGateway(t, "1h")
	status, body := adminPost(t, "/platform/stripe/sync")
	if status != 200 {
		t.Fatalf("sync: %d %s", status, body)
	}
	var res payments.SyncResult
	if err := json.Unmarshal([]byte(body), &res); err != nil || len(res.Created) != 1 || res.Created[0].Product != "team" ||
		!strings.HasPrefix(res.Created[0].Line, "price svc team price_") || res.Created[0].Amount != "99.50 USD" {
		t.Fatalf("sync result: %s", body)
	}
	prods, prices := g.mock.Requests("/v1/products"), g.mock.Requests("/v1/prices")
	var created []stripetest.Request
	for _, r := range prices {
		if r.Method == "POST" {
			created = append(created, r)
		}
	}
	if len(prods) != 1 || prods[0].IdempotencyKey == "" || len(created) != 1 || created[0].IdempotencyKey == "" {
		t.Fatalf("creations: products %+v prices %+v", prods, created)
	}
	if f := created[0].Form; f.Get("unit_amount") != "9950" || f.Get("currency") != "usd" || f.Get("recurring[interval]") != "month" {
		t.Errorf("price form: %v", f)
	}

	cust := g.customer("u-resync")
	now := time.Now().Truncate(time.Second)
	g.deliver(stripetest.Event("evt_rs1", "customer.subscription.created", now.Add(-time.Minute),
		subObj("sub_rs", cust, "active", "price_pro", false, now.Add(720*time.Hour))), 200)
	status, body = adminPost(t, "/platform/stripe/resync")
	if status != 200 {
		t.Fatalf("resync: %d %s", status, body)
	}
	var rr payments.ResyncResult
	if err := json.Unmarshal([]byte(body), &rr); err != nil || rr.Customers != 1 || len(rr.Skipped) == 0 {
		t.Errorf("resync result: %s", body)
	}
	if subs := g.mock.Requests("/v1/subscriptions"); len(subs) == 0 || subs[0].Form.Get("customer") != cust {
		t.Errorf("subscriptions not listed by customer: %+v", subs)
	}
	if invs := g.mock.Requests("/v1/invoices"); len(invs) == 0 || invs[0].Form.Get("customer") != cust {
		t.Errorf("invoices not listed by customer: %+v", invs)
	}
	if s, _ := g.sub("u-resync"); s.Status != "ACTIVE" || s.ProductID != "pro" {
		t.Errorf("a resync of foreign fixtures changed the subscription: %+v", s)
	}

	// No payments block.
	unloadOtherStore()
	if status, body := loadConfig(t, fmt.Sprintf("{\n\tadmin localhost:%d\n\tplatform {\n\t\tstore %s\n\t}\n}\n", adminPort,
		filepath.Join(t.TempDir(), "p.db"))); status != 200 {
		t.Fatalf("load without payments: %d %s", status, body)
	}
	for _, p := range []string{"/platform/stripe/sync", "/platform/stripe/resync"} {
		if status, body := adminPost(t, p); status != 404 || !strings.Contains(body, "no payments block") {
			t.Errorf("%s without payments: %d %s", p, status, body)
		}
	}
	unloadOtherStore()
}

// consolePass is the console operator's password in startGateway.
const consolePass = "op-console-password-0123"

var consoleHash = sync.OnceValue(func() string {
	h, err := bcrypt.GenerateFromPassword([]byte(consolePass), 4)
	if err != nil {
		panic(err)
	}
	return string(h)
})

// console reads a console page as the operator, as its text (tags and
// spacing gone).
func (g *gw) console(path string) string {
	g.t.Helper()
	req, _ := http.NewRequest("GET", site+"/console"+path, nil)
	req.SetBasicAuth("op", consolePass)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		g.t.Fatalf("console %s: %d %s", path, resp.StatusCode, b)
	}
	s := regexp.MustCompile(`(?s)<[^>]*>`).ReplaceAllString(string(b), " ")
	return strings.Join(strings.Fields(html.UnescapeString(s)), " ")
}
