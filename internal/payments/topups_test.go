package payments_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/platform"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"

	// The handlers the site below mounts.
	_ "github.com/platformgw/gateway/internal/platformgw"
	_ "github.com/platformgw/gateway/internal/stripewebhook"
	_ "github.com/platformgw/gateway/internal/usagehandler"
)

// The ports of the in-process server, moved by E2E_ADMIN_PORT and
// E2E_HTTP_PORT as in the e2e package.
var (
	topUpAdminPort = topUpEnvInt("E2E_ADMIN_PORT", 2999)
	topUpHTTPPort  = topUpEnvInt("E2E_HTTP_PORT", 9080)
	topUpSite      = fmt.Sprintf("http://127.0.0.1:%d", topUpHTTPPort)
)

func topUpEnvInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

const topUpWebhookSecret = "whsec_topup_test_secret"

// topUpEnv is a running gateway (real Caddy in this process, a real bbolt
// file) whose payments block talks to stripe-mock through the recording
// proxy: service echo with a prepaid product "credits" (1 credit a call)
// and three packs, "small" (100 credits for 10.00 USD), "big" (1000
// credits for 50.00 USD that expire 30 days after they are paid) and
// "trio" (100 credits for 3.00 USD).
type topUpEnv struct {
	t    *testing.T
	mock *stripetest.Mock
	app  *platform.App
	pay  store.Payments
}

func startTopUps(t *testing.T) *topUpEnv {
	t.Helper()
	mock := stripetest.Start(t)
	// What the packs' Prices cost (stripe-mock's own fixture Price is
	// 20.00 USD): a session is granted its pack only when it paid that.
	for price, amount := range map[string]int64{"price_small": 1000, "price_big": 5000, "price_trio": 300} {
		mock.Answer("/v1/prices/"+price, map[string]any{"unit_amount": amount, "unit_amount_decimal": fmt.Sprint(amount), "currency": "usd"})
	}
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"hello":"world"}`)
	}))
	t.Cleanup(backend.Close)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
	platform {
		store %s/platform.db
		service echo {
			backend %s
			secret topup-test-secret-0123456789abcdef
			public
			endpoint hello {
				methods POST
				path /hello
			}
			product credits {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 1
				currency USD
				self_service
			}
			product free {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 10
			}
		}
		payments stripe {
			secret_key sk_test_topups
			webhook_secret %s
			api_base %s
			topup echo credits small price_small 100
			topup echo credits big price_big 1000 720h
			topup echo credits trio price_trio 100
		}
	}
}
:%d {
	bind 127.0.0.1
	handle /stripe/webhook {
		platform_stripe_webhook
	}
	handle {
		platform_usage
		platform_gateway
		reverse_proxy {
			dynamic platform
			transport platform
		}
	}
}
`, topUpAdminPort, topUpHTTPPort, dir, backend.URL, topUpWebhookSecret, mock.URL, topUpHTTPPort)
	topUpUnloadOtherStore(filepath.Join(dir, "platform.db"))
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: topUpAdminPort})
	tester.InitServer(cfg, "caddyfile")
	a, err := caddy.ActiveContext().App("platform")
	if err != nil {
		t.Fatal(err)
	}
	app := a.(*platform.App)
	t.Cleanup(func() { app.SetClock(nil) })
	pay, ok := app.DataStore().(store.Payments)
	if !ok {
		t.Fatal("the bbolt store does not keep payments")
	}
	return &topUpEnv{t: t, mock: mock, app: app, pay: pay}
}

// topUpUnloadOtherStore unloads a running config that serves another
// store: a reload never switches stores, a restart does.
func topUpUnloadOtherStore(path string) {
	if a, err := caddy.ActiveContext().AppIfConfigured("platform"); err == nil {
		if app, ok := a.(*platform.App); ok && app.StorePath() != filepath.Clean(path) {
			admin := fmt.Sprintf("localhost:%d", topUpAdminPort)
			if resp, err := http.Post("http://"+admin+"/load", "application/json",
				strings.NewReader(fmt.Sprintf(`{"admin": {"listen": %q}}`, admin))); err == nil {
				resp.Body.Close()
			}
		}
	}
}

// caller gives user a service key and an ACTIVE subscription to
// echo/credits with no credits, as subscribing in the portal does.
func (e *topUpEnv) caller(user string) string {
	e.t.Helper()
	key, hash, err := servicekey.Generate()
	if err != nil {
		e.t.Fatal(err)
	}
	st := e.app.DataStore()
	if err := st.CreateKey(context.Background(), store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: user, Created: time.Now().UTC()}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := st.PutSubscription(context.Background(), store.Subscription{UserID: user, ServiceID: "echo", ProductID: "credits",
		Status: "ACTIVE", UpdatedAt: time.Now().UTC()}); err != nil {
		e.t.Fatal(err)
	}
	return key
}

