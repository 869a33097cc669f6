package stripewebhook_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
)

// TestInvoiceRefundRecorded: money Stripe gave back of a paid invoice (a
// refund made in the Dashboard, a credit note) is kept on the invoice's
// record, so the Revenue page does not count it as received: each
// succeeded refund once, pending ones not, whether the charge names its
// invoice (API versions before 2025-03-31) or Stripe is asked which
// invoice its PaymentIntent paid.
func TestInvoiceRefundRecorded(t *testing.T) {
	g := startGateway(t, "72h")
	cust := g.customer("u-ref")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	g.deliver(stripetest.Event("evt_r1", "customer.subscription.created", t0,
		subObj("sub_r", cust, "active", "price_pro", false, t0.Add(720*time.Hour))), 200)
	g.mock.Answer("/v1/subscriptions/sub_r", map[string]any{"id": "sub_r", "customer": cust, "status": "active",
		"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil})
	inv := func(id string) map[string]any {
		return map[string]any{"id": id, "object": "invoice", "customer": cust, "status": "paid",
			"amount_due": 2900, "amount_paid": 2900, "currency": "usd",
			"status_transitions": map[string]any{"paid_at": t0.Unix()},
			"parent":             map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_r"}}}
	}
	g.deliver(stripetest.Event("evt_r2", "invoice.paid", t0.Add(time.Second), inv("in_r")), 200)
	refunded := func(id string) int64 {
		t.Helper()
		b, ok := g.record(payments.KindInvoice, id)
		var r map[string]any
		if !ok || json.Unmarshal(b, &r) != nil {
			t.Fatalf("invoice record %s: %s", id, b)
		}
		n, _ := r["refunded"].(float64)
		return int64(n)
	}
	refund := func(id string, amount int64, status string) map[string]any {
		return map[string]any{"id": id, "object": "refund", "amount": amount, "status": status, "charge": "ch_r",
			"payment_intent": "pi_r", "created": t0.Unix()}
	}
	// Stripe knows which invoice pi_r paid.
	g.mock.Answer("/v1/invoice_payments", map[string]any{"has_more": false, "data": []any{map[string]any{
		"id": "inpay_r", "object": "invoice_payment", "invoice": "in_r", "amount_paid": 2900, "currency": "usd", "status": "paid",
		"payment": map[string]any{"type": "payment_intent", "payment_intent": "pi_r"}}}})
	charge := func(refunds ...any) map[string]any {
		return map[string]any{"id": "ch_r", "object": "charge", "amount": 2900, "currency": "usd", "payment_intent": "pi_r",
			"refunds": map[string]any{"object": "list", "has_more": false, "data": refunds}}
	}
	g.deliver(stripetest.Event("evt_r3", "charge.refunded", t0.Add(2*time.Second),
		charge(refund("re_1", 1000, "succeeded"), refund("re_2", 500, "pending"))), 200)
	if got := refunded("in_r"); got != 1000 {
		t.Fatalf("after a refund of 10.00 USD (and one pending): refunded %d, want 1000", got)
	}
	// The same event again takes nothing more.
	g.deliver(stripetest.Event("evt_r3", "charge.refunded", t0.Add(2*time.Second),
		charge(refund("re_1", 1000, "succeeded"), refund("re_2", 500, "pending"))), 200)
	if got := refunded("in_r"); got != 1000 {
		t.Fatalf("the same event twice: refunded %d, want 1000", got)
	}
	// The pending refund succeeds.
	g.mock.Answer("/v1/refunds", map[string]any{"has_more": false, "data": []any{refund("re_1", 1000, "succeeded"), refund("re_2", 500, "succeeded")}})
	g.deliver(stripetest.Event("evt_r4", "charge.refund.updated", t0.Add(3*time.Second), refund("re_2", 500, "succeeded")), 200)
	if got := refunded("in_r"); got != 1500 {
		t.Fatalf("after the pending refund succeeded: refunded %d, want 1500", got)
	}
	// An older API version's charge names its invoice.
	g.deliver(stripetest.Event("evt_r5", "invoice.paid", t0.Add(4*time.Second), inv("in_old")), 200)
	g.mock.Answer("/v1/invoice_payments", nil)
	old := map[string]any{"id": "ch_old", "object": "charge", "amount": 2900, "currency": "usd", "payment_intent": "pi_old",
		"invoice": "in_old", "refunds": map[string]any{"object": "list", "has_more": false, "data": []any{
			map[string]any{"id": "re_old", "object": "refund", "amount": 2900, "status": "succeeded", "charge": "ch_old", "created": t0.Unix()}}}}
	g.deliver(stripetest.Event("evt_r6", "charge.refunded", t0.Add(5*time.Second), old), 200)
	if got := refunded("in_old"); got != 2900 {
		t.Fatalf("a charge naming its invoice refunded in full: refunded %d, want 2900", got)
	}
	// A dispute lost on an invoice's charge: its amount went back.
	g.deliver(stripetest.Event("evt_r7", "invoice.paid", t0.Add(6*time.Second), inv("in_d")), 200)
	g.mock.Answer("/v1/invoice_payments", map[string]any{"has_more": false, "data": []any{map[string]any{
		"id": "inpay_d", "object": "invoice_payment", "invoice": "in_d", "amount_paid": 2900, "currency": "usd", "status": "paid",
		"payment": map[string]any{"type": "payment_intent", "payment_intent": "pi_d"}}}})
	g.deliver(stripetest.Event("evt_r8", "charge.dispute.closed", t0.Add(7*time.Second), map[string]any{"id": "dp_d", "object": "dispute",
		"amount": 2900, "currency": "usd", "status": "lost", "payment_intent": "pi_d", "charge": "ch_d"}), 200)
	b, _ := g.record(payments.KindInvoice, "in_d")
	var d payments.InvoiceRecord
	if json.Unmarshal(b, &d) != nil || d.Disputed != 2900 || d.Refunded != 0 || d.Status != "paid" {
		t.Fatalf("after a lost dispute: %s, want disputed 2900", b)
	}
}

// TestInvoiceRefundBeforeInvoice: Stripe sends events in no set order,
// so a refund (or a lost dispute) of an invoice's charge can come before
// the invoice's own invoice.paid. The money it gave back is not lost: the
// Revenue page counts the invoice net of it once invoice.paid has come,
// and the same refund sent again, or named again by a later event of
// its charge, never counts twice. The old gateway found no invoice
// record to keep the refund on and dropped it: the page counted the
// invoice in full.
func TestInvoiceRefundBeforeInvoice(t *testing.T) {
	g := startGateway(t, "72h")
	cust := g.customer("u-early")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	g.deliver(stripetest.Event("evt_e1", "customer.subscription.created", t0,
		subObj("sub_e", cust, "active", "price_pro", false, t0.Add(720*time.Hour))), 200)
	g.mock.Answer("/v1/subscriptions/sub_e", map[string]any{"id": "sub_e", "customer": cust, "status": "active",
		"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil})
	inv := func(id string) map[string]any {
		return map[string]any{"id": id, "object": "invoice", "customer": cust, "status": "paid",
			"amount_due": 2900, "amount_paid": 2900, "amount_remaining": 0, "currency": "usd",
			"status_transitions": map[string]any{"paid_at": t0.Unix()},
			"parent":             map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_e"}}}
	}
	paidBy := func(invID, pi string) {
		g.mock.Answer("/v1/invoice_payments", map[string]any{"has_more": false, "data": []any{map[string]any{
			"id": "inpay_" + invID, "object": "invoice_payment", "invoice": invID, "amount_paid": 2900, "currency": "usd", "status": "paid",
			"payment": map[string]any{"type": "payment_intent", "payment_intent": pi}}}})
		// Stripe has the invoice, whatever the gateway was told of it yet.
		g.mock.Answer("/v1/invoices/"+invID, inv(invID))
	}
	refund := func(id string, amount int64) map[string]any {
		return map[string]any{"id": id, "object": "refund", "amount": amount, "status": "succeeded", "charge": "ch_e",
			"payment_intent": "pi_e", "created": t0.Unix()}
	}
	charge := func(refunds ...any) map[string]any {
		return map[string]any{"id": "ch_e", "object": "charge", "amount": 2900, "currency": "usd", "payment_intent": "pi_e",
			"refunds": map[string]any{"object": "list", "has_more": false, "data": refunds}}
	}
	received := func(want string) {
		t.Helper()
		if got := g.console("/"); !strings.Contains(got, "Received: "+want+".") {
			t.Fatalf("the console does not say Received: %s.\n%s", want, got)
		}
	}

	// 10.00 USD of in_e refunded: the refund's event comes first.
	paidBy("in_e", "pi_e")
	g.deliver(stripetest.Event("evt_e2", "charge.refunded", t0.Add(2*time.Second), charge(refund("re_e1", 1000))), 200)
	g.deliver(stripetest.Event("evt_e3", "invoice.paid", t0.Add(time.Second), inv("in_e")), 200)
	received("19.00 USD")
	b, _ := g.record(payments.KindInvoice, "in_e")
	var r payments.InvoiceRecord
	if json.Unmarshal(b, &r) != nil || r.Status != "paid" || r.AmountPaid != 2900 || r.Refunded != 1000 {
		t.Fatalf("invoice in_e after its refund's event came first: %s, want paid 2900, refunded 1000", b)
	}
	// The same refund again: the same event, and a charge.refund.updated
	// naming it.
	g.deliver(stripetest.Event("evt_e2", "charge.refunded", t0.Add(2*time.Second), charge(refund("re_e1", 1000))), 200)
	g.mock.Answer("/v1/refunds", map[string]any{"has_more": false, "data": []any{refund("re_e1", 1000)}})
	g.deliver(stripetest.Event("evt_e4", "charge.refund.updated", t0.Add(3*time.Second), refund("re_e1", 1000)), 200)
	received("19.00 USD")
	// A later charge.refunded carries every refund so far.
	g.deliver(stripetest.Event("evt_e5", "charge.refunded", t0.Add(4*time.Second),
		charge(refund("re_e1", 1000), refund("re_e2", 500))), 200)
	received("14.00 USD")

	// A dispute of in_f lost before its invoice.paid came: nothing of
	// in_f was received.
	paidBy("in_f", "pi_f")
	g.deliver(stripetest.Event("evt_f1", "charge.dispute.closed", t0.Add(5*time.Second), map[string]any{"id": "dp_f", "object": "dispute",
		"amount": 2900, "currency": "usd", "status": "lost", "payment_intent": "pi_f", "charge": "ch_f"}), 200)
	g.deliver(stripetest.Event("evt_f2", "invoice.paid", t0.Add(time.Second), inv("in_f")), 200)
	b, _ = g.record(payments.KindInvoice, "in_f")
	if json.Unmarshal(b, &r) != nil || r.Status != "paid" || r.Disputed != 2900 {
		t.Fatalf("invoice in_f after its lost dispute's event came first: %s, want disputed 2900", b)
	}
	received("14.00 USD")
	if got := g.console("/revenue"); !strings.Contains(got, "USD 14.00") {
		t.Errorf("the Revenue page does not show USD 14.00 received:\n%s", got)
	}
}

// TestInvoiceAndRefundAtOnce: an invoice's invoice.paid and its charge's
// charge.refunded handled at the same moment (Stripe sends both at once)
// keep both, whichever writes first: the invoice paid, the refund on it.
func TestInvoiceAndRefundAtOnce(t *testing.T) {
	g := startGateway(t, "72h")
	cust := g.customer("u-once")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	g.deliver(stripetest.Event("evt_o1", "customer.subscription.created", t0,
		subObj("sub_o", cust, "active", "price_pro", false, t0.Add(720*time.Hour))), 200)
	g.mock.Answer("/v1/subscriptions/sub_o", map[string]any{"id": "sub_o", "customer": cust, "status": "active",
		"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil})
	const n = 12
	for i := range n {
		id := fmt.Sprintf("in_o%d", i)
		inv := map[string]any{"id": id, "object": "invoice", "customer": cust, "status": "paid",
			"amount_due": 2900, "amount_paid": 2900, "amount_remaining": 0, "currency": "usd",
			"status_transitions": map[string]any{"paid_at": t0.Unix()},
			"parent":             map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_o"}}}
		g.mock.Answer("/v1/invoices/"+id, inv)
		// A charge of an API version before 2025-03-31 names its invoice.
		ch := map[string]any{"id": "ch_o" + id, "object": "charge", "amount": 2900, "currency": "usd", "payment_intent": "pi_o" + id,
			"invoice": id, "refunds": map[string]any{"object": "list", "has_more": false, "data": []any{map[string]any{
				"id": "re_o" + id, "object": "refund", "amount": 700, "status": "succeeded", "charge": "ch_o" + id, "created": t0.Unix()}}}}
		var wg sync.WaitGroup
		for _, ev := range [][]byte{
			stripetest.Event("evt_oi"+id, "invoice.paid", t0.Add(time.Second), inv),
			stripetest.Event("evt_or"+id, "charge.refunded", t0.Add(2*time.Second), ch),
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if status, body := stripetest.Deliver(t, endpoint, ev, whsec, time.Now()); status != 200 {
					t.Errorf("%s: %d %s", id, status, body)
				}
			}()
		}
		wg.Wait()
		b, _ := g.record(payments.KindInvoice, id)
		var r payments.InvoiceRecord
		if json.Unmarshal(b, &r) != nil || r.Status != "paid" || r.AmountPaid != 2900 || r.Refunded != 700 {
			t.Errorf("invoice %s after its invoice.paid and refund at once: %s, want paid 2900, refunded 700", id, b)
		}
	}
	if got := g.console("/"); !strings.Contains(got, fmt.Sprintf("Received: %d.00 USD.", n*22)) {
		t.Errorf("the console does not say Received: %d.00 USD.\n%s", n*22, got)
	}
}
