package portal

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"

	_ "github.com/platformgw/gateway/internal/stripewebhook"
)

const portalWebhookSecret = "whsec_portal_topups"

// startTopUpSite is a gateway whose echo service has a prepaid
// self-service plan "credits" (1 credit a call) sold in two packs through
// stripe-mock ("small": 100 credits; "big": 500 credits that last 30
// days), the portal under /portal/ and the Stripe webhook endpoint.
func startTopUpSite(t *testing.T) (*env, *stripetest.Mock) {
	t.Helper()
	return startTopUpSiteWith(t, "")
}

// startTopUpSiteWith is startTopUpSite with listing, more lines of the
// prepaid product's block.
func startTopUpSiteWith(t *testing.T, listing string) (*env, *stripetest.Mock) {
	t.Helper()
	return startTopUpSitePriced(t, listing, "price_small", "price_big")
}

// startTopUpSitePriced is startTopUpSiteWith with the packs' Price ids:
// the Prices a process has read are remembered, so a test that must not
// warm those of TestPortalTopUp, which counts the lookups, names others.
func startTopUpSitePriced(t *testing.T, listing, small, big string) (*env, *stripetest.Mock) {
	t.Helper()
	mock := stripetest.Start(t)
	// What the packs' Prices cost: the webhook grants a pack only for a
	// session paid that (stripe-mock's own fixture Price is 20.00 USD).
	mock.Answer("/v1/prices/"+small, map[string]any{"unit_amount": 1000, "unit_amount_decimal": "1000", "currency": "usd"})
	mock.Answer("/v1/prices/"+big, map[string]any{"unit_amount": 5000, "unit_amount_decimal": "5000", "currency": "usd"})
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
			product credits {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 1
				currency USD
				display_name Credits
				self_service
				%s
			}
		}
		payments stripe {
			secret_key sk_test_portal
			webhook_secret %s
			api_base %s
			topup echo credits small %s 100
			topup echo credits big %s 500 720h
		}
	}
}
:%d {
	bind 127.0.0.1
	handle /stripe/webhook {
		platform_stripe_webhook
	}
	handle_path /portal/* {
		platform_portal
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
`, adminPort, httpPort, dir, siteBase, backend.URL, echoSecret, listing, portalWebhookSecret, mock.URL, small, big, httpPort)
	unloadOtherStore(filepath.Join(dir, "platform.db"))
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	e := &env{t: t, dir: dir, base: siteBase}
	app := e.app()
	e.rt, e.ops, e.clock = app.Runtime(), app.Ops(), app.SetClock
	t.Cleanup(func() { app.SetClock(nil) })
	return e, mock
}

// TestPortalTopUp walks a caller through prepaid credits in the portal:
// subscribe to the prepaid plan at no cost, see the packs with their
// prices in money, Buy (Checkout opened for their customer and the pack),
// the signed webhook adds the credits with their expiry shown, calls
// spend them, and a refund leaves a negative balance the pages show
// plainly while calls are refused.
func TestPortalTopUp(t *testing.T) {
	e, mock := startTopUpSite(t)
	// The start reads each configured Price once to check its currency
	// (platform.startPayments); the portal's lookups come after.
	atStart := len(mock.Requests("/v1/prices/"))
	key, hash, err := servicekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store().CreateKey(context.Background(), store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: "pat", Created: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	c := e.newClient()
	c.signIn(key)

	// The prepaid plan is taken at once, with no credits.
	_, page := c.get("/portal/plans/echo")
	if !strings.Contains(page, "Free to take: you pay for the credits you buy") || strings.Contains(page, "Request access") {
		t.Fatalf("plans page before subscribing:\n%s", page)
	}
	resp, page := c.post("/portal/plans/echo/subscribe", url.Values{"csrf": {csrf(t, page)}, "product": {"credits"}})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("subscribe: %d\n%s", resp.StatusCode, page)
	}
	sub, err := e.store().GetSubscription(context.Background(), "pat", "echo")
	if err != nil || sub.Status != "ACTIVE" || sub.Credits != 0 || sub.ProductID != "credits" {
		t.Fatalf("subscription %+v %v", sub, err)
	}

	// The packs, each priced in money with its currency, never added to
	// credits.
	_, page = c.get("/portal/plans/echo")
	for _, want := range []string{`<strong id="balance">0 credits</strong>`, "Calls are refused until you buy credits.",
		`id="pack-small"`, `id="pack-big"`, "100 credits for <strong>", "500 credits for <strong>", "(credits last 30 days)"} {
		if !strings.Contains(page, want) {
			t.Errorf("plans page lacks %q", want)
		}
	}
	if !regexp.MustCompile(`100 credits for <strong>[0-9,]+\.[0-9]{2} USD</strong>`).MatchString(page) {
		t.Errorf("the small pack's price is not money with its currency:\n%s", page)
	}
	if n := len(mock.Requests("/v1/prices/")) - atStart; n != 2 {
		t.Errorf("%d Price lookups, want 2 (one per pack)", n)
	}
	c.get("/portal/plans/echo")
	if n := len(mock.Requests("/v1/prices/")) - atStart; n != 2 {
		t.Errorf("%d Price lookups after a second page, want 2 (remembered)", n)
	}

	// Buy: refused without the form's token or for a pack that is not
	// sold; else off to Stripe's page.
	token := csrf(t, page)
	if resp, _ := c.post("/portal/plans/echo/buy", url.Values{"product": {"credits"}, "pack": {"big"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("buy without CSRF: %d", resp.StatusCode)
	}
	if resp, _ := c.post("/portal/plans/echo/buy", url.Values{"csrf": {token}, "product": {"credits"}, "pack": {"huge"}}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("buy an unknown pack: %d", resp.StatusCode)
	}
	if n := len(mock.Requests("/v1/checkout/sessions")); n != 0 {
		t.Fatalf("%d Checkout Sessions after refused buys", n)
	}
	resp, body := c.post("/portal/plans/echo/buy", url.Values{"csrf": {token}, "product": {"credits"}, "pack": {"big"}})
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "https://") {
		t.Fatalf("buy: %d %q\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	sessions := mock.Requests("/v1/checkout/sessions")
	if len(sessions) != 1 {
		t.Fatalf("%d Checkout Sessions, want 1", len(sessions))
	}
	f := sessions[0].Form
	for k, want := range map[string]string{"mode": "payment", "line_items[0][price]": "price_big", "line_items[0][quantity]": "1",
		"metadata[platform_user_id]": "pat", "metadata[platform_pack]": "big", "metadata[platform_product_id]": "credits",
		"success_url": siteBase + "/portal/plans/echo?m=paid", "cancel_url": siteBase + "/portal/plans/echo?m=cancelled"} {
		if got := f.Get(k); got != want {
			t.Errorf("Checkout %s = %q, want %q", k, got, want)
		}
	}
	if f.Get("customer") == "" || len(mock.Requests("/v1/customers")) != 1 {
		t.Errorf("Checkout customer %q after %d customer creations", f.Get("customer"), len(mock.Requests("/v1/customers")))
	}
	_, page = c.get("/portal/plans/echo?m=paid")
	if !strings.Contains(page, "your payment went through") {
		t.Errorf("no notice on the way back from Checkout")
	}

	// Stripe says it is paid: the credits, with their expiry.
	paidAt := time.Now().UTC().Truncate(time.Second)
	meta := map[string]string{}
	for k := range f {
		if m := regexp.MustCompile(`^metadata\[(.+)\]$`).FindStringSubmatch(k); m != nil {
			meta[m[1]] = f.Get(k)
		}
	}
	ev := stripetest.Event("evt_portal_paid", "checkout.session.completed", paidAt, map[string]any{
		"id": "cs_portal", "object": "checkout.session", "mode": "payment", "payment_status": "paid",
		"payment_intent": "pi_portal", "amount_total": 5000, "amount_subtotal": 5000, "currency": "usd", "customer": f.Get("customer"), "metadata": meta})
	if status, body := stripetest.Deliver(t, siteBase+"/stripe/webhook", ev, portalWebhookSecret, time.Now()); status != http.StatusOK {
		t.Fatalf("webhook: %d %s", status, body)
	}
	for range 10 {
		if status, _ := invoke(t, key); status != http.StatusOK {
			t.Fatalf("call after buying: %d", status)
		}
	}
	_, page = c.get("/portal/plans/echo")
	expiry := paidAt.Add(720 * time.Hour).UTC().Format("2 Jan 2006")
	for _, want := range []string{`<strong id="balance">490 credits</strong>`, "490 credits expire on " + expiry + "."} {
		if !strings.Contains(page, want) {
			t.Errorf("plans page after buying lacks %q", want)
		}
	}

	// The purchase is on the billing page, as money with its currency.
	_, page = c.get("/portal/billing")
	for _, want := range []string{`id="topup-pi_portal"`, "500 credits", "50.00 USD"} {
		if !strings.Contains(page, want) {
			t.Errorf("billing page after buying lacks %q:\n%s", want, page)
		}
	}

	// Refunded in full after 10 credits were spent: -10, shown plainly,
	// and calls refused.
	refund := stripetest.Event("evt_portal_refund", "charge.refunded", paidAt, map[string]any{
		"id": "ch_portal", "object": "charge", "amount": 5000, "amount_refunded": 5000, "currency": "usd", "payment_intent": "pi_portal",
		"refunds": map[string]any{"object": "list", "data": []any{map[string]any{"id": "re_portal", "object": "refund", "amount": 5000, "status": "succeeded"}}}})
	if status, body := stripetest.Deliver(t, siteBase+"/stripe/webhook", refund, portalWebhookSecret, time.Now()); status != http.StatusOK {
		t.Fatalf("refund webhook: %d %s", status, body)
	}
	if status, _ := invoke(t, key); status != http.StatusForbidden {
		t.Errorf("call with a negative balance: %d, want 403 insufficient_credits", status)
	}
	_, page = c.get("/portal/plans/echo")
	for _, want := range []string{`<strong id="balance" class="negative">-10 credits</strong>`, `id="negative-note"`, "insufficient_credits"} {
		if !strings.Contains(page, want) {
			t.Errorf("plans page with a negative balance lacks %q", want)
		}
	}
	if strings.Contains(page, "expire on") {
		t.Errorf("a refunded grant still shows an expiry")
	}
	_, page = c.get("/portal/billing")
	if !regexp.MustCompile(`(?s)id="topup-pi_portal".*data-label="Refunded">50\.00 USD<`).MatchString(page) {
		t.Errorf("the billing page does not show the refund as money:\n%s", page)
	}
	_, page = c.get("/portal/")
	if !strings.Contains(page, "below zero, calls are refused until you buy credits") {
		t.Errorf("the dashboard does not say the balance is below zero")
	}
}

// TestPrepaidPlanWithPeriodPriceNotFree: a prepaid plan whose listing also
// has a period price (a fee a month on top of the credits) costs money to
// take, packs or not: Subscribe does not make it ACTIVE for nothing, the
// plans page does not offer it "free to take", and nothing is stored.
func TestPrepaidPlanWithPeriodPriceNotFree(t *testing.T) {
	e, _ := startTopUpSiteWith(t, "period_price 10")
	key, hash, err := servicekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store().CreateKey(context.Background(), store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: "fee", Created: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	c := e.newClient()
	c.signIn(key)
	_, page := c.get("/portal/plans/echo")
	if strings.Contains(page, "Free to take") || !strings.Contains(page, "10.00 USD a month") {
		t.Errorf("the plans page offers a plan of 10.00 USD a month free:\n%s", page)
	}
	resp, body := c.post("/portal/plans/echo/subscribe", url.Values{"csrf": {csrf(t, page)}, "product": {"credits"}})
	if resp.StatusCode < 400 {
		t.Errorf("subscribe to a plan of 10.00 USD a month: %d\n%s", resp.StatusCode, body)
	}
	if sub, err := e.store().GetSubscription(context.Background(), "fee", "echo"); err == nil {
		t.Errorf("a plan with a period price taken for nothing: %+v", sub)
	}
}
