package storetest

import (
	"testing"

	"github.com/platformgw/gateway/internal/store"
)

// testPutSubscriptionShowsHolds: the subscription PutSubscription returns,
// and ListSubscriptions lists, shows the credits held as GetSubscription does: what the calls in flight
// hold, nothing a store keeps aside for calls that have not come yet.
func testPutSubscriptionShowsHolds(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", prepaidWhole, whole(100))
	res, err := s.Reserve(ctx, a, whole(1), T0)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	c.state(t, s, a, T0) // the barrier
	got, err := s.GetSubscription(ctx, "u1", "svc")
	if err != nil || got.Credits != whole(100) || got.CreditsHeld != whole(1) {
		t.Fatalf("GetSubscription = credits %s held %s, %v; want 100 and 1", got.Credits, got.CreditsHeld, err)
	}
	put, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: prepaidWhole.ID,
		Status: "ACTIVE", UpdatedAt: T0})
	if err != nil || put.Credits != got.Credits || put.CreditsHeld != got.CreditsHeld {
		t.Errorf("PutSubscription = credits %s held %s, %v; want %s and %s as GetSubscription shows",
			put.Credits, put.CreditsHeld, err, got.Credits, got.CreditsHeld)
	}
	subs, _, err := s.ListSubscriptions(ctx, "u1", "", 10)
	if err != nil || len(subs) != 1 || subs[0].Credits != got.Credits || subs[0].CreditsHeld != got.CreditsHeld {
		t.Errorf("ListSubscriptions = %+v, %v; want credits %s held %s as GetSubscription shows", subs, err, got.Credits, got.CreditsHeld)
	}
	if _, err := s.Settle(ctx, res, whole(1), EntryFor(a, 0, T0)); err != nil {
		t.Fatal(err)
	}
}
