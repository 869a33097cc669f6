package stripewebhook_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
)

// TestPreBasilEvents: a webhook endpoint made in the Dashboard sends its
// events in the account's default API version, which for older accounts
// is before 2025-03-31 ("basil"): a subscription's period end is its own
// current_period_end (not its items'), an invoice names its subscription
// as `subscription` and a line its Price as `price`. Read with basil's
// types alone, a cancellation at the period's end got no end date and an
// invoice named no subscription or configured Price (ignored, never
// recorded).
func TestPreBasilEvents(t *testing.T) {
	g := startGateway(t, "1h")
	cust := g.customer("u-old")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	periodEnd := t0.Add(720 * time.Hour)
	sub := map[string]any{"id": "sub_old", "object": "subscription", "customer": cust, "status": "active",
		"cancel_at_period_end": true, "current_period_end": periodEnd.Unix(), "metadata": map[string]string{},
		"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_old", "object": "subscription_item",
			"price": map[string]any{"id": "price_pro", "object": "price"}}}}}
	g.deliver(stripetest.Event("evt_old_1", "customer.subscription.updated", t0, sub), 200)
	s, _ := g.sub("u-old")
	if s.Status != "CANCELLING" || s.EndStatus != "CANCELLED" || !s.EndsAt.Equal(periodEnd) {
		t.Fatalf("a pre-basil subscription cancelling at its period's end: %s ends %s %s, want CANCELLING, CANCELLED at %s",
			s.Status, s.EndsAt, s.EndStatus, periodEnd)
	}

	// An invoice of a subscription the gateway has no record of yet:
	// found by its line's Price.
	g.mock.Answer("/v1/subscriptions/sub_old2", map[string]any{"id": "sub_old2", "customer": cust, "status": "active",
		"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil})
	inv := map[string]any{"id": "in_old", "object": "invoice", "customer": cust, "status": "paid",
		"amount_due": 2900, "amount_paid": 2900, "currency": "usd", "subscription": "sub_old2",
		"lines": map[string]any{"object": "list", "data": []any{map[string]any{"id": "il_old", "object": "line_item",
			"price": map[string]any{"id": "price_pro", "object": "price"}}}}}
	if body := g.deliver(stripetest.Event("evt_old_2", "invoice.paid", t0.Add(time.Second), inv), 200); strings.Contains(body, "ignored") {
		t.Fatalf("a pre-basil invoice was ignored: %s", body)
	}
	b, ok := g.record(payments.KindInvoice, "in_old")
	var ir payments.InvoiceRecord
	if !ok || json.Unmarshal(b, &ir) != nil || ir.ProductID != "pro" || ir.AmountPaid != 2900 || ir.UserID != "u-old" {
		t.Fatalf("pre-basil invoice record: %s (found %v)", b, ok)
	}
}