// payer is caller with user's Stripe customer, cus_<user> (the
// customer paidSession names), recorded both ways as
// payments.CustomerFor records the one it makes at the first Buy:
// stripe-mock answers every customer creation with the same id, so
// callers of one test cannot all get theirs from it.
func (e *topUpEnv) payer(user string) string {
	e.t.Helper()
	key := e.caller(user)
	e.customer(user)
	return key
}

// customer records cus_<user> as user's Stripe customer.
func (e *topUpEnv) customer(user string) string {
	e.t.Helper()
	cust := "cus_" + user
	b, _ := json.Marshal(payments.CustomerRecord{UserID: user, CustomerID: cust, CreatedAt: time.Now().UTC()})
	// The way back from the customer first, as CustomerFor writes them.
	for _, r := range []struct{ kind, id string }{{payments.KindCustomerUser, cust}, {payments.KindCustomer, user}} {
		if _, err := e.pay.InsertPaymentRecord(context.Background(), r.kind, r.id, b, time.Now()); err != nil {
			e.t.Fatal(err)
		}
	}
	return cust
}

func (e *topUpEnv) balance(user string) billing.Units {
	e.t.Helper()
	sub, err := e.app.DataStore().GetSubscription(context.Background(), user, "echo")
	if err != nil {
		e.t.Fatal(err)
	}
	return sub.Credits
}

