package portal

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	gwstore "github.com/platformgw/gateway/internal/store"

	_ "github.com/platformgw/gateway/internal/stripewebhook"
)

const payWhsec = "whsec_portal_0123456789abcdef0123456789abcdef"

// startPaid runs the site of startSite with echo public, a paid plan
// "pro" (29 USD a month, self-service) sold through Stripe (stripe-mock
// behind its recording proxy), the free basic plan, and the webhook
// endpoint.
func startPaid(t *testing.T) (*env, *stripetest.Mock) {
	t.Helper()
	mock := stripetest.Start(t)
	dir := t.TempDir()
	backend := signingBackend(t)
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
	platform {
		store %s/platform.db
		public_url %s
		service echo {
			backend %s
			secret %s
			public
			display_name Echo
			endpoint hello {
				methods GET POST
				path /hello
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
				display_name Free
				self_service
			}
			product pro {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 10000 per month
				display_name Pro
				currency USD
				period_price 29
				self_service
			}
		}
		payments stripe {
			secret_key sk_test_portal
			webhook_secret %s
			api_base %s
			past_due_grace 72h
			price echo pro price_pro_usd
		}
	}
}
:%d {
	bind 127.0.0.1
	handle /stripe/webhook {
		platform_stripe_webhook
	}
	handle_path /portal/* {
		platform_portal {
			sign_in_limit 1000
		}
	}
	handle_path /store/* {
		platform_storefront {
			sign_in_url /portal/
		}
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
`, adminPort, httpPort, dir, siteBase, backend.URL, echoSecret, payWhsec, mock.URL, httpPort)
	unloadOtherStore(filepath.Join(dir, "platform.db"))
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	e := &env{t: t, dir: dir, base: siteBase}
	app := e.app()
	e.rt, e.ops, e.clock = app.Runtime(), app.Ops(), app.SetClock
	return e, mock
}

func payEvent(t *testing.T, id, typ string, created time.Time, obj map[string]any) {
	t.Helper()
	status, body := stripetest.Deliver(t, siteBase+"/stripe/webhook", stripetest.Event(id, typ, created, obj), payWhsec, time.Now())
	if status != http.StatusOK {
		t.Fatalf("%s %s: %d %s", typ, id, status, body)
	}
}

// TestPaidSubscriptionFollowsStripe walks a caller from Subscribe to a
// call served, through Stripe: Checkout is created with the plan's Price
// for the caller's one customer; the signed webhooks make the plan
// ACTIVE and calls are served; a failed payment keeps them served for
// the grace, then refuses them subscription_inactive; a paid invoice
// serves them again; the billing page shows the invoice as money and
// opens Stripe's customer portal.
func TestPaidSubscriptionFollowsStripe(t *testing.T) {
	e, mock := startPaid(t)
	// The storefront's Subscribe leads to the portal's plans, where a
	// paid plan is paid through Stripe.
	store := newClient(t)
	if resp, page := store.get("/store/services/echo"); resp.StatusCode != 200 || !strings.Contains(page, `href="/portal/plans/echo">Subscribe</a>`) ||
		!strings.Contains(page, "with Stripe's checkout") {
		t.Errorf("storefront service page: %d %v\n%s", resp.StatusCode, resp.Header, page)
	}
	if resp, _ := store.get("/portal/plans/echo"); resp.StatusCode != http.StatusSeeOther || store.cookie(nextCookie) == nil {
		t.Errorf("plans before sign-in: %d, want sign-in first and back", resp.StatusCode)
	}
	key := e.keyOnly("payer")
	c := e.newClient()
	c.signIn(key)

	resp, page := c.get("/portal/plans/echo")
	if resp.StatusCode != 200 || !strings.Contains(page, "Subscribe and pay with Stripe") || !strings.Contains(page, "29.00 USD") {
		t.Fatalf("plans page: %d\n%s", resp.StatusCode, page)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "form-action 'self' https://checkout.stripe.com https://billing.stripe.com") || strings.Contains(csp, "unsafe") {
		t.Errorf("CSP: %s", csp)
	}
	// A POST without the CSRF token starts nothing.
	if resp, _ := c.post("/portal/plans/echo/checkout", url.Values{"product": {"pro"}}); resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusBadRequest {
		t.Errorf("checkout without csrf: %d", resp.StatusCode)
	}
	if n := len(mock.Requests("/v1/checkout/sessions")); n != 0 {
		t.Fatalf("%d Checkout Sessions without a token", n)
	}
	resp, body := c.plansFormFor("echo", "checkout", "pro")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "https://checkout.stripe.com/") {
		t.Fatalf("checkout: %d %s\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	// A second click while Stripe says the session is still open: the
	// same session again (two would make two subscriptions and two
	// charges), the same customer.
	var opened []stripetest.Request
	for _, r := range mock.Requests("/v1/checkout/sessions") {
		if r.Method == http.MethodPost {
			opened = append(opened, r)
		}
	}
	first := resp.Header.Get("Location")
	kept, err := e.store().(gwstore.Payments).GetPaymentRecord(context.Background(), payments.KindCheckoutOpen, "echo/payer")
	var open struct {
		SessionID string `json:"sessionId"`
	}
	if err != nil || json.Unmarshal(kept, &open) != nil || open.SessionID == "" {
		t.Fatalf("the open session was not kept: %s %v", kept, err)
	}
	sessionID := open.SessionID
	mock.Answer("/v1/checkout/sessions/"+sessionID, map[string]any{"status": "open", "expires_at": time.Now().Add(time.Hour).Unix()})
	if resp, _ := c.plansFormFor("echo", "checkout", "pro"); resp.Header.Get("Location") != first {
		t.Errorf("a second click went to %q, want the open session %q", resp.Header.Get("Location"), first)
	}
	mock.Answer("/v1/checkout/sessions/"+sessionID, map[string]any{"status": "expired"})
	c.plansFormFor("echo", "checkout", "pro") // expired: a new session
	custs := mock.Requests("/v1/customers")
	if len(custs) != 1 || custs[0].Method != "POST" || custs[0].IdempotencyKey == "" || custs[0].Form.Get("metadata[platform_user_id]") != "payer" {
		t.Fatalf("customer creations: %+v", custs)
	}
	var sessions []stripetest.Request
	for _, r := range mock.Requests("/v1/checkout/sessions") {
		if r.Method == http.MethodPost {
			sessions = append(sessions, r)
		}
	}
	if len(opened) != 1 || len(sessions) != 2 {
		t.Fatalf("%d then %d Checkout Sessions made, want 1 (the second click reuses it) then 2 (after it expired)", len(opened), len(sessions))
	}
	f := sessions[0].Form
	if f.Get("mode") != "subscription" || f.Get("line_items[0][price]") != "price_pro_usd" || f.Get("line_items[0][quantity]") != "1" ||
		f.Get("client_reference_id") != "payer" || f.Get("metadata[platform_product_id]") != "pro" ||
		f.Get("subscription_data[metadata][platform_service_id]") != "echo" || f.Get("customer") == "" ||
		f.Get("customer") != sessions[1].Form.Get("customer") ||
		!strings.HasPrefix(f.Get("success_url"), siteBase+"/portal/plans/echo?m=subscribed") || !strings.Contains(f.Get("cancel_url"), "m=checkout-cancelled") {
		t.Fatalf("Checkout Session form: %v", f)
	}
	cust := f.Get("customer")
	if _, page := c.get("/portal/plans/echo?m=subscribed"); !strings.Contains(page, "your payment went through Stripe") {
		t.Error("no message back from Checkout")
	}

	// Stripe's events, signed, over HTTP: the session completed, then
	// the subscription created (an older event, as Stripe sends them).
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	periodEnd := t0.Add(30 * 24 * time.Hour)
	sub := map[string]any{"id": "sub_payer", "object": "subscription", "customer": cust, "status": "active",
		"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_1", "object": "subscription_item",
			"price": map[string]any{"id": "price_pro_usd", "object": "price"}, "current_period_end": periodEnd.Unix()}}}}
	payEvent(t, "evt_cs", "checkout.session.completed", t0.Add(time.Second), map[string]any{"id": "cs_1", "object": "checkout.session",
		"mode": "subscription", "customer": cust, "subscription": "sub_payer", "client_reference_id": "payer",
		"payment_status": "paid", "metadata": map[string]string{"platform_user_id": "payer", "platform_service_id": "echo", "platform_product_id": "pro"}})
	if s, ok := e.subscriptionTo("payer", "echo"); ok {
		t.Fatalf("checkout completed set a status before the subscription's own event: %+v", s)
	}
	payEvent(t, "evt_sub", "customer.subscription.created", t0, sub)
	if s, ok := e.subscriptionTo("payer", "echo"); !ok || s.Status != "ACTIVE" || s.ProductID != "pro" {
		t.Fatalf("after the webhooks: %+v %v", s, ok)
	}
	if status, _ := invoke(t, key); status != 200 {
		t.Fatalf("call after paying: %d", status)
	}

	inv := func(status string, paid int64) map[string]any {
		return map[string]any{"id": "in_payer_1", "object": "invoice", "customer": cust, "status": status,
			"amount_due": 2900, "amount_paid": paid, "currency": "usd",
			"hosted_invoice_url": "https://invoice.stripe.com/i/in_payer_1", "invoice_pdf": "https://pay.stripe.com/invoice/in_payer_1/pdf",
			"status_transitions": map[string]any{"paid_at": t0.Add(3 * time.Second).Unix()},
			"parent":             map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_payer"}}}
	}
	// An invoice event makes the gateway read the subscription back from
	// Stripe (stripe-mock's answer, with Stripe's status set here).
	stripeSays := func(status string) {
		mock.Answer("/v1/subscriptions/sub_payer", map[string]any{"status": status, "customer": cust,
			"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil,
			"metadata": map[string]string{"platform_user_id": "payer", "platform_service_id": "echo", "platform_product_id": "pro"},
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_1", "object": "subscription_item",
				"price": map[string]any{"id": "price_pro_usd", "object": "price"}, "current_period_end": periodEnd.Unix()}}}})
	}
	stripeSays("past_due")
	payEvent(t, "evt_fail", "invoice.payment_failed", t0.Add(2*time.Second), inv("open", 0))
	if status, _ := invoke(t, key); status != 200 {
		t.Fatalf("call within the grace: %d", status)
	}
	e.setClock(func() time.Time { return t0.Add(2*time.Second + 72*time.Hour) })
	code, body := invokeBody(t, key)
	if code != http.StatusForbidden || !strings.Contains(body, "subscription_inactive") {
		t.Fatalf("call past the grace: %d %s", code, body)
	}
	// (A session of its own: the clock moved past the first one's end.)
	later := e.newClient()
	later.signIn(key)
	if _, page := later.get("/portal/plans/echo"); !strings.Contains(page, "suspended because a payment failed") {
		t.Errorf("plans page past the grace:\n%s", page)
	}
	e.setClock(nil)
	_, page = c.get("/portal/billing")
	if !strings.Contains(page, "29.00 USD") || !strings.Contains(page, "Payment failed") || !strings.Contains(page, "https://invoice.stripe.com/i/in_payer_1") {
		t.Errorf("billing page with the failed invoice:\n%s", page)
	}
	stripeSays("active")
	payEvent(t, "evt_paid", "invoice.paid", t0.Add(3*time.Second), inv("paid", 2900))
	if status, _ := invoke(t, key); status != 200 {
		t.Fatalf("call after the invoice was paid: %d", status)
	}
	_, page = c.get("/portal/billing")
	if !strings.Contains(page, "Paid") || strings.Contains(page, "Payment failed") || !strings.Contains(page, "Manage payment method") {
		t.Errorf("billing page after paying:\n%s", page)
	}
	if !e.audited("subscription.stripe", "stripe") || !e.audited("invoice.stripe", "stripe") {
		t.Error("Stripe's changes are not audited")
	}

	// The customer portal: a POST with the token, 303 to Stripe.
	_, page = c.get("/portal/billing")
	resp, body = c.post("/portal/billing/portal", url.Values{"csrf": {csrf(t, page)}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") == "" {
		t.Fatalf("customer portal: %d %s\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	bp := mock.Requests("/v1/billing_portal/sessions")
	if len(bp) != 1 || bp[0].Form.Get("customer") != cust || bp[0].Form.Get("return_url") != siteBase+"/portal/billing?m=returned" {
		t.Errorf("billing portal sessions: %+v", bp)
	}
	if resp, _ := c.get("/portal/billing/portal"); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET of the customer portal action: %d", resp.StatusCode)
	}

	// Stripe down at checkout: a clear page, nothing changed.
	mock.Fail(func(stripetest.Request) int { return http.StatusServiceUnavailable })
	key2 := e.keyOnly("payer2")
	c2 := e.newClient()
	c2.signIn(key2)
	resp, body = c2.plansFormFor("echo", "checkout", "pro")
	mock.Fail(nil)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "Nothing was changed and nothing was charged") {
		t.Errorf("Stripe down: %d\n%s", resp.StatusCode, body)
	}
	if _, ok := e.subscriptionTo("payer2", "echo"); ok {
		t.Error("Stripe down made a subscription")
	}
}

// plansFormFor posts a plans form of service with the page's token.
func (c *client) plansFormFor(service, action, product string) (*http.Response, string) {
	c.t.Helper()
	_, page := c.get("/portal/plans/" + service)
	return c.post("/portal/plans/"+service+"/"+action, url.Values{"csrf": {csrf(c.t, page)}, "product": {product}})
}

func (e *env) subscriptionTo(user, service string) (struct{ Status, ProductID string }, bool) {
	e.t.Helper()
	s, err := e.store().GetSubscription(context.Background(), user, service)
	return struct{ Status, ProductID string }{s.Status, s.ProductID}, err == nil
}

// invokeBody is invoke with the answer's body.
func invokeBody(t *testing.T, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, siteBase+"/api/service/echo/endpoint/hello/invoke", strings.NewReader(`{"q":1}`))
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

// TestCheckoutBeingOpenedElsewhere: a Subscribe while the caller's
// Checkout of the service is being opened elsewhere (another tab, a
// double submit, another node) opens no second one: the caller is told
// it is being opened and to try again, with nothing charged.
func TestCheckoutBeingOpenedElsewhere(t *testing.T) {
	e, mock := startPaid(t)
	key := e.keyOnly("payer")
	c := e.newClient()
	c.signIn(key)
	// The claim of the other click, made just now.
	claim, _ := json.Marshal(map[string]any{"productId": "pro", "claim": "another-tab", "claimedAt": time.Now().UTC()})
	if _, err := e.store().(gwstore.Payments).InsertPaymentRecord(context.Background(), payments.KindCheckoutOpen, "echo/payer", claim, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, page := c.plansFormFor("echo", "checkout", "pro")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(page, "being opened for you in another tab or window") ||
		!strings.Contains(page, "Nothing was charged") {
		t.Fatalf("checkout while another is being opened: %d %s\n%s", resp.StatusCode, resp.Header.Get("Location"), page)
	}
	for _, r := range mock.Requests("/v1/checkout/sessions") {
		if r.Method == http.MethodPost {
			t.Fatalf("a Checkout Session was created while another click held the claim: %+v", r)
		}
	}
}

// TestCheckoutPaidBeforeItsWebhook: a caller who paid a Checkout and,
// before Stripe's webhook reached the gateway, clicked the paid plan
// again on the plans page (opened from the menu, another tab, a phone)
// was sent to a second Checkout they could pay: a second Stripe
// subscription and a second charge. The click now applies the paid
// session and shows the plan; while its payment is still on its way
// (or Stripe does not answer) it says so, 409, and opens nothing. The
// webhooks arriving afterwards change nothing.
func TestCheckoutPaidBeforeItsWebhook(t *testing.T) {
	e, mock := startPaid(t)
	key := e.keyOnly("payer")
	c := e.newClient()
	c.signIn(key)
	if resp, body := c.plansFormFor("echo", "checkout", "pro"); resp.StatusCode != http.StatusSeeOther ||
		!strings.HasPrefix(resp.Header.Get("Location"), "https://checkout.stripe.com/") {
		t.Fatalf("checkout: %d %s\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	pay := e.store().(gwstore.Payments)
	var open struct {
		SessionID string `json:"sessionId"`
	}
	var cust payments.CustomerRecord
	b, err := pay.GetPaymentRecord(context.Background(), payments.KindCheckoutOpen, "echo/payer")
	cb, cerr := pay.GetPaymentRecord(context.Background(), payments.KindCustomer, "payer")
	if err != nil || cerr != nil || json.Unmarshal(b, &open) != nil || json.Unmarshal(cb, &cust) != nil || open.SessionID == "" || cust.CustomerID == "" {
		t.Fatalf("the open session %s %v, the customer %s %v", b, err, cb, cerr)
	}
	created := time.Now().Add(-time.Minute).Truncate(time.Second)
	meta := map[string]string{payments.MetaUser: "payer", payments.MetaService: "echo", payments.MetaProduct: "pro"}
	session := map[string]any{"id": open.SessionID, "object": "checkout.session", "mode": "subscription", "status": "complete",
		"payment_status": "paid", "customer": cust.CustomerID, "subscription": "sub_paid_portal", "client_reference_id": "payer",
		"created": created.Unix(), "metadata": meta}
	sub := func(status string) map[string]any {
		start := created.Add(30 * time.Second)
		return map[string]any{"id": "sub_paid_portal", "object": "subscription", "customer": cust.CustomerID, "status": status,
			"created": start.Unix(), "start_date": start.Unix(), "cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil, "metadata": meta,
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_paid_portal", "object": "subscription_item",
				"price":                map[string]any{"id": "price_pro_usd", "object": "price", "recurring": map[string]any{"interval": "month", "interval_count": 1}},
				"current_period_start": start.Unix(), "current_period_end": start.AddDate(0, 1, 0).Unix()}}}}
	}
	sessionsMade := func() int {
		n := 0
		for _, r := range mock.Requests("/v1/checkout/sessions") {
			if r.Method == http.MethodPost && r.Path == "/v1/checkout/sessions" {
				n++
			}
		}
		return n
	}
	mock.Answer("/v1/checkout/sessions/"+open.SessionID, session)
	// Paid by a bank debit still on its way: the subscription is made,
	// not yet paid.
	mock.Answer("/v1/subscriptions/sub_paid_portal", sub("incomplete"))
	resp, page := c.plansFormFor("echo", "checkout", "pro")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(page, "is being confirmed with Stripe; try again in a minute") || sessionsMade() != 1 {
		t.Fatalf("a click while the paid Checkout's payment is on its way: %d %s, %d Checkout Sessions, want 409 and 1\n%s",
			resp.StatusCode, resp.Header.Get("Location"), sessionsMade(), page)
	}
	// Paid: the click applies it and the plans page shows the plan.
	mock.Answer("/v1/subscriptions/sub_paid_portal", sub("active"))
	resp, page = c.plansFormFor("echo", "checkout", "pro")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/portal/plans/echo?m=checkout-paid" || sessionsMade() != 1 {
		t.Fatalf("a click after the Checkout was paid, before its webhook: %d %s, %d Checkout Sessions at Stripe; want the plans page and 1 (a second one is a second charge)\n%s",
			resp.StatusCode, resp.Header.Get("Location"), sessionsMade(), page)
	}
	if s, ok := e.subscriptionTo("payer", "echo"); !ok || s.ProductID != "pro" || s.Status != "ACTIVE" {
		t.Fatalf("the paid Checkout applied by the click: %+v %v, want pro ACTIVE", s, ok)
	}
	resp, page = c.get(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "No second checkout was opened") || strings.Contains(page, "Subscribe and pay with Stripe") {
		t.Fatalf("the plans page after the click applied the payment: %d\n%s", resp.StatusCode, page)
	}
	before, _ := e.store().GetSubscription(context.Background(), "payer", "echo")
	payEvent(t, "evt_portal_paid_cs", "checkout.session.completed", created.Add(30*time.Second), session)
	payEvent(t, "evt_portal_paid_sub", "customer.subscription.created", created.Add(30*time.Second), sub("active"))
	if after, _ := e.store().GetSubscription(context.Background(), "payer", "echo"); after.Revision != before.Revision || after.ProductID != "pro" || after.Status != "ACTIVE" {
		t.Fatalf("the webhooks after the click changed the subscription: %+v -> %+v", before, after)
	}
	if sessionsMade() != 1 {
		t.Fatalf("%d Checkout Sessions made, want 1", sessionsMade())
	}
}
