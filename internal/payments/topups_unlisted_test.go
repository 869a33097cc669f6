package payments_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
)

// TestTopUpRefundUnlistedBeforeGrantNotGranted: a refund of a top-up the
// config could not grant when it came (its user had no subscription yet),
// whose charge does not carry its refunds (API versions since
// 2022-11-15), while Stripe cannot list them, is answered 500 and sent
// again. If the top-up's paid event is applied before that retry (the
// config can grant it by then) and Stripe still cannot list the
// payment's refunds, it is not granted either (500, sent again): money
// back is known to have come for this payment, and by how much is not.
// The old gateway kept nothing of the refund and granted the whole pack:
// 100 credits for 10.00 USD paid and 2.50 USD refunded, spendable until
// the refund's own retry took 25 back. Now 0 while Stripe is out of
// reach, and 75 once the paid event's retry can list the refund.
func TestTopUpRefundUnlistedBeforeGrantNotGranted(t *testing.T) {
	e := startTopUps(t)
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	meta := map[string]string{payments.MetaUser: "vera", payments.MetaService: "echo", payments.MetaProduct: "credits", payments.MetaPack: "small"}
	e.customer("vera")
	refunds := 0
	e.mock.Fail(func(r stripetest.Request) int {
		if strings.HasPrefix(r.Path, "/v1/refunds") {
			refunds++
			return http.StatusServiceUnavailable
		}
		return 0
	})
	// The charge names no refunds: they are listed from Stripe.
	charge := map[string]any{"id": "ch_v", "object": "charge", "amount": 1000, "amount_refunded": 250, "currency": "usd",
		"payment_intent": "pi_v", "customer": "cus_vera", "created": at.Unix(), "metadata": meta}
	if status, body := e.deliver("evt_v_refund", "charge.refunded", at.Add(time.Second), charge); status != http.StatusInternalServerError {
		t.Fatalf("refund of a top-up not granted, its refunds not listable: %d %s, want 500", status, body)
	}
	if refunds == 0 {
		t.Fatal("the refunds were not asked of Stripe")
	}
	e.caller("vera")
	// The paid event, Stripe still out of reach: nothing granted.
	status, body := e.deliver("evt_v_paid", "checkout.session.completed", at, paidSession("cs_v", "pi_v", "vera", "small", 1000))
	if got := e.balance("vera"); got != 0 || status != http.StatusInternalServerError {
		t.Fatalf("paid event while a refund seen before its grant cannot be listed: %d %s, balance %s; want 500 and 0 credits (the old gateway granted all 100)", status, body, got)
	}
	// Stripe back: the paid event's retry lists the refund and grants net.
	e.mock.Fail(nil)
	e.mock.Answer("/v1/refunds", map[string]any{"has_more": false, "data": []any{map[string]any{"id": "re_v", "object": "refund",
		"amount": 250, "status": "succeeded", "charge": "ch_v", "payment_intent": "pi_v", "created": at.Unix()}}})
	e.mustDeliver("evt_v_paid", "checkout.session.completed", at, paidSession("cs_v", "pi_v", "vera", "small", 1000))
	e.wantBalance("vera", "75")
	if rec := e.topUp("pi_v"); rec.Refunded != 250 {
		t.Errorf("top-up record: refunded %d, want 250", rec.Refunded)
	}
	if ig := e.ignored("pi_v"); len(ig.Unlisted) != 0 || ig.Refunded != 250 {
		t.Errorf("the record of money back before the grant: %+v, want the refund listed (250) and nothing unlisted", ig)
	}
	// The refund's retry, and the paid event's other delivery: nothing more.
	e.mustDeliver("evt_v_refund", "charge.refunded", at.Add(time.Second), charge)
	e.mustDeliver("evt_v_paid2", "checkout.session.completed", at, paidSession("cs_v", "pi_v", "vera", "small", 1000))
	e.wantBalance("vera", "75")
}
