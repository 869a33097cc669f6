package stripewebhook_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
)

// TestInvoiceRefundBeforePaidOfFailed: an invoice whose first charge
// failed (invoice.payment_failed: recorded open, nothing paid), whose
// retry's charge succeeded and was given back in part, a refund or a lost
// dispute, before its invoice.paid came, is counted net of that money
// once invoice.paid comes. The old gateway kept the refund per charge
// (10.00 USD of ch_pf) but summed it against the 0 then paid, so the
// record said refunded 0, and invoice.paid copied that 0: the Revenue
// page counted 29.00 USD received where 19.00 USD was, and no audit line
// said 10.00 USD went back. A lost dispute (of the whole 29.00 USD) was
// lost the same way.
func TestInvoiceRefundBeforePaidOfFailed(t *testing.T) {
	g := startGateway(t, "72h")
	cust := g.customer("u-pf")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	g.deliver(stripetest.Event("evt_pf1", "customer.subscription.created", t0,
		subObj("sub_pf", cust, "active", "price_pro", false, t0.Add(720*time.Hour))), 200)
	g.mock.Answer("/v1/subscriptions/sub_pf", map[string]any{"id": "sub_pf", "customer": cust, "status": "active",
		"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil})
	inv := func(id, status string, paid int64) map[string]any {
		o := map[string]any{"id": id, "object": "invoice", "customer": cust, "status": status,
			"amount_due": 2900, "amount_paid": paid, "amount_remaining": 2900 - paid, "currency": "usd",
			"parent": map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_pf"}}}
		if status == "paid" {
			o["status_transitions"] = map[string]any{"paid_at": t0.Unix()}
		}
		return o
	}
	paidBy := func(invID, pi string) {
		g.mock.Answer("/v1/invoice_payments", map[string]any{"has_more": false, "data": []any{map[string]any{
			"id": "inpay_" + invID, "object": "invoice_payment", "invoice": invID, "amount_paid": 2900, "currency": "usd", "status": "paid",
			"payment": map[string]any{"type": "payment_intent", "payment_intent": pi}}}})
	}
	record := func(id string) payments.InvoiceRecord {
		t.Helper()
		b, ok := g.record(payments.KindInvoice, id)
		var r payments.InvoiceRecord
		if !ok || json.Unmarshal(b, &r) != nil {
			t.Fatalf("invoice record %s: %s", id, b)
		}
		return r
	}

	// in_pf: the first charge fails, the retry's charge ch_pf (29.00 USD)
	// succeeds, 10.00 USD of it is refunded, and invoice.paid comes last.
	g.deliver(stripetest.Event("evt_pf2", "invoice.payment_failed", t0.Add(time.Second), inv("in_pf", "open", 0)), 200)
	paidBy("in_pf", "pi_pf")
	g.deliver(stripetest.Event("evt_pf3", "charge.refunded", t0.Add(3*time.Second), map[string]any{
		"id": "ch_pf", "object": "charge", "amount": 2900, "currency": "usd", "payment_intent": "pi_pf",
		"refunds": map[string]any{"object": "list", "has_more": false, "data": []any{map[string]any{
			"id": "re_pf", "object": "refund", "amount": 1000, "status": "succeeded", "charge": "ch_pf",
			"payment_intent": "pi_pf", "created": t0.Unix()}}}}), 200)
	if r := record("in_pf"); r.Status != "open" || r.RefundedBy["ch_pf"] != 1000 {
		t.Fatalf("in_pf after the refund, before invoice.paid: %+v, want open with 1000 refunded of ch_pf", r)
	}
	g.deliver(stripetest.Event("evt_pf4", "invoice.paid", t0.Add(2*time.Second), inv("in_pf", "paid", 2900)), 200)
	if r := record("in_pf"); r.Status != "paid" || r.AmountPaid != 2900 || r.Refunded != 1000 {
		t.Fatalf("in_pf after invoice.paid: status %s, paid %d, refunded %d; want paid 2900, refunded 1000", r.Status, r.AmountPaid, r.Refunded)
	}
	if got := g.console("/"); !strings.Contains(got, "Received: 19.00 USD.") {
		t.Fatalf("the console does not say Received: 19.00 USD.\n%s", got)
	}
	// invoice.paid again (a redelivery) changes nothing.
	g.deliver(stripetest.Event("evt_pf4", "invoice.paid", t0.Add(2*time.Second), inv("in_pf", "paid", 2900)), 200)
	if r := record("in_pf"); r.Refunded != 1000 {
		t.Fatalf("in_pf after invoice.paid again: refunded %d, want 1000", r.Refunded)
	}

	// in_pg: the same, its retry's charge disputed and the dispute lost.
	g.deliver(stripetest.Event("evt_pg2", "invoice.payment_failed", t0.Add(5*time.Second), inv("in_pg", "open", 0)), 200)
	paidBy("in_pg", "pi_pg")
	g.deliver(stripetest.Event("evt_pg3", "charge.dispute.closed", t0.Add(7*time.Second), map[string]any{"id": "dp_pg", "object": "dispute",
		"amount": 2900, "currency": "usd", "status": "lost", "payment_intent": "pi_pg", "charge": "ch_pg"}), 200)
	g.deliver(stripetest.Event("evt_pg4", "invoice.paid", t0.Add(6*time.Second), inv("in_pg", "paid", 2900)), 200)
	if r := record("in_pg"); r.Status != "paid" || r.Disputed != 2900 || r.Refunded != 0 {
		t.Fatalf("in_pg after invoice.paid: status %s, disputed %d, refunded %d; want paid, disputed 2900", r.Status, r.Disputed, r.Refunded)
	}
	if got := g.console("/"); !strings.Contains(got, "Received: 19.00 USD.") {
		t.Fatalf("after in_pg, the console does not say Received: 19.00 USD.\n%s", got)
	}
	if got := g.console("/revenue"); !strings.Contains(got, "USD 19.00") {
		t.Errorf("the Revenue page does not show USD 19.00 received:\n%s", got)
	}

	// The money back is audited once, with the invoice it went back of.
	entries, _, err := g.app.DataStore().ListAudit(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"in_pf": "10.00 USD of 29.00 USD paid went back", "in_pg": "29.00 USD of 29.00 USD paid went back"}
	for invID, w := range want {
		n := 0
		for _, e := range entries {
			if e.Action == payments.AuditInvoiceStripe && strings.Contains(e.Detail, "invoice "+invID+" ") && strings.Contains(e.Detail, w) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d audit lines of %s say %q, want 1", n, invID, w)
		}
	}
}
