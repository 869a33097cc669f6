package storetest

import (
	"math"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testExpireCreditsSaturated: a prepaid balance at the least a balance
// holds (reports past the limits saturate it, SaturatedCountersRefuse)
// has nothing to expire. The expiry rule took balance less what was held
// (or less what newer grants had left) in plain int64: at that floor it
// wrapped to a huge free balance, the grant due expired all it had left,
// the store refused the change as out of range, and ExpireCredits
// returned in the middle of its loop, so no later subscription's grant
// expired, on every sweep. One subscription's error must not stop the
// others either.
func testExpireCreditsSaturated(t *testing.T, c *suite) {
	s := c.store(t)
	p := payments(t, s)
	at := T0.Add(time.Hour)
	expiring := func(id, user string) store.CreditGrant {
		g := grant(id, user, "svc", 100, T0)
		g.ExpiresAt = at
		return g
	}
	// a-sat: a grant due, a hold of 2 while the reports saturate it.
	held := subscribe(t, s, "a-sat", "svc", prepaidWhole, 0)
	if _, err := p.GrantCredits(ctx, expiring("G", "a-sat")); err != nil {
		t.Fatal(err)
	}
	reserveJob(t, s, "j-sat", held, whole(2))
	// b-newer: a grant due and a newer one that does not expire, with
	// its credits left.
	newer := subscribe(t, s, "b-newer", "svc", prepaidWhole, 0)
	if _, err := p.GrantCredits(ctx, expiring("H", "b-newer")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.GrantCredits(ctx, grant("N", "b-newer", "svc", 100, T0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	// z-other: a grant due at the same time.
	subscribe(t, s, "z-other", "svc", prepaidWhole, 0)
	if _, err := p.GrantCredits(ctx, expiring("Z", "z-other")); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		for _, a := range []store.Account{held, newer} {
			if _, err := s.Record(ctx, a, EntryFor(a, billing.MaxUnits, T0), OKResponse); err != nil {
				t.Fatalf("report for %s: %v", a.UserID, err)
			}
		}
	}
	for _, u := range []string{"a-sat", "b-newer"} {
		if b := c.balance(t, s, u, "svc"); b != math.MinInt64 {
			t.Fatalf("%s: balance %d, want the least a balance holds", u, b)
		}
	}
	for i := range 2 {
		got, err := p.ExpireCredits(ctx, at.Add(time.Hour))
		if err != nil {
			t.Errorf("sweep %d: ExpireCredits: %v", i+1, err)
		}
		if i == 0 {
			byID := map[string]billing.Units{}
			for _, g := range got {
				byID[g.ID] = g.Expired
			}
			if byID["G"] != 0 || byID["H"] != 0 || byID["Z"] != whole(100) {
				t.Errorf("sweep 1 expired %v; want G 0, H 0, Z 100", byID)
			}
		}
		for _, u := range []string{"a-sat", "b-newer"} {
			if b := c.balance(t, s, u, "svc"); b != math.MinInt64 {
				t.Errorf("sweep %d: %s: balance %d, want it left at the floor", i+1, u, b)
			}
		}
		if b := c.balance(t, s, "z-other", "svc"); b != 0 {
			t.Errorf("sweep %d: z-other: balance %s, want 0 (its 100 expired)", i+1, b)
		}
	}
}
