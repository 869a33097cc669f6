package payments_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
)

// TestTopUpRefundOfAnotherGatewaysTopUpUnseen: two gateways on one
// Stripe account, each with a user "bob" subscribed to the same pack's
// product. The other gateway's bob bought a pack; this gateway never saw
// the paid session (its webhook endpoint was added after, or it was down
// past Stripe's retries), so it keeps no record of ignoring it. The
// refund, the refund's update and the lost dispute of that payment name
// a customer this gateway did not make: nothing to take back, 200
// ignored. Before the fix the metadata alone decided: this config could
// grant such a top-up, so each was answered 500 "before top-up was
// granted" for Stripe's three days of retries, after which Stripe
// disables the endpoint and every later payment event of this gateway
// is lost. A refund of this gateway's own top-up whose grant has not
// come yet is still 500 (Stripe sends it again after the grant).
func TestTopUpRefundOfAnotherGatewaysTopUpUnseen(t *testing.T) {
	e := startTopUps(t)
	e.payer("bob")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	meta := map[string]string{payments.MetaUser: "bob", payments.MetaService: "echo", payments.MetaProduct: "credits", payments.MetaPack: "small"}
	e.mock.Answer("/v1/payment_intents/pi_other_gw", map[string]any{"id": "pi_other_gw", "object": "payment_intent", "amount": 1000,
		"currency": "usd", "customer": "cus_of_the_other_gateway", "metadata": meta})
	ignored := func(evt, typ string, obj map[string]any) {
		t.Helper()
		status, body := e.deliver(evt, typ, at, obj)
		var got struct {
			Received bool
			Ignored  string
		}
		if status != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || !got.Received || !strings.Contains(got.Ignored, "nothing to take back") {
			t.Errorf("%s of another gateway's top-up: %d %s, want 200 ignored, nothing to take back", typ, status, body)
		}
	}
	refund := map[string]any{"id": "re_other_gw", "object": "refund", "amount": 1000, "status": "succeeded", "created": at.Unix(),
		"charge": "ch_other_gw", "payment_intent": "pi_other_gw"}
	ignored("evt_ogw_refund", "charge.refunded", map[string]any{"id": "ch_other_gw", "object": "charge", "amount": 1000,
		"amount_refunded": 1000, "currency": "usd", "payment_intent": "pi_other_gw", "customer": "cus_of_the_other_gateway",
		"metadata": meta, "refunds": map[string]any{"object": "list", "data": []any{refund}}})
	ignored("evt_ogw_refund_upd", "charge.refund.updated", refund)
	ignored("evt_ogw_dispute", "charge.dispute.closed", map[string]any{"id": "dp_other_gw", "object": "dispute", "amount": 1000,
		"currency": "usd", "status": "lost", "charge": "ch_other_gw", "payment_intent": "pi_other_gw"})
	e.wantBalance("bob", "0")
	if gs := e.grants("bob"); len(gs) != 0 {
		t.Errorf("grants: %+v", gs)
	}

	// Bob's own top-up, its refund come before its grant: 500, then
	// taken once the grant came.
	e.mock.Answer("/v1/payment_intents/pi_bob_own", map[string]any{"id": "pi_bob_own", "object": "payment_intent", "amount": 1000,
		"currency": "usd", "customer": "cus_bob", "metadata": meta})
	early := map[string]any{"id": "dp_bob_own", "object": "dispute", "amount": 1000, "currency": "usd", "status": "lost",
		"charge": "ch_bob_own", "payment_intent": "pi_bob_own"}
	if status, body := e.deliver("evt_bob_dispute", "charge.dispute.closed", at, early); status != http.StatusInternalServerError {
		t.Fatalf("lost dispute of bob's own top-up before its grant: %d %s, want 500", status, body)
	}
	earlyRefund := map[string]any{"id": "ch_bob_own", "object": "charge", "amount": 1000, "amount_refunded": 500, "currency": "usd",
		"payment_intent": "pi_bob_own", "customer": "cus_bob", "metadata": meta, "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_bob_own", "object": "refund", "amount": 500, "status": "succeeded", "created": at.Unix()}}}}
	if status, body := e.deliver("evt_bob_refund", "charge.refunded", at, earlyRefund); status != http.StatusInternalServerError {
		t.Fatalf("refund of bob's own top-up before its grant: %d %s, want 500", status, body)
	}
	e.mustDeliver("evt_bob_paid", "checkout.session.completed", at, paidSession("cs_bob_own", "pi_bob_own", "bob", "small", 1000))
	e.mustDeliver("evt_bob_refund", "charge.refunded", at, earlyRefund)
	e.wantBalance("bob", "50")
	e.mustDeliver("evt_bob_dispute", "charge.dispute.closed", at, early)
	e.wantBalance("bob", "0")
}
