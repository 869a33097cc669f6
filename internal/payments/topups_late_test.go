package payments_test

import (
	"context"
	"testing"
	"time"
)

// TestTopUpDeliveredLateExpiresFromItsGrant: a pack with expires_after
// whose paid event reaches the gateway days after the payment (the
// endpoint down or its secret wrong, the event resent from Stripe's
// Dashboard once fixed, freshly signed) is granted now, and gives the
// caller its expires_after to spend the credits from then on. Before
// the fix the expiry counted from the payment alone: a 30-day pack
// delivered 31 days late was granted already expired, and the next
// maintenance took all of it, so the caller paid for 1000 credits and
// could spend none; delivered 29 days late, it lasted a day.
func TestTopUpDeliveredLateExpiresFromItsGrant(t *testing.T) {
	e := startTopUps(t)
	e.payer("otto")
	paid := time.Now().Add(-31 * 24 * time.Hour).Truncate(time.Second)
	before := time.Now()
	e.mustDeliver("evt_otto_late", "checkout.session.completed", paid, paidSession("cs_otto", "pi_otto", "otto", "big", 5000))
	e.wantBalance("otto", "1000")
	gs := e.grants("otto")
	if len(gs) != 1 || gs[0].GrantedAt.Before(before.Truncate(time.Second)) || !gs[0].ExpiresAt.Equal(gs[0].GrantedAt.Add(720*time.Hour)) {
		t.Fatalf("grant of a pack delivered 31 days after its payment: %+v, want it granted now and to expire 720h after", gs)
	}
	// The top-up record keeps when it was paid (the Revenue page's
	// month).
	if rec := e.topUp("pi_otto"); !rec.PaidAt.Equal(paid) {
		t.Errorf("top-up record paid at %s, want %s", rec.PaidAt, paid)
	}
	// The same payment's other event (or the same event on another node)
	// coming a moment later is dated otherwise, but the grant is made
	// once, by the PaymentIntent: the first one's date and expiry stay.
	time.Sleep(1100 * time.Millisecond)
	e.mustDeliver("evt_otto_late_async", "checkout.session.async_payment_succeeded", paid, paidSession("cs_otto", "pi_otto", "otto", "big", 5000))
	e.wantBalance("otto", "1000")
	if again := e.grants("otto"); len(again) != 1 || !again[0].GrantedAt.Equal(gs[0].GrantedAt) || !again[0].ExpiresAt.Equal(gs[0].ExpiresAt) {
		t.Fatalf("grant after a second late delivery: %+v, want the first one's %+v", again, gs)
	}
	e.app.RunMaintenance(context.Background())
	e.wantBalance("otto", "1000")
	// Delivered on time, it expires 720h after the payment, as before.
	e.payer("pia")
	onTime := time.Now().Add(-time.Minute).Truncate(time.Second)
	e.mustDeliver("evt_pia_big", "checkout.session.completed", onTime, paidSession("cs_pia", "pi_pia", "pia", "big", 5000))
	if gs := e.grants("pia"); len(gs) != 1 || !gs[0].GrantedAt.Equal(onTime) || !gs[0].ExpiresAt.Equal(onTime.Add(720*time.Hour)) {
		t.Fatalf("grant delivered on time: %+v, want it to expire 720h after its payment", gs)
	}
}
