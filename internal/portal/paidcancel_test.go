package portal

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestPaidPlanCancelledInStripe: a plan Stripe bills is not cancelled
// or changed by the portal's own forms (Stripe would go on charging, and
// its next customer.subscription.updated would put the plan back): both
// are refused 409 with a pointer to Billing's "Manage payment method",
// nothing changes and nothing is audited, and the plans page shows a
// link to Billing instead of the cancel and change controls.
func TestPaidPlanCancelledInStripe(t *testing.T) {
	e, mock := startPaid(t)
	key := e.keyOnly("stripepayer")
	c := e.newClient()
	c.signIn(key)
	if resp, body := c.plansFormFor("echo", "checkout", "pro"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("checkout: %d\n%s", resp.StatusCode, body)
	}
	sessions := mock.Requests("/v1/checkout/sessions")
	if len(sessions) != 1 {
		t.Fatalf("%d Checkout Sessions", len(sessions))
	}
	cust := sessions[0].Form.Get("customer")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	payEvent(t, "evt_paidcancel_sub", "customer.subscription.created", t0, map[string]any{
		"id": "sub_stripepayer", "object": "subscription", "customer": cust, "status": "active",
		"metadata": map[string]string{"platform_user_id": "stripepayer", "platform_service_id": "echo", "platform_product_id": "pro"},
		"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_sp", "object": "subscription_item",
			"price": map[string]any{"id": "price_pro_usd", "object": "price"}, "current_period_end": t0.Add(30 * 24 * time.Hour).Unix()}}}})
	if s, ok := e.subscriptionTo("stripepayer", "echo"); !ok || s.Status != "ACTIVE" || s.ProductID != "pro" {
		t.Fatalf("after the webhook: %+v %v", s, ok)
	}

	resp, page := c.get("/portal/plans/echo")
	if resp.StatusCode != 200 || strings.Contains(page, "Cancel this subscription") || !strings.Contains(page, `id="billed-in-stripe"`) ||
		!strings.Contains(page, `href="/portal/billing"`) || strings.Contains(page, "/portal/plans/echo/change") {
		t.Errorf("plans page of a Stripe-billed plan: %d\n%s", resp.StatusCode, page)
	}

	audits := func() int {
		entries, _, err := e.store().ListAudit(context.Background(), "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, a := range entries {
			if a.Actor == "portal:stripepayer" {
				n++
			}
		}
		return n
	}
	before := audits()
	for _, f := range []struct{ action, product string }{{"change", "basic"}, {"cancel", ""}} {
		resp, body := c.plansFormFor("echo", f.action, f.product)
		if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "Manage payment method") || !strings.Contains(body, "Nothing was changed") {
			t.Errorf("%s of a Stripe-billed plan: %d\n%s", f.action, resp.StatusCode, body)
		}
		if s, ok := e.subscriptionTo("stripepayer", "echo"); !ok || s.Status != "ACTIVE" || s.ProductID != "pro" {
			t.Errorf("after the refused %s: %+v %v", f.action, s, ok)
		}
	}
	if _, ok, err := e.ops.PendingChange(context.Background(), "stripepayer", "echo"); ok || err != nil {
		t.Errorf("a change was scheduled: %v %v", ok, err)
	}
	if n := audits(); n != before {
		t.Errorf("refusals audited: %d entries by the caller, %d before", n, before)
	}
	if resp, body := c.get("/portal/plans/echo/cancel"); resp.StatusCode != http.StatusConflict ||
		strings.Contains(body, "Cancel my subscription") || !strings.Contains(body, "Manage payment method") {
		t.Errorf("cancel confirmation of a Stripe-billed plan: %d\n%s", resp.StatusCode, body)
	}
}
