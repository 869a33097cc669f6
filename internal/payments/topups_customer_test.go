package payments_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
)

// TestTopUpOnlyForItsUsersCustomer: a paid top-up session is granted
// only when its customer is the one the gateway made for the user its
// metadata names (and its client_reference_id, when set, is that user).
// A session of another gateway on the same Stripe account (a customer
// this one never made, its user of the same id here) or one naming
// another user than its customer's is ignored as docs/payments.md says:
// 200 "ignored", nothing granted, remembered so that its refund is
// ignored too rather than answered 500 for days. Before the fix each of
// them granted the pack: credits without payment.
func TestTopUpOnlyForItsUsersCustomer(t *testing.T) {
	e := startTopUps(t)
	e.payer("bob")
	e.payer("carol")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	ignored := func(evt, typ string, sess map[string]any, reason string) {
		t.Helper()
		status, body := e.deliver(evt, typ, at, sess)
		var got struct {
			Received bool
			Ignored  string
		}
		if status != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || !got.Received || !strings.Contains(got.Ignored, reason) {
			t.Errorf("%s: %d %s, want 200 ignored (%s)", evt, status, body, reason)
		}
	}
	foreign := paidSession("cs_f", "pi_f", "bob", "small", 1000)
	foreign["customer"] = "cus_made_by_another_gateway"
	ignored("evt_foreign", "checkout.session.completed", foreign, "not one the gateway made")
	ignored("evt_foreign_async", "checkout.session.async_payment_succeeded", foreign, "not one the gateway made")
	others := paidSession("cs_o", "pi_o", "bob", "small", 1000)
	others["customer"] = "cus_carol"
	ignored("evt_others", "checkout.session.completed", others, "another user than its customer's")
	ref := paidSession("cs_r", "pi_r", "bob", "small", 1000)
	ref["client_reference_id"] = "carol"
	ignored("evt_ref", "checkout.session.completed", ref, "another user than its customer's")
	noCustomer := paidSession("cs_n", "pi_n", "bob", "small", 1000)
	delete(noCustomer, "customer")
	ignored("evt_nocust", "checkout.session.completed", noCustomer, "names no customer")
	failed := paidSession("cs_ff", "pi_ff", "bob", "small", 1000)
	failed["customer"], failed["payment_status"] = "cus_made_by_another_gateway", "unpaid"
	ignored("evt_failed", "checkout.session.async_payment_failed", failed, "not one the gateway made")

	e.wantBalance("bob", "0")
	e.wantBalance("carol", "0")
	if gs := e.grants("bob"); len(gs) != 0 {
		t.Errorf("grants of sessions bob's customer did not pay: %+v", gs)
	}
	for _, a := range e.audit("bob") {
		if a.Action == "topup.failed" || a.Action == "credits.grant" {
			t.Errorf("audited %s %q for a session that is not bob's", a.Action, a.Detail)
		}
	}
	// The refund of another gateway's top-up: nothing to take back, 200.
	refund := map[string]any{"id": "ch_f", "object": "charge", "amount": 1000, "amount_refunded": 1000, "currency": "usd",
		"payment_intent": "pi_f", "metadata": foreign["metadata"], "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_f", "object": "refund", "amount": 1000, "status": "succeeded", "created": at.Unix()}}}}
	if status, body := e.deliver("evt_foreign_refund", "charge.refunded", at, refund); status != http.StatusOK || !strings.Contains(body, "ignored when it was paid") {
		t.Errorf("refund of another gateway's top-up: %d %s, want 200 ignored", status, body)
	}
	e.wantBalance("bob", "0")
	if _, err := e.pay.GetPaymentRecord(t.Context(), payments.KindTopUp, "pi_f"); err == nil {
		t.Error("a top-up record for another gateway's session")
	}
	// Remembered as another gateway's (or no customer's) money, which the
	// Revenue page neither counts nor lists; a session this gateway's
	// customer paid, though for another user, is its money.
	for pi, want := range map[string]bool{"pi_f": true, "pi_n": true, "pi_o": false, "pi_r": false} {
		b, err := e.pay.GetPaymentRecord(t.Context(), payments.KindTopUpIgnored, pi)
		var ig payments.IgnoredTopUp
		if err != nil || json.Unmarshal(b, &ig) != nil {
			t.Errorf("ignored record of %s: %v %s", pi, err, b)
			continue
		}
		if ig.Foreign != want {
			t.Errorf("ignored record of %s: foreign %v, want %v (%s)", pi, ig.Foreign, want, b)
		}
	}

	// Bob's own customer, his own metadata and reference: granted.
	own := paidSession("cs_b", "pi_b", "bob", "small", 1000)
	own["client_reference_id"] = "bob"
	e.mustDeliver("evt_own", "checkout.session.completed", at, own)
	e.wantBalance("bob", "100")
}
