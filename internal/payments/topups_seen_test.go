package payments_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
)

// TestTopUpMoneyBackBeforeItsGrantIsTaken: a refund (or a lost dispute)
// of a top-up the config could not grant when it came (here: its user had
// no subscription yet; a pack missing from the config at that moment is
// the same path) is answered 200 ignored; when the top-up's paid event is
// applied later (Stripe's retry, a resend from the Dashboard), once the
// config can grant it, the grant takes the refund back at once, as the
// refund's own event would have. The old gateway granted the whole pack
// of a payment refunded: 100 credits for 10.00 USD paid and 2.50 USD
// refunded (want 75), and 100 for one lost in a dispute (want 0).
func TestTopUpMoneyBackBeforeItsGrantIsTaken(t *testing.T) {
	e := startTopUps(t)
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	meta := func(user string) map[string]string {
		return map[string]string{payments.MetaUser: user, payments.MetaService: "echo", payments.MetaProduct: "credits", payments.MetaPack: "small"}
	}
	e.customer("walt")
	refund := map[string]any{"id": "ch_w", "object": "charge", "amount": 1000, "amount_refunded": 250, "currency": "usd",
		"payment_intent": "pi_w", "customer": "cus_walt", "created": at.Unix(), "metadata": meta("walt"),
		"refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_w", "object": "refund", "amount": 250, "status": "succeeded", "created": at.Unix()}}}}
	if status, body := e.deliver("evt_w_refund", "charge.refunded", at.Add(time.Second), refund); status != http.StatusOK || !strings.Contains(body, "never granted and cannot be") {
		t.Fatalf("refund of a top-up its config cannot grant: %d %s, want 200 ignored", status, body)
	}
	// The Revenue page's record of it: paid, not granted, 2.50 USD back.
	if ig := e.ignored("pi_w"); ig.Amount != 1000 || ig.Currency != "USD" || ig.UserID != "walt" || ig.Pack != "small" || ig.Refunded != 250 {
		t.Errorf("ignored top-up record after its refund: %+v, want 1000 USD paid by walt for pack small, 250 refunded", ig)
	}
	e.caller("walt")
	e.mustDeliver("evt_w_paid", "checkout.session.completed", at, paidSession("cs_w", "pi_w", "walt", "small", 1000))
	e.wantBalance("walt", "75")
	if rec := e.topUp("pi_w"); rec.Refunded != 250 {
		t.Errorf("top-up record: refunded %d, want 250", rec.Refunded)
	}
	// The refund told again by its charge's next event, and the paid
	// event by its other delivery: nothing more.
	e.mustDeliver("evt_w_refund2", "charge.refunded", at.Add(2*time.Second), refund)
	e.mustDeliver("evt_w_paid2", "checkout.session.completed", at, paidSession("cs_w", "pi_w", "walt", "small", 1000))
	e.wantBalance("walt", "75")

	// A lost dispute before the grant takes the whole pack back then.
	e.customer("wren")
	// The dispute names no customer: the PaymentIntent's is asked.
	e.mock.Answer("/v1/payment_intents/pi_wr", map[string]any{"id": "pi_wr", "object": "payment_intent", "amount": 1000, "currency": "usd",
		"customer": "cus_wren", "metadata": meta("wren")})
	if status, body := e.deliver("evt_wr_dispute", "charge.dispute.closed", at.Add(time.Second), map[string]any{"id": "dp_wr", "object": "dispute",
		"amount": 1000, "currency": "usd", "status": "lost", "payment_intent": "pi_wr", "charge": "ch_wr", "metadata": meta("wren")}); status != http.StatusOK || !strings.Contains(body, "never granted and cannot be") {
		t.Fatalf("lost dispute of a top-up its config cannot grant: %d %s, want 200 ignored", status, body)
	}
	e.caller("wren")
	e.mustDeliver("evt_wr_paid", "checkout.session.completed", at, paidSession("cs_wr", "pi_wr", "wren", "small", 1000))
	e.wantBalance("wren", "0")
	if rec := e.topUp("pi_wr"); rec.Disputed != 1000 {
		t.Errorf("top-up record: disputed %d, want 1000", rec.Disputed)
	}

	// Another gateway's top-up on the same Stripe account (its customer
	// none of this one's): ignored, and not kept as this one's.
	other := map[string]any{"id": "ch_o", "object": "charge", "amount": 1000, "amount_refunded": 1000, "currency": "usd",
		"payment_intent": "pi_o", "customer": "cus_stranger", "metadata": meta("walt"),
		"refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_o", "object": "refund", "amount": 1000, "status": "succeeded", "created": at.Unix()}}}}
	other["metadata"].(map[string]string)[payments.MetaPack] = "retired"
	if status, body := e.deliver("evt_o_refund", "charge.refunded", at, other); status != http.StatusOK || !strings.Contains(body, "never granted and cannot be") {
		t.Fatalf("refund of another gateway's top-up: %d %s, want 200 ignored", status, body)
	}
	if _, err := e.pay.GetPaymentRecord(context.Background(), payments.KindTopUpIgnored, "pi_o"); err == nil {
		t.Errorf("another gateway's top-up is kept as this one's, paid and not granted")
	}
}

