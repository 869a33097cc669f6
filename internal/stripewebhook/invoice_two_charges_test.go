package stripewebhook_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
)

// TestInvoiceTwoChargesRefundsSum: an invoice paid by two charges (two
// payments of one invoice, Stripe's partial payments) whose charges are
// each refunded in part keeps the sum of both charges' refunds, and a
// charge's refunds delivered again count once. The old gateway kept the
// larger of the two charges' sums: 29.00 USD paid as 15.00 + 14.00, 10.00
// refunded of the first and 4.00 of the second, recorded 10.00 back, not
// 14.00, and the Revenue page counted 19.00 received instead of 15.00.
func TestInvoiceTwoChargesRefundsSum(t *testing.T) {
	g := startGateway(t, "72h")
	cust := g.customer("u-two")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	g.deliver(stripetest.Event("evt_t1", "customer.subscription.created", t0,
		subObj("sub_t", cust, "active", "price_pro", false, t0.Add(720*time.Hour))), 200)
	g.mock.Answer("/v1/subscriptions/sub_t", map[string]any{"id": "sub_t", "customer": cust, "status": "active",
		"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil})
	g.deliver(stripetest.Event("evt_t2", "invoice.paid", t0.Add(time.Second), map[string]any{"id": "in_two", "object": "invoice",
		"customer": cust, "status": "paid", "amount_due": 2900, "amount_paid": 2900, "currency": "usd",
		"status_transitions": map[string]any{"paid_at": t0.Unix()},
		"parent":             map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_t"}}}), 200)
	// Both PaymentIntents paid in_two.
	g.mock.Answer("/v1/invoice_payments", map[string]any{"has_more": false, "data": []any{map[string]any{
		"id": "inpay_two", "object": "invoice_payment", "invoice": "in_two", "amount_paid": 1500, "currency": "usd", "status": "paid",
		"payment": map[string]any{"type": "payment_intent", "payment_intent": "pi_ta"}}}})
	charge := func(id, pi string, amount int64, refunds ...any) map[string]any {
		return map[string]any{"id": id, "object": "charge", "amount": amount, "currency": "usd", "payment_intent": pi,
			"refunds": map[string]any{"object": "list", "has_more": false, "data": refunds}}
	}
	refund := func(id, ch, pi string, amount int64) map[string]any {
		return map[string]any{"id": id, "object": "refund", "amount": amount, "status": "succeeded", "charge": ch,
			"payment_intent": pi, "created": t0.Unix()}
	}
	back := func() payments.InvoiceRecord {
		t.Helper()
		b, ok := g.record(payments.KindInvoice, "in_two")
		var r payments.InvoiceRecord
		if !ok || json.Unmarshal(b, &r) != nil {
			t.Fatalf("invoice record in_two: %s", b)
		}
		return r
	}
	g.deliver(stripetest.Event("evt_t3", "charge.refunded", t0.Add(2*time.Second),
		charge("ch_ta", "pi_ta", 1500, refund("re_ta", "ch_ta", "pi_ta", 1000))), 200)
	g.deliver(stripetest.Event("evt_t4", "charge.refunded", t0.Add(3*time.Second),
		charge("ch_tb", "pi_tb", 1400, refund("re_tb", "ch_tb", "pi_tb", 400))), 200)
	if r := back(); r.Refunded != 1400 {
		t.Fatalf("10.00 USD refunded of one charge and 4.00 USD of the other: refunded %d, want 1400 (the sum)", r.Refunded)
	}
	// Each charge's refunds again (a redelivery, a later event of the
	// charge naming them all): nothing more.
	g.deliver(stripetest.Event("evt_t3b", "charge.refunded", t0.Add(4*time.Second),
		charge("ch_ta", "pi_ta", 1500, refund("re_ta", "ch_ta", "pi_ta", 1000))), 200)
	g.deliver(stripetest.Event("evt_t4", "charge.refunded", t0.Add(3*time.Second),
		charge("ch_tb", "pi_tb", 1400, refund("re_tb", "ch_tb", "pi_tb", 400))), 200)
	if r := back(); r.Refunded != 1400 {
		t.Fatalf("the refunds delivered again: refunded %d, want 1400", r.Refunded)
	}
	// A second refund of the second charge: its charge's sum grows.
	g.deliver(stripetest.Event("evt_t5", "charge.refunded", t0.Add(5*time.Second),
		charge("ch_tb", "pi_tb", 1400, refund("re_tb", "ch_tb", "pi_tb", 400), refund("re_tb2", "ch_tb", "pi_tb", 100))), 200)
	if r := back(); r.Refunded != 1500 {
		t.Fatalf("another 1.00 USD of the second charge: refunded %d, want 1500", r.Refunded)
	}
	// Two lost disputes, one of each charge, are summed too.
	for i, d := range []struct {
		id, ch, pi string
		amount     int64
	}{{"dp_ta", "ch_ta", "pi_ta", 500}, {"dp_tb", "ch_tb", "pi_tb", 900}} {
		g.deliver(stripetest.Event("evt_t6"+d.id, "charge.dispute.closed", t0.Add(time.Duration(6+i)*time.Second), map[string]any{
			"id": d.id, "object": "dispute", "amount": d.amount, "currency": "usd", "status": "lost", "payment_intent": d.pi, "charge": d.ch}), 200)
	}
	if r := back(); r.Disputed != 1400 {
		t.Fatalf("two lost disputes of 5.00 USD and 9.00 USD: disputed %d, want 1400", r.Disputed)
	}
}
