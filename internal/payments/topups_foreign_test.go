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

// TestTopUpRefundOfOwnTopUpCustomerForms: the customer check of a refund
// or lost dispute that comes before its top-up's grant (ownTopUp) must
// never take this gateway's own top-up for another's, or the refund is
// answered 200 "nothing to take back" and the grant that comes after
// keeps the credits paid back. Each form the payment's customer can take
// in Stripe's events is tried: the charge's customer expanded to an
// object, a charge naming no customer (the PaymentIntent's is asked), a
// dispute and a refund naming none (the PaymentIntent's is asked), and
// the PaymentIntent's customer expanded. Each is 500 before the grant
// and takes its part back after it.
func TestTopUpRefundOfOwnTopUpCustomerForms(t *testing.T) {
	e := startTopUps(t)
	e.payer("ivy")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	meta := map[string]string{payments.MetaUser: "ivy", payments.MetaService: "echo", payments.MetaProduct: "credits", payments.MetaPack: "small"}
	e.mock.Answer("/v1/payment_intents/pi_ivy", map[string]any{"id": "pi_ivy", "object": "payment_intent", "amount": 1000,
		"currency": "usd", "customer": map[string]any{"id": "cus_ivy", "object": "customer"}, "metadata": meta})
	refunds := func(amount int64) map[string]any {
		return map[string]any{"object": "list", "data": []any{map[string]any{"id": "re_ivy", "object": "refund",
			"amount": amount, "status": "succeeded", "created": at.Unix()}}}
	}
	expanded := map[string]any{"id": "ch_ivy", "object": "charge", "amount": 1000, "amount_refunded": 300, "currency": "usd",
		"payment_intent": "pi_ivy", "customer": map[string]any{"id": "cus_ivy", "object": "customer"}, "metadata": meta,
		"refunds": refunds(300)}
	noCustomer := map[string]any{"id": "ch_ivy", "object": "charge", "amount": 1000, "amount_refunded": 500, "currency": "usd",
		"payment_intent": "pi_ivy", "metadata": map[string]string{}, "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_ivy", "object": "refund", "amount": 300, "status": "succeeded", "created": at.Unix()},
			map[string]any{"id": "re_ivy2", "object": "refund", "amount": 200, "status": "succeeded", "created": at.Unix() + 1}}}}
	refundUpd := map[string]any{"id": "re_ivy2", "object": "refund", "amount": 200, "status": "succeeded", "created": at.Unix(),
		"charge": "ch_ivy", "payment_intent": "pi_ivy"}
	dispute := map[string]any{"id": "dp_ivy", "object": "dispute", "amount": 1000, "currency": "usd", "status": "lost",
		"charge": "ch_ivy", "payment_intent": "pi_ivy"}
	early := []struct {
		evt, typ string
		obj      map[string]any
	}{
		{"evt_ivy_r1", "charge.refunded", expanded},
		{"evt_ivy_r2", "charge.refunded", noCustomer},
		{"evt_ivy_ru", "charge.refund.updated", refundUpd},
		{"evt_ivy_dp", "charge.dispute.closed", dispute},
	}
	for _, d := range early {
		if status, body := e.deliver(d.evt, d.typ, at, d.obj); status != http.StatusInternalServerError {
			t.Errorf("%s (%s) of ivy's own top-up before its grant: %d %s, want 500 (sent again after the grant)", d.typ, d.evt, status, body)
		}
	}
	e.mustDeliver("evt_ivy_paid", "checkout.session.completed", at, paidSession("cs_ivy", "pi_ivy", "ivy", "small", 1000))
	e.wantBalance("ivy", "100")
	e.mustDeliver("evt_ivy_r1", "charge.refunded", at, expanded)
	e.wantBalance("ivy", "70")
	e.mustDeliver("evt_ivy_r2", "charge.refunded", at, noCustomer)
	e.wantBalance("ivy", "50")
	e.mustDeliver("evt_ivy_dp", "charge.dispute.closed", at, dispute)
	e.wantBalance("ivy", "0")
}