func (e *topUpEnv) wantBalance(user string, want string) {
	e.t.Helper()
	w, err := billing.ParseStoredUnits(want)
	if err != nil {
		w, err = billing.ParseUnits(want)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	if got := e.balance(user); got != w {
		e.t.Fatalf("balance of %s: %s, want %s", user, got, want)
	}
}

// deliver signs an event and posts it to the running gateway's webhook
// endpoint.
func (e *topUpEnv) deliver(id, typ string, created time.Time, obj any) (int, string) {
	e.t.Helper()
	return stripetest.Deliver(e.t, topUpSite+"/stripe/webhook", stripetest.Event(id, typ, created, obj), topUpWebhookSecret, time.Now())
}

func (e *topUpEnv) mustDeliver(id, typ string, created time.Time, obj any) {
	e.t.Helper()
	if status, body := e.deliver(id, typ, created, obj); status != http.StatusOK {
		e.t.Fatalf("%s %s: %d %s", typ, id, status, body)
	}
}

// invoke makes a real call through the gateway and returns its status
// and body.
func invokeEcho(t *testing.T, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, topUpSite+"/api/service/echo/endpoint/hello/invoke", strings.NewReader(`{"q":1}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// paidSession is a paid top-up's Checkout Session as Stripe sends it in
// checkout.session.completed.
func paidSession(id, pi, user, pack string, amount int64) map[string]any {
	return map[string]any{
		"id": id, "object": "checkout.session", "mode": "payment", "status": "complete",
		"payment_status": "paid", "payment_intent": pi, "amount_total": amount, "amount_subtotal": amount, "currency": "usd",
		"customer": "cus_" + user,
		"metadata": map[string]string{payments.MetaUser: user, payments.MetaService: "echo",
			payments.MetaProduct: "credits", payments.MetaPack: pack},
	}
}

// audit is the audit log of user.
func (e *topUpEnv) audit(user string) []store.AuditEntry {
	e.t.Helper()
	all, _, err := e.app.Ops().AuditLog(context.Background(), "", 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []store.AuditEntry
	for _, a := range all {
		if a.UserID == user {
			out = append(out, a)
		}
	}
	return out
}

func (e *topUpEnv) grants(user string) []store.CreditGrant {
	e.t.Helper()
	gs, err := e.pay.ListCreditGrants(context.Background(), user, "echo")
	if err != nil {
		e.t.Fatal(err)
	}
	return gs
}

func (e *topUpEnv) topUp(pi string) payments.TopUpRecord {
	e.t.Helper()
	b, err := e.pay.GetPaymentRecord(context.Background(), payments.KindTopUp, pi)
	if err != nil {
		e.t.Fatalf("top-up record %s: %v", pi, err)
	}
	var rec payments.TopUpRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		e.t.Fatal(err)
	}
	return rec
}

// TestTopUpEndToEnd walks a top-up through the running gateway: the
// Checkout request Stripe gets, the signed webhook that grants the pack
// once however it is repeated, calls that spend the credits, a partial
// and then a full refund each delivered twice that take credits back in
// proportion down below zero, and calls refused for it.
func TestTopUpEndToEnd(t *testing.T) {
	e := startTopUps(t)
	key := e.caller("alice")
	svc := e.app.PaymentsService()
	ctx := context.Background()

	// Buy: a Checkout Session in payment mode for the pack's Price, for
	// the caller's customer (made once), with who bought what.
	checkoutURL, err := svc.StartTopUp(ctx, "alice", "echo", "credits", "small", topUpSite+"/portal/ok", topUpSite+"/portal/cancel")
	if err != nil {
		t.Fatal(err)
	}
	if checkoutURL == "" {
		t.Fatal("no Checkout URL")
	}
	if _, err := svc.StartTopUp(ctx, "alice", "echo", "credits", "small", topUpSite+"/portal/ok", topUpSite+"/portal/cancel"); err != nil {
		t.Fatal(err)
	}
	sessions := e.mock.Requests("/v1/checkout/sessions")
	if len(sessions) != 2 {
		t.Fatalf("%d Checkout requests, want 2", len(sessions))
	}
	f := sessions[0].Form
	customers := e.mock.Requests("/v1/customers")
	if len(customers) != 1 {
		t.Fatalf("%d customer creations, want 1 (made once per user)", len(customers))
	}
	if customers[0].IdempotencyKey == "" {
		t.Errorf("customer Idempotency-Key %q", customers[0].IdempotencyKey)
	}
	for k, want := range map[string]string{
		"mode": "payment", "line_items[0][price]": "price_small", "line_items[0][quantity]": "1",
		"metadata[platform_user_id]": "alice", "metadata[platform_service_id]": "echo",
		"metadata[platform_product_id]": "credits", "metadata[platform_pack]": "small",
		"payment_intent_data[metadata][platform_pack]": "small",
		"success_url": topUpSite + "/portal/ok", "cancel_url": topUpSite + "/portal/cancel",
	} {
		if got := f.Get(k); got != want {
			t.Errorf("Checkout %s = %q, want %q", k, got, want)
		}
	}
	if f.Get("customer") == "" || f.Get("customer") != sessions[1].Form.Get("customer") {
		t.Errorf("Checkout customer %q then %q: want the same customer", f.Get("customer"), sessions[1].Form.Get("customer"))
	}

	// Paid: granted once, however often and by whichever event.
	paidAt := time.Now().Add(-time.Minute).Truncate(time.Second)
	sess := paidSession("cs_1", "pi_1", "alice", "small", 1000)
	sess["customer"] = f.Get("customer") // the one StartTopUp made
	e.mustDeliver("evt_paid_1", "checkout.session.completed", paidAt, sess)
	e.mustDeliver("evt_paid_1", "checkout.session.completed", paidAt, sess)
	e.mustDeliver("evt_paid_2", "checkout.session.completed", paidAt, sess)
	e.mustDeliver("evt_paid_3", "checkout.session.async_payment_succeeded", paidAt, sess)
	e.wantBalance("alice", "100")
	gs := e.grants("alice")
	if len(gs) != 1 || gs[0].ID != "pi_1" || gs[0].Credits != billing.Whole(100) || gs[0].Source != "stripe" || !gs[0].ExpiresAt.IsZero() {
		t.Fatalf("grants %+v", gs)
	}
	rec := e.topUp("pi_1")
	if rec.Amount != 1000 || rec.Currency != "USD" || rec.Pack != "small" || rec.Credits != "100" || rec.SessionID != "cs_1" || rec.UserID != "alice" {
		t.Errorf("top-up record %+v", rec)
	}
	// The receipt, asked of Stripe once (stripe-mock's charge has one).
	if rec.ReceiptURL == "" {
		t.Errorf("top-up record without the receipt URL")
	}
	if n := len(e.mock.Requests("/v1/payment_intents/pi_1")); n != 1 {
		t.Errorf("%d PaymentIntent lookups for the receipt, want 1", n)
	}

	// Calls spend the credits.
	for range 30 {
		if status, body := invokeEcho(t, key); status != http.StatusOK {
			t.Fatalf("call: %d %s", status, body)
		}
	}
	e.wantBalance("alice", "70")

	// A partial refund (2.50 of 10.00 USD) takes back a quarter of the
	// pack, once; then the rest refunded takes back the rest.
	charge := func(refunds ...map[string]any) map[string]any {
		var refunded int64
		for _, r := range refunds {
			refunded += r["amount"].(int64)
		}
		return map[string]any{"id": "ch_1", "object": "charge", "amount": 1000, "amount_refunded": refunded,
			"currency": "usd", "payment_intent": "pi_1", "refunded": refunded == 1000,
			"receipt_url": "https://pay.stripe.com/receipts/r_1",
			"refunds":     map[string]any{"object": "list", "has_more": false, "data": refunds}}
	}
	re1 := map[string]any{"id": "re_1", "object": "refund", "amount": int64(250), "status": "succeeded", "created": paidAt.Add(time.Minute).Unix(), "charge": "ch_1"}
	re2 := map[string]any{"id": "re_2", "object": "refund", "amount": int64(750), "status": "succeeded", "created": paidAt.Add(2 * time.Minute).Unix(), "charge": "ch_1"}
	e.mustDeliver("evt_refund_1", "charge.refunded", paidAt.Add(time.Minute), charge(re1))
	e.mustDeliver("evt_refund_1", "charge.refunded", paidAt.Add(time.Minute), charge(re1))
	e.mustDeliver("evt_refund_1b", "charge.refunded", paidAt.Add(time.Minute), charge(re1))
	e.wantBalance("alice", "45")
	e.mustDeliver("evt_refund_2", "charge.refunded", paidAt.Add(2*time.Minute), charge(re1, re2))
	e.mustDeliver("evt_refund_2b", "charge.refunded", paidAt.Add(2*time.Minute), charge(re1, re2))
	e.wantBalance("alice", "-30")
	if rec := e.topUp("pi_1"); rec.Refunded != 1000 || rec.ReceiptURL == "" {
		t.Errorf("top-up record after refunds %+v", rec)
	}
	if gs := e.grants("alice"); gs[0].Reversed != billing.Whole(100) {
		t.Errorf("grant reversed %s, want 100", gs[0].Reversed)
	}

	// A negative balance refuses calls.
	if status, body := invokeEcho(t, key); status != http.StatusForbidden || !strings.Contains(body, "insufficient_credits") {
		t.Fatalf("call with a negative balance: %d %s", status, body)
	}
	e.wantBalance("alice", "-30")

	// What was audited: the grant and both reversals, by stripe.
	entries := e.audit("alice")
	actions := map[string]int{}
	for _, a := range entries {
		if a.Actor == "stripe" {
			actions[a.Action]++
		}
	}
	if actions["credits.grant"] != 1 || actions["credits.reverse"] != 2 {
		t.Errorf("audited by stripe: %v", actions)
	}
}

// TestTopUpOutOfOrderRefunds delivers the later refund first: each
// refund's share is its place among the charge's refunds, not the order
// the events came in, and a full refund takes back exactly the pack.
func TestTopUpOutOfOrderRefunds(t *testing.T) {
	e := startTopUps(t)
	e.payer("bob")
	at := time.Now().Truncate(time.Second)
	e.mustDeliver("evt_b_paid", "checkout.session.completed", at, paidSession("cs_b", "pi_b", "bob", "trio", 300))
	e.wantBalance("bob", "100")
	r := func(id string, amount int64, min int) map[string]any {
		return map[string]any{"id": id, "object": "refund", "amount": amount, "status": "succeeded", "created": at.Add(time.Duration(min) * time.Minute).Unix()}
	}
	charge := func(refunded int64, refunds ...map[string]any) map[string]any {
		return map[string]any{"id": "ch_b", "object": "charge", "amount": 300, "amount_refunded": refunded, "currency": "usd",
			"payment_intent": "pi_b", "refunds": map[string]any{"object": "list", "data": refunds}}
	}
	// 1.00 of 3.00 USD three times: 33.333333, 33.333333 (66.666666
	// less 33.333333), 33.333334 — 100 in all, never 99.999999.
	e.mustDeliver("evt_b_r3", "charge.refunded", at, charge(300, r("re_b1", 100, 1), r("re_b2", 100, 2), r("re_b3", 100, 3)))
	e.wantBalance("bob", "0")
	e.mustDeliver("evt_b_r1", "charge.refunded", at, charge(100, r("re_b1", 100, 1)))
	e.mustDeliver("evt_b_r2", "charge.refunded", at, charge(200, r("re_b1", 100, 1), r("re_b2", 100, 2)))
	e.wantBalance("bob", "0")
	// A refund that comes before its top-up's grant is refused (500),
	// so Stripe sends it again: after the grant it takes its share.
	e.payer("hana")
	early := map[string]any{"id": "ch_h", "object": "charge", "amount": 1000, "amount_refunded": 500, "currency": "usd",
		"payment_intent": "pi_h", "metadata": map[string]string{payments.MetaPack: "small"},
		"refunds": map[string]any{"object": "list", "data": []any{r("re_h1", 500, 1)}}}
	if status, body := e.deliver("evt_h_r", "charge.refunded", at, early); status != http.StatusInternalServerError {
		t.Fatalf("refund before its grant: %d %s, want 500", status, body)
	}
	e.mustDeliver("evt_h_paid", "checkout.session.completed", at, paidSession("cs_h", "pi_h", "hana", "small", 1000))
	e.mustDeliver("evt_h_r", "charge.refunded", at, early)
	e.wantBalance("hana", "50")
	// A failed refund returns no money and takes back nothing.
	e.payer("carol")
	e.mustDeliver("evt_c_paid", "checkout.session.completed", at, paidSession("cs_c", "pi_c", "carol", "small", 1000))
	failed := r("re_c1", 1000, 1)
	failed["status"] = "failed"
	e.mustDeliver("evt_c_r1", "charge.refunded", at, map[string]any{"id": "ch_c", "object": "charge", "amount": 1000, "amount_refunded": 0,
		"currency": "usd", "payment_intent": "pi_c", "refunds": map[string]any{"object": "list", "data": []any{failed}}})
	e.wantBalance("carol", "100")
}

// TestTopUpDisputeLost: a lost dispute takes back what the grant has
// left after a partial refund, once; a won one nothing.
func TestTopUpDisputeLost(t *testing.T) {
	e := startTopUps(t)
	e.payer("dave")
	at := time.Now().Truncate(time.Second)
	e.mustDeliver("evt_d_paid", "checkout.session.completed", at, paidSession("cs_d", "pi_d", "dave", "small", 1000))
	e.mustDeliver("evt_d_r1", "charge.refunded", at, map[string]any{"id": "ch_d", "object": "charge", "amount": 1000, "amount_refunded": 100,
		"currency": "usd", "payment_intent": "pi_d", "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_d1", "object": "refund", "amount": 100, "status": "succeeded", "created": at.Unix()}}}})
	e.wantBalance("dave", "90")
	dispute := func(status string) map[string]any {
		return map[string]any{"id": "dp_d", "object": "dispute", "amount": 900, "currency": "usd", "status": status,
			"charge": "ch_d", "payment_intent": "pi_d"}
	}
	e.mustDeliver("evt_d_won", "charge.dispute.closed", at, map[string]any{"id": "dp_other", "object": "dispute", "amount": 900,
		"currency": "usd", "status": "won", "charge": "ch_d", "payment_intent": "pi_d"})
	e.wantBalance("dave", "90")
	e.mustDeliver("evt_d_lost", "charge.dispute.closed", at, dispute("lost"))
	e.mustDeliver("evt_d_lost", "charge.dispute.closed", at, dispute("lost"))
	e.mustDeliver("evt_d_lost2", "charge.dispute.closed", at, dispute("lost"))
	e.wantBalance("dave", "0")
	if rec := e.topUp("pi_d"); rec.Disputed != 900 || rec.Refunded != 100 {
		t.Errorf("top-up record %+v", rec)
	}
	// A refund or dispute of a payment that bought no top-up (a
	// subscription's invoice) changes nothing.
	e.mustDeliver("evt_other_r", "charge.refunded", at, map[string]any{"id": "ch_x", "object": "charge", "amount": 1000,
		"amount_refunded": 1000, "currency": "usd", "payment_intent": "pi_invoice", "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_x", "object": "refund", "amount": 1000, "status": "succeeded"}}}})
	e.mustDeliver("evt_other_d", "charge.dispute.closed", at, map[string]any{"id": "dp_x", "object": "dispute", "amount": 1000,
		"currency": "usd", "status": "lost", "payment_intent": "pi_invoice"})
	e.wantBalance("dave", "0")
}

// TestTopUpBadSessions: a paid session that names an unknown user, pack
// or product, or pays nothing, verifies but can never apply: 200 with
// the reason it is ignored (Stripe retries anything else for days), the
// event recorded as ignored, and nothing changes; an unpaid one (a
// delayed payment) and a failed one grant nothing.
func TestTopUpBadSessions(t *testing.T) {
	e := startTopUps(t)
	e.payer("erin")
	at := time.Now().Truncate(time.Second)
	bad := map[string]map[string]any{}
	s := paidSession("cs_e1", "pi_e1", "nobody", "small", 1000)
	bad["unknown user"] = s
	s = paidSession("cs_e2", "pi_e2", "erin", "huge", 1000)
	bad["unknown pack"] = s
	s = paidSession("cs_e3", "pi_e3", "erin", "small", 1000)
	s["metadata"].(map[string]string)[payments.MetaProduct] = "gold"
	bad["unknown product"] = s
	s = paidSession("cs_e4", "pi_e4", "erin", "small", 1000)
	s["metadata"].(map[string]string)[payments.MetaService] = "weather"
	bad["unknown service"] = s
	bad["amount 0"] = paidSession("cs_e5", "pi_e5", "erin", "small", 0)
	s = paidSession("cs_e6", "", "erin", "small", 1000)
	delete(s, "payment_intent")
	bad["no payment intent"] = s
	s = paidSession("cs_e7", "pi_e7", "erin", "small", 1000)
	s["metadata"].(map[string]string)[payments.MetaUser] = ""
	bad["no user"] = s
	for name, sess := range bad {
		id := "evt_bad_" + strings.ReplaceAll(name, " ", "_")
		status, body := e.deliver(id, "checkout.session.completed", at, sess)
		var got struct {
			Received bool
			Ignored  string
		}
		_ = json.Unmarshal([]byte(body), &got)
		if status != http.StatusOK || !got.Received || got.Ignored == "" {
			t.Errorf("%s: %d %s, want 200 with the reason it is ignored", name, status, body)
		}
		if b, err := e.pay.GetPaymentRecord(context.Background(), payments.KindEvent, id); err != nil ||
			!strings.Contains(string(b), `"ignored":true`) || !strings.Contains(string(b), `"reason":`) {
			t.Errorf("%s: event recorded as %s %v, want ignored with its reason", name, b, err)
		}
	}
	// A session the gateway did not start (a Payment Link: none of its
	// metadata) is not a top-up: ignored.
	s = paidSession("cs_e9", "pi_e9", "erin", "small", 1000)
	s["metadata"] = map[string]string{"order": "42"}
	e.mustDeliver("evt_not_ours", "checkout.session.completed", at, s)
	e.wantBalance("erin", "0")
	if gs, _ := e.pay.ListCreditGrants(context.Background(), "", ""); len(gs) != 0 {
		t.Errorf("grants after bad sessions: %+v", gs)
	}
	recs, _, err := e.pay.ListPaymentRecords(context.Background(), payments.KindTopUp, "", 10)
	if err != nil || len(recs) != 0 {
		t.Errorf("top-up records after bad sessions: %v %v", recs, err)
	}

	// A delayed payment completes the session unpaid: nothing yet; it
	// fails: nothing, audited; the next session pays: granted.
	unpaid := paidSession("cs_e8", "pi_e8", "erin", "small", 1000)
	unpaid["payment_status"] = "unpaid"
	e.mustDeliver("evt_e8_done", "checkout.session.completed", at, unpaid)
	e.mustDeliver("evt_e8_failed", "checkout.session.async_payment_failed", at, unpaid)
	e.wantBalance("erin", "0")
	entries := e.audit("erin")
	var failed int
	for _, a := range entries {
		if a.Action == "topup.failed" && a.Actor == "stripe" {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("%d topup.failed audit entries, want 1", failed)
	}
	unpaid["payment_status"] = "paid"
	e.mustDeliver("evt_e8_paid", "checkout.session.async_payment_succeeded", at, unpaid)
	e.wantBalance("erin", "100")
}

// TestTopUpExpiry: credits bought with an expires_after end at their
// time, by the app's clock and its maintenance, the oldest grant first,
// once however many times maintenance runs.
func TestTopUpExpiry(t *testing.T) {
	e := startTopUps(t)
	key := e.payer("frank")
	t0 := time.Now().Truncate(time.Second)
	// big: 1000 credits expiring 30 days after t0; small a day later,
	// without expiry.
	e.mustDeliver("evt_f1", "checkout.session.completed", t0, paidSession("cs_f1", "pi_f1", "frank", "big", 5000))
	e.mustDeliver("evt_f2", "checkout.session.completed", t0.Add(24*time.Hour), paidSession("cs_f2", "pi_f2", "frank", "small", 1000))
	e.wantBalance("frank", "1100")
	gs := e.grants("frank")
	if len(gs) != 2 || !gs[0].ExpiresAt.Equal(t0.Add(720*time.Hour)) {
		t.Fatalf("grants %+v", gs)
	}
	for range 20 {
		if status, body := invokeEcho(t, key); status != http.StatusOK {
			t.Fatalf("call: %d %s", status, body)
		}
	}
	e.wantBalance("frank", "1080")
	ctx := context.Background()
	// A second before: nothing expires.
	e.app.SetClock(func() time.Time { return t0.Add(720*time.Hour - time.Second) })
	e.app.RunMaintenance(ctx)
	e.wantBalance("frank", "1080")
	// At its time: the 20 credits spent came from the oldest grant, so
	// 980 of it expire and the 100 of the newer grant stay.
	e.app.SetClock(func() time.Time { return t0.Add(720 * time.Hour) })
	e.app.RunMaintenance(ctx)
	e.app.RunMaintenance(ctx)
	gs = e.grants("frank")
	e.wantBalance("frank", "100")
	if gs[0].Expired != billing.Whole(980) || gs[0].ExpiredAt.IsZero() || gs[1].Expired != 0 {
		t.Errorf("grants after expiry %+v", gs)
	}
	entries := e.audit("frank")
	var expiries int
	for _, a := range entries {
		if a.Action == "credits.expire" {
			expiries++
		}
	}
	if expiries != 1 {
		t.Errorf("%d credits.expire audit entries, want 1", expiries)
	}
	// A full refund of the expired pack takes back what it gave and did
	// not expire: the 20 credits spent, not the 980 that expired again.
	e.mustDeliver("evt_f_r", "charge.refunded", t0.Add(721*time.Hour), map[string]any{"id": "ch_f1", "object": "charge", "amount": 5000,
		"amount_refunded": 5000, "currency": "usd", "payment_intent": "pi_f1", "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_f1", "object": "refund", "amount": 5000, "status": "succeeded"}}}})
	e.wantBalance("frank", "80")
}

// TestTopUpRefundsFromStripe: a charge.refunded event without its refunds
// (as Stripe sends it since API version 2022-11-15) has them listed from
// Stripe.
func TestTopUpRefundsFromStripe(t *testing.T) {
	e := startTopUps(t)
	e.payer("gina")
	at := time.Now().Truncate(time.Second)
	e.mustDeliver("evt_g_paid", "checkout.session.completed", at, paidSession("cs_g", "pi_g", "gina", "small", 1000))
	e.mustDeliver("evt_g_r", "charge.refunded", at, map[string]any{"id": "ch_g", "object": "charge", "amount": 1000,
		"amount_refunded": 100, "currency": "usd", "payment_intent": "pi_g"})
	lists := e.mock.Requests("/v1/refunds")
	if len(lists) != 1 || lists[0].Method != http.MethodGet || lists[0].Form.Get("charge") != "ch_g" {
		t.Fatalf("refund listings %+v", lists)
	}
	// stripe-mock's fixture refund is 100 (of the 1000 paid): a tenth.
	e.wantBalance("gina", "90")
}

// TestTopUpNeedsThePacksProduct: a pack is sold only to a caller whose
// subscription to the service is to the pack's product and grants access
// now; anything else is ErrNoSubscription (the portal's "subscribe to its
// prepaid plan first") and opens no Checkout.
func TestTopUpNeedsThePacksProduct(t *testing.T) {
	e := startTopUps(t)
	ctx := context.Background()
	svc := e.app.PaymentsService()
	put := func(user, product, status string) {
		t.Helper()
		if _, err := e.app.DataStore().PutSubscription(ctx, store.Subscription{UserID: user, ServiceID: "echo", ProductID: product,
			Status: status, UpdatedAt: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
	}
	put("ivan", "free", "ACTIVE")
	put("judy", "credits", "SUSPENDED")
	for _, user := range []string{"ivan", "judy", "nobody"} {
		if _, err := svc.StartTopUp(ctx, user, "echo", "credits", "small", topUpSite+"/ok", topUpSite+"/cancel"); !errors.Is(err, payments.ErrNoSubscription) {
			t.Errorf("%s: %v, want ErrNoSubscription", user, err)
		}
	}
	if n := len(e.mock.Requests("/v1/checkout/sessions")); n != 0 {
		t.Errorf("%d Checkout Sessions opened, want none", n)
	}
	put("ivan", "credits", "ACTIVE")
	if _, err := svc.StartTopUp(ctx, "ivan", "echo", "credits", "small", topUpSite+"/ok", topUpSite+"/cancel"); err != nil {
		t.Errorf("on the pack's product: %v", err)
	}
}

// TestTopUpPendingRefund: a refund pending when charge.refunded comes
// takes no credits; one that then fails never does; one that then
// succeeds (charge.refund.updated) takes its share once, however many
// events say so.
func TestTopUpPendingRefund(t *testing.T) {
	e := startTopUps(t)
	e.payer("kim")
	at := time.Now().Truncate(time.Second)
	e.mustDeliver("evt_k_paid", "checkout.session.completed", at, paidSession("cs_k", "pi_k", "kim", "small", 1000))
	e.wantBalance("kim", "100")
	refund := func(id string, amount int64, status string, min int) map[string]any {
		return map[string]any{"id": id, "object": "refund", "amount": amount, "status": status, "currency": "usd",
			"charge": "ch_k", "payment_intent": "pi_k", "created": at.Add(time.Duration(min) * time.Minute).Unix()}
	}
	charge := func(refunded int64, refunds ...map[string]any) map[string]any {
		return map[string]any{"id": "ch_k", "object": "charge", "amount": 1000, "amount_refunded": refunded, "currency": "usd",
			"payment_intent": "pi_k", "refunds": map[string]any{"object": "list", "has_more": false, "data": refunds}}
	}
	// 2.50 refunded, pending: nothing yet; then it fails: nothing ever.
	e.mustDeliver("evt_k_r1", "charge.refunded", at, charge(250, refund("re_k1", 250, "pending", 1)))
	e.wantBalance("kim", "100")
	e.mustDeliver("evt_k_u1", "charge.refund.updated", at.Add(time.Minute), refund("re_k1", 250, "failed", 1))
	e.wantBalance("kim", "100")
	// 5.00 refunded, pending, then succeeded: half the pack, once. What
	// Stripe lists of the charge's refunds when asked:
	e.mock.Answer("/v1/refunds", map[string]any{"object": "list", "url": "/v1/refunds", "has_more": false,
		"data": []any{refund("re_k1", 250, "failed", 1), refund("re_k2", 500, "succeeded", 2)}})
	e.mustDeliver("evt_k_r2", "charge.refunded", at, charge(500, refund("re_k1", 250, "failed", 1), refund("re_k2", 500, "pending", 2)))
	e.wantBalance("kim", "100")
	e.mustDeliver("evt_k_u2", "charge.refund.updated", at.Add(2*time.Minute), refund("re_k2", 500, "succeeded", 2))
	e.mustDeliver("evt_k_u2", "charge.refund.updated", at.Add(2*time.Minute), refund("re_k2", 500, "succeeded", 2))
	e.mustDeliver("evt_k_u2b", "charge.refund.updated", at.Add(2*time.Minute), refund("re_k2", 500, "succeeded", 2))
	e.mustDeliver("evt_k_r3", "charge.refunded", at, charge(500, refund("re_k1", 250, "failed", 1), refund("re_k2", 500, "succeeded", 2)))
	e.wantBalance("kim", "50")
	if rec := e.topUp("pi_k"); rec.Refunded != 500 {
		t.Errorf("top-up record refunded %d, want 500 (what succeeded)", rec.Refunded)
	}
	if gs := e.grants("kim"); len(gs) != 1 || gs[0].Reversed != billing.Whole(50) {
		t.Errorf("grants %+v, want 50 reversed", gs)
	}
}

// TestTopUpRefundOfIgnoredTopUp: a paid top-up the config can never grant
// (here a pack it no longer has) is ignored when paid, and the operator
// refunds it, as docs/payments.md says. Its refund is ignored too (200):
// answered 500, it came back for Stripe's three days of retries and could
// get the endpoint disabled, stopping every later payment event. A refund
// of a top-up that can still be granted keeps answering 500 until the
// grant (TestTopUpOutOfOrderRefunds).
func TestTopUpRefundOfIgnoredTopUp(t *testing.T) {
	e := startTopUps(t)
	e.payer("zoe")
	at := time.Now().Truncate(time.Second)
	status, body := e.deliver("evt_z_paid", "checkout.session.completed", at, paidSession("cs_z", "pi_z", "zoe", "retired", 1000))
	if status != http.StatusOK || !strings.Contains(body, "ignored") {
		t.Fatalf("paid session of a pack the config does not have: %d %s, want 200 ignored", status, body)
	}
	e.wantBalance("zoe", "0")
	// The charge carries no metadata: the PaymentIntent, which the
	// gateway's session set up, names the top-up.
	e.mock.Answer("/v1/payment_intents/pi_z", map[string]any{"id": "pi_z", "object": "payment_intent", "amount": 1000, "currency": "usd",
		"metadata": map[string]string{payments.MetaUser: "zoe", payments.MetaService: "echo", payments.MetaProduct: "credits", payments.MetaPack: "retired"}})
	refund := map[string]any{"id": "ch_z", "object": "charge", "amount": 1000, "amount_refunded": 1000, "currency": "usd",
		"payment_intent": "pi_z", "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_z", "object": "refund", "amount": 1000, "status": "succeeded", "created": at.Unix()}}}}
	for i := range 2 {
		status, body := e.deliver(fmt.Sprintf("evt_z_refund%d", i), "charge.refunded", at, refund)
		if status != http.StatusOK || !strings.Contains(body, "nothing to take back") {
			t.Errorf("refund %d of a top-up that can never be granted: %d %s, want 200 ignored", i+1, status, body)
		}
	}
	e.wantBalance("zoe", "0")
	if gs := e.grants("zoe"); len(gs) != 0 {
		t.Errorf("grants after the refund: %+v", gs)
	}

	// A top-up paid by a caller without a subscription is ignored too;
	// the caller subscribes afterwards, so the config could grant it now,
	// but its paid event is past: the refund is still ignored (it was
	// answered 500 until Stripe gave up).
	e.customer("yves")
	status, body = e.deliver("evt_y_paid", "checkout.session.completed", at, paidSession("cs_y", "pi_y", "yves", "small", 1000))
	if status != http.StatusOK || !strings.Contains(body, "ignored") {
		t.Fatalf("paid session of a caller without a subscription: %d %s, want 200 ignored", status, body)
	}
	e.caller("yves")
	e.mock.Answer("/v1/payment_intents/pi_y", map[string]any{"id": "pi_y", "object": "payment_intent", "amount": 1000, "currency": "usd",
		"metadata": map[string]string{payments.MetaUser: "yves", payments.MetaService: "echo", payments.MetaProduct: "credits", payments.MetaPack: "small"}})
	refundY := map[string]any{"id": "ch_y", "object": "charge", "amount": 1000, "amount_refunded": 1000, "currency": "usd",
		"payment_intent": "pi_y", "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_y", "object": "refund", "amount": 1000, "status": "succeeded", "created": at.Unix()}}}}
	if status, body := e.deliver("evt_y_refund", "charge.refunded", at, refundY); status != http.StatusOK || !strings.Contains(body, "ignored when it was paid") {
		t.Errorf("refund of a top-up ignored when paid, its user subscribed since: %d %s, want 200 ignored", status, body)
	}
	e.wantBalance("yves", "0")

	// A top-up ignored by a gateway from before that record (no record
	// of it): its refund is still ignored when the config cannot grant
	// it, by the PaymentIntent's metadata.
	e.mock.Answer("/v1/payment_intents/pi_old", map[string]any{"id": "pi_old", "object": "payment_intent", "amount": 1000, "currency": "usd",
		"metadata": map[string]string{payments.MetaUser: "zoe", payments.MetaService: "echo", payments.MetaProduct: "credits", payments.MetaPack: "retired"}})
	refundOld := map[string]any{"id": "ch_old", "object": "charge", "amount": 1000, "amount_refunded": 1000, "currency": "usd",
		"payment_intent": "pi_old", "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_old", "object": "refund", "amount": 1000, "status": "succeeded", "created": at.Unix()}}}}
	if status, body := e.deliver("evt_old_refund", "charge.refunded", at, refundOld); status != http.StatusOK || !strings.Contains(body, "never granted and cannot be") {
		t.Errorf("refund of a top-up the config cannot grant, with no record of it: %d %s, want 200 ignored", status, body)
	}
}
