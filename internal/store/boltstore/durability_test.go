package boltstore

import (
	"errors"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestCrashReleasesHolds: a process killed with calls in flight never
// settled them and never answered their callers. Close without settling
// leaves the file exactly as kill -9 would (every hold is committed before
// its call is forwarded); reopening releases the holds and charges nothing.
func TestCrashReleasesHolds(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	q := subscribe(t, s, "u1", "quota", quotaBlock, 0)
	p := subscribe(t, s, "u1", "prepaid", prepaid, whole(10))
	c := subscribe(t, s, "u1", "capped", postpaid, 0)
	var held []store.Reservation
	for _, r := range []struct {
		a     store.Account
		units billing.Units
	}{{q, whole(6)}, {q, whole(4)}, {p, whole(40)}, {c, whole(500)}} {
		res, err := s.Reserve(ctx, r.a, r.units, t0)
		dec := res.Decision
		if err != nil || !dec.Allowed {
			t.Fatalf("Reserve: %+v, %v", dec, err)
		}
		held = append(held, res)
	}
	if res, _ := s.Reserve(ctx, q, whole(1), t0); res.Decision.Allowed {
		t.Fatal("quota not held")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openAt(t, path)
	for _, a := range []store.Account{q, p, c} {
		st := stateOf(t, s, a, t0)
		if st.Reserved != 0 || st.ReservedSpend != 0 || st.CreditsHeld != 0 || st.Used != 0 || st.Spend != 0 {
			t.Errorf("%s after restart: %+v, want nothing held or charged", a.ServiceID, st)
		}
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "prepaid"); sub.Credits != whole(10) || sub.CreditsHeld != 0 {
		t.Errorf("prepaid balance after restart: %+v", sub)
	}
	if n := len(ledger(t, s, store.LedgerFilter{})); n != 0 {
		t.Errorf("%d ledger entries after restart", n)
	}
	// The old reservations are gone: settling one late charges nothing.
	for _, res := range held {
		if _, err := s.Settle(ctx, res, res.Decision.Units, entryFor(res.Account, 0, t0)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Settle of a released hold = %v, want ErrNotFound", err)
		}
	}
	// The whole quota is available again.
	if res, err := s.Reserve(ctx, q, whole(10), t0); err != nil || !res.Decision.Allowed {
		t.Errorf("Reserve(10) after restart = %+v, %v", res.Decision, err)
	}
	// A restart with nothing held changes nothing.
	s.Close()
	s = openAt(t, path)
	if st := stateOf(t, s, q, t0); st.Reserved != 0 {
		t.Errorf("second restart: %+v", st)
	}
}
