package stripewebhook_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
)

// TestInvoiceVoidedOrWrittenOff: an invoice whose payment failed and
// that the operator then voided in Stripe (invoice.voided), or marked
// uncollectible (invoice.marked_uncollectible), is recorded so: the
// portal's Billing page says "Cancelled, nothing to pay" or "Unpaid,
// written off" rather than "Payment failed", and the console's Revenue
// page does not take a voided invoice for one that bills its period's
// usage. A late delivery of the older invoice.payment_failed leaves it
// voided (void and paid are final in Stripe; uncollectible can still be
// paid). The old gateway answered both events "ignored": the invoice
// stayed open with its payment failed for good.
func TestInvoiceVoidedOrWrittenOff(t *testing.T) {
	g := startGateway(t, "72h")
	cust := g.customer("u-void")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	g.deliver(stripetest.Event("evt_v1", "customer.subscription.created", t0,
		subObj("sub_v", cust, "active", "price_pro", false, t0.Add(720*time.Hour))), 200)
	g.mock.Answer("/v1/subscriptions/sub_v", map[string]any{"id": "sub_v", "customer": cust, "status": "active",
		"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil})
	inv := func(id, status string, paid int64) map[string]any {
		return map[string]any{"id": id, "object": "invoice", "customer": cust, "status": status,
			"amount_due": 2900, "amount_paid": paid, "currency": "usd",
			"parent": map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_v"}}}
	}
	status := func(id string) string {
		t.Helper()
		b, ok := g.record(payments.KindInvoice, id)
		var r payments.InvoiceRecord
		if !ok || json.Unmarshal(b, &r) != nil {
			t.Fatalf("invoice record %s: %s", id, b)
		}
		return r.Status
	}
	failed := stripetest.Event("evt_v2", "invoice.payment_failed", t0.Add(time.Second), inv("in_v", "open", 0))
	g.deliver(failed, 200)
	if got := status("in_v"); got != "open" {
		t.Fatalf("after its payment failed: %s, want open", got)
	}
	g.deliver(stripetest.Event("evt_v3", "invoice.voided", t0.Add(2*time.Second), inv("in_v", "void", 0)), 200)
	if got := status("in_v"); got != "void" {
		t.Fatalf("after invoice.voided: %s, want void", got)
	}
	// The failure's event delivered again, late (Stripe retries it): the
	// invoice stays voided.
	g.deliver(stripetest.Event("evt_v2_retry", "invoice.payment_failed", t0.Add(time.Second), inv("in_v", "open", 0)), 200)
	if got := status("in_v"); got != "void" {
		t.Fatalf("a late payment_failed after the void: %s, want void", got)
	}

	g.deliver(stripetest.Event("evt_u1", "invoice.payment_failed", t0.Add(3*time.Second), inv("in_u", "open", 0)), 200)
	g.deliver(stripetest.Event("evt_u2", "invoice.marked_uncollectible", t0.Add(4*time.Second), inv("in_u", "uncollectible", 0)), 200)
	if got := status("in_u"); got != "uncollectible" {
		t.Fatalf("after invoice.marked_uncollectible: %s, want uncollectible", got)
	}
	g.deliver(stripetest.Event("evt_u1_retry", "invoice.payment_failed", t0.Add(3*time.Second), inv("in_u", "open", 0)), 200)
	if got := status("in_u"); got != "uncollectible" {
		t.Fatalf("a late payment_failed after it was written off: %s, want uncollectible", got)
	}
	// Written off, then paid after all (the customer paid the hosted
	// invoice): paid.
	g.deliver(stripetest.Event("evt_u3", "invoice.paid", t0.Add(5*time.Second), inv("in_u", "paid", 2900)), 200)
	if got := status("in_u"); got != "paid" {
		t.Fatalf("written off, then paid: %s, want paid", got)
	}
}
