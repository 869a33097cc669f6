package stripewebhook_test

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
)

// TestIncompleteExpiredLeavesOtherPlan: a caller on a running plan
// the operator gave them (team, not billed by Stripe) opens Checkout for
// pro; the first payment never succeeds (incomplete, then
// incomplete_expired after 23h: nothing was ever paid). The docs say
// incomplete is "nothing yet: the first payment is not made", and
// incomplete_expired changes nothing either: it overwrote the caller's
// ACTIVE team plan with an EXPIRED pro plan, access lost for a payment
// that failed.
func TestIncompleteExpiredLeavesOtherPlan(t *testing.T) {
	g := startGateway(t, "1h")
	ctx := context.Background()
	if _, err := g.app.DataStore().PutSubscription(ctx, store.Subscription{UserID: "u-inc", ServiceID: "svc", ProductID: "team",
		Status: "ACTIVE", UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	cust := g.customer("u-inc")
	now := time.Now().Truncate(time.Second)
	g.deliver(stripetest.Event("evt_inc_1", "customer.subscription.created", now,
		subObj("sub_inc", cust, "incomplete", "price_pro", false, now.Add(720*time.Hour))), 200)
	if s, _ := g.sub("u-inc"); s.ProductID != "team" || s.Status != "ACTIVE" {
		t.Fatalf("after incomplete: %+v", s)
	}
	g.deliver(stripetest.Event("evt_inc_2", "customer.subscription.updated", now.Add(23*time.Hour),
		subObj("sub_inc", cust, "incomplete_expired", "price_pro", false, now.Add(720*time.Hour))), 200)
	if s, _ := g.sub("u-inc"); s.ProductID != "team" || s.Status != "ACTIVE" {
		t.Errorf("after incomplete_expired (never paid): product %s %s, want team ACTIVE as before", s.ProductID, s.Status)
	}
}

// TestSameSecondCancelAtUndone: two events of one second, the first
// setting cancel_at, the second clearing it (the caller cancelled and
// undid it). docs: "one of the same second that says something else makes
// the gateway read the subscription from Stripe". sameState ignored
// CancelAt, so the second was taken for a duplicate: the gateway kept
// CANCELLING with an end at cancel_at, and cut off a caller Stripe kept
// billing.
func TestSameSecondCancelAtUndone(t *testing.T) {
	g := startGateway(t, "1h")
	cust := g.customer("u-ca")
	now := time.Now().Truncate(time.Second)
	periodEnd := now.Add(720 * time.Hour)
	g.deliver(stripetest.Event("evt_ca_0", "customer.subscription.created", now.Add(-time.Minute),
		subObj("sub_ca", cust, "active", "price_pro", false, periodEnd)), 200)
	withCancelAt := subObj("sub_ca", cust, "active", "price_pro", false, periodEnd)
	withCancelAt["cancel_at"] = now.Add(48 * time.Hour).Unix()
	g.deliver(stripetest.Event("evt_ca_1", "customer.subscription.updated", now, withCancelAt), 200)
	if s, _ := g.sub("u-ca"); s.Status != "CANCELLING" {
		t.Fatalf("after cancel_at: %+v", s)
	}
	g.deliver(stripetest.Event("evt_ca_2", "customer.subscription.updated", now,
		subObj("sub_ca", cust, "active", "price_pro", false, periodEnd)), 200)
	reads := 0
	for _, r := range g.mock.Requests("/v1/subscriptions/sub_ca") {
		if r.Method == "GET" {
			reads++
		}
	}
	s, _ := g.sub("u-ca")
	t.Logf("after the undo of the same second: %s ends %s %s; Stripe asked %d times", s.Status, s.EndsAt, s.EndStatus, reads)
	if s.Status != "ACTIVE" && reads == 0 {
		t.Errorf("a same-second event saying something else was not checked with Stripe: subscription stays %s, %s from %s", s.Status, s.EndStatus, s.EndsAt)
	}
}
