package boltstore

import (
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestExpireCreditsHeld: credits held for calls in flight count as spent
// when a grant expires, so the calls, settled after the expiry, do not
// spend credits the expiry took too: the final balance is the grant less
// what the calls spent less what expired, never less.
func TestExpireCreditsHeld(t *testing.T) {
	s := openTemp(t)
	perCall := billing.Product{ID: "percall", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: whole(1)}
	a := subscribe(t, s, "u", "svc", perCall, 0)
	const grant, calls = 100, 30
	if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: "pi_held", UserID: "u", ServiceID: "svc", Credits: whole(grant),
		GrantedAt: t0, ExpiresAt: t0.Add(time.Hour), Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	var held []store.Reservation
	for range calls {
		res, err := s.Reserve(ctx, a, whole(1), t0.Add(time.Minute))
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve: %+v %v", res.Decision, err)
		}
		held = append(held, res)
	}
	expired, err := s.ExpireCredits(ctx, t0.Add(time.Hour))
	if err != nil || len(expired) != 1 || expired[0].Expired != whole(grant-calls) {
		t.Fatalf("ExpireCredits with %d credits held = %+v, %v; want %d expired", calls, expired, err, grant-calls)
	}
	for _, res := range held {
		if _, err := s.Settle(ctx, res, whole(1), entryFor(a, whole(1), t0.Add(time.Hour))); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := s.GetSubscription(ctx, "u", "svc")
	if err != nil || sub.Credits != 0 || sub.CreditsHeld != 0 {
		t.Errorf("after settling: %+v %v; want 0 (%d granted - %d spent - %d expired), nothing held", sub, err, grant, calls, grant-calls)
	}
}