// TestTopUpIgnoredKeepsWhatWasPaid: a paid top-up the gateway ignored
// (a pack the config does not have) is kept with who paid what and when,
// and what its refunds gave back, for the Revenue page to list as paid
// and not granted. The old record kept only the PaymentIntent, the
// session and the reason: the page could not show the 10.00 USD paid.
func TestTopUpIgnoredKeepsWhatWasPaid(t *testing.T) {
	e := startTopUps(t)
	e.payer("xena")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	status, body := e.deliver("evt_x_paid", "checkout.session.completed", at, paidSession("cs_x", "pi_x", "xena", "retired", 1000))
	if status != http.StatusOK || !strings.Contains(body, "ignored") {
		t.Fatalf("paid session of a pack the config does not have: %d %s, want 200 ignored", status, body)
	}
	ig := e.ignored("pi_x")
	if ig.Amount != 1000 || ig.Currency != "USD" || ig.UserID != "xena" || ig.ServiceID != "echo" || ig.ProductID != "credits" ||
		ig.Pack != "retired" || ig.SessionID != "cs_x" || !ig.PaidAt.Equal(at) || ig.Reason == "" {
		t.Fatalf("ignored top-up record %+v, want 1000 USD paid by xena for pack retired at %s", ig, at)
	}
	refund := map[string]any{"id": "ch_x", "object": "charge", "amount": 1000, "amount_refunded": 400, "currency": "usd",
		"payment_intent": "pi_x", "customer": "cus_xena", "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_x", "object": "refund", "amount": 400, "status": "succeeded", "created": at.Unix()}}}}
	for _, id := range []string{"evt_x_refund", "evt_x_refund_again"} {
		if status, body := e.deliver(id, "charge.refunded", at.Add(time.Second), refund); status != http.StatusOK || !strings.Contains(body, "ignored when it was paid") {
			t.Fatalf("refund of an ignored top-up: %d %s, want 200 ignored", status, body)
		}
	}
	if ig := e.ignored("pi_x"); ig.Refunded != 400 || len(ig.Refunds) != 1 {
		t.Errorf("ignored top-up after its refund told twice: %+v, want 400 refunded once", ig)
	}
	e.wantBalance("xena", "0")
}

func (e *topUpEnv) ignored(pi string) payments.IgnoredTopUp {
	e.t.Helper()
	b, err := e.pay.GetPaymentRecord(context.Background(), payments.KindTopUpIgnored, pi)
	if err != nil {
		e.t.Fatalf("ignored top-up record %s: %v", pi, err)
	}
	var ig payments.IgnoredTopUp
	if err := json.Unmarshal(b, &ig); err != nil {
		e.t.Fatal(err)
	}
	return ig
}
