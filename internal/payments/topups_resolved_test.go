package payments_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
)

// TestTopUpResolvedIsNotGrantedLater: a top-up paid and not granted (its
// user had no subscription yet) that the operator marked resolved,
// having granted its credits by hand or refunded it, is not granted when
// its paid event is applied later (Stripe's retry once the config can
// grant it, a resend, a resync): the event is answered 200, grants
// nothing, is kept on the record as skipped and audited. The old gateway
// granted the pack again: 100 credits from the paid event on top of the
// 100 the operator added by hand for one payment of 10.00 USD. A refund
// coming after the mark is still kept (money back) and the mark stays.
func TestTopUpResolvedIsNotGrantedLater(t *testing.T) {
	e := startTopUps(t)
	ctx := context.Background()
	e.customer("rita")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	if status, body := e.deliver("evt_r_paid", "checkout.session.completed", at, paidSession("cs_r", "pi_r", "rita", "small", 1000)); status != http.StatusOK || !strings.Contains(body, "ignored") {
		t.Fatalf("paid session of a caller without a subscription: %d %s, want 200 ignored", status, body)
	}
	if _, marked, err := payments.ResolveNotGranted(ctx, e.pay, "pi_r", "console:operator", "granted by hand", time.Now()); err != nil || !marked {
		t.Fatalf("mark resolved: %v %v", marked, err)
	}
	// The config can grant it now; the paid event comes again.
	e.caller("rita")
	e.mustDeliver("evt_r_paid_retry", "checkout.session.completed", at, paidSession("cs_r", "pi_r", "rita", "small", 1000))
	e.mustDeliver("evt_r_paid_async", "checkout.session.async_payment_succeeded", at, paidSession("cs_r", "pi_r", "rita", "small", 1000))
	e.wantBalance("rita", "0")
	if gs := e.grants("rita"); len(gs) != 0 {
		t.Errorf("grants after the paid event of a top-up marked resolved: %+v, want none", gs)
	}
	if _, err := e.pay.GetPaymentRecord(ctx, payments.KindTopUp, "pi_r"); err == nil {
		t.Errorf("a top-up record was made for a top-up marked resolved")
	}
	ig := e.ignored("pi_r")
	if ig.Resolved == nil || ig.Resolved.Note != "granted by hand" {
		t.Errorf("resolution after the paid event: %+v, want kept", ig.Resolved)
	}
	if ig.GrantSkipped == nil || ig.GrantSkipped.Event != "evt_r_paid_retry" || ig.GrantSkipped.At.IsZero() {
		t.Errorf("skipped grant on the record: %+v, want the first paid event after the mark, with its time", ig.GrantSkipped)
	}
	n := 0
	for _, a := range e.audit("rita") {
		if a.Action == payments.AuditTopUpGrantSkipped {
			n++
			if a.Actor != "stripe" || !strings.Contains(a.Detail, "pi_r") || !strings.Contains(a.Detail, "resolved") {
				t.Errorf("audit entry of the skipped grant: %+v", a)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d %s audit entries for two paid events after the mark, want 1 (the first changes the record)", n, payments.AuditTopUpGrantSkipped)
	}
	// Still listed among the resolved, not granted since.
	if list, _, err := payments.ListNotGranted(ctx, e.pay, "resolved", "", 10); err != nil || len(list) != 1 || list[0].ID != "pi_r" {
		t.Errorf("resolved list: %+v %v, want pi_r", list, err)
	}

	// A refund after the mark: kept, and the mark stays.
	e.mock.Answer("/v1/payment_intents/pi_r", map[string]any{"id": "pi_r", "object": "payment_intent", "amount": 1000, "currency": "usd",
		"customer": "cus_rita", "metadata": map[string]string{payments.MetaUser: "rita", payments.MetaService: "echo", payments.MetaProduct: "credits", payments.MetaPack: "small"}})
	refund := map[string]any{"id": "ch_r", "object": "charge", "amount": 1000, "amount_refunded": 1000, "currency": "usd",
		"payment_intent": "pi_r", "customer": "cus_rita", "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_r", "object": "refund", "amount": 1000, "status": "succeeded", "created": at.Unix()}}}}
	e.mustDeliver("evt_r_refund", "charge.refunded", at.Add(time.Second), refund)
	if ig := e.ignored("pi_r"); ig.Refunded != 1000 || ig.Resolved == nil {
		t.Errorf("after a refund of a top-up marked resolved: refunded %d, resolved %+v; want 1000 and kept", ig.Refunded, ig.Resolved)
	}
	e.mustDeliver("evt_r_paid_late", "checkout.session.completed", at, paidSession("cs_r", "pi_r", "rita", "small", 1000))
	e.wantBalance("rita", "0")
}
