package boltstore

import (
	"testing"
	"time"
)

// TestSubscriptionLookupTakesNoAccountLock: a subscription lookup reads
// the balance in memory without the account's lock (every call looks its
// subscription up while others hold and settle on the same account), and
// reads what the last change left.
func TestSubscriptionLookupTakesNoAccountLock(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", prepaid, whole(10))
	res, err := s.Reserve(ctx, a, whole(4), t0)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("Reserve: %+v, %v", res.Decision, err)
	}
	acc, err := s.account("u1", "svc")
	if err != nil {
		t.Fatal(err)
	}
	acc.mu.Lock()
	got := make(chan error, 1)
	go func() {
		_, err := s.GetSubscription(ctx, "u1", "svc")
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("GetSubscription waited for the account's lock")
	}
	acc.mu.Unlock()
	sub, err := s.GetSubscription(ctx, "u1", "svc")
	if err != nil || sub.Credits != whole(10) || sub.CreditsHeld != whole(1) || !sub.UpdatedAt.Equal(t0) {
		t.Errorf("after a hold: credits %s, held %s, updated %v (%v); want 10, 1, %v",
			sub.Credits, sub.CreditsHeld, sub.UpdatedAt, err, t0)
	}
}
