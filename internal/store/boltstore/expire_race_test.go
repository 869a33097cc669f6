package boltstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/settlelog"
)

// TestExpireCreditsRacesReserve: ExpireCredits read the balance and the
// held credits under the account's lock, let go of it, computed the
// expiry, and took the lock again to subtract what expired. A call that
// reserved in between was admitted on credits the expiry was about to
// remove, was not counted as held, and its settlement was cut to what
// was left (a call of 10 credits charged 0.003). Now the expiry reads and
// changes the balance under one hold of the lock.
func TestExpireCreditsRacesReserve(t *testing.T) {
	s, err := OpenWith(storePath(t), Options{Durability: settlelog.Write})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p := billing.Product{ID: "percall", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: whole(10)}
	a := subscribe(t, s, "u", "svc", p, 0)
	// Older grants without expiry, one millionth each: only there to make
	// the expiry's computation (between its read and its write) longer.
	const fillers = 3000
	for i := range fillers {
		if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: fmt.Sprintf("f%05d", i), UserID: "u", ServiceID: "svc",
			Credits: 1, GrantedAt: t0.Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	acc, err := s.account("u", "svc")
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 8; attempt++ {
		at := t0.Add(time.Duration(attempt) * time.Hour)
		id := fmt.Sprintf("pi_A%d", attempt)
		if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: id, UserID: "u", ServiceID: "svc", Credits: whole(100),
			GrantedAt: at.Add(-time.Minute), ExpiresAt: at, Source: "stripe"}); err != nil {
			t.Fatal(err)
		}
		before, _ := s.GetSubscription(ctx, "u", "svc")
		// Queue the expiry, then a call, on the account's lock.
		acc.mu.Lock()
		expDone := make(chan error, 1)
		go func() {
			_, err := s.ExpireCredits(ctx, at)
			expDone <- err
		}()
		// Long enough for the expiry to read its 3,000 grants and queue
		// on the lock first, under -race on a loaded machine too (200 ms
		// was not, once: the call then came first, and the test failed).
		time.Sleep(time.Second)
		resDone := make(chan store.Reservation, 1)
		go func() {
			res, err := s.Reserve(ctx, a, whole(1), at)
			if err != nil {
				t.Error(err)
			}
			resDone <- res
		}()
		time.Sleep(100 * time.Millisecond)
		acc.mu.Unlock()
		if err := <-expDone; err != nil {
			t.Fatal(err)
		}
		res := <-resDone
		var expired billing.Units
		grants, _ := s.ListCreditGrants(ctx, "u", "svc")
		for _, g := range grants {
			if g.ID == id {
				expired = g.Expired
			}
		}
		if !res.Decision.Allowed {
			t.Logf("attempt %d: the call came after the expiry (refused); expired %s", attempt, expired)
			continue
		}
		out, err := s.Settle(ctx, res, whole(1), entryFor(a, whole(1), at))
		if err != nil {
			t.Fatal(err)
		}
		after, _ := s.GetSubscription(ctx, "u", "svc")
		t.Logf("attempt %d: balance before grant %s; call admitted (held %s credits); grant expired %s; call charged %s units (cost %s); balance after %s",
			attempt, before.Credits-whole(100), res.Decision.Cost, expired, out.Units, out.Cost, after.Credits)
		// Oldest grant first, held credits counted as spent: the grant
		// expires 90, the call is charged its 10 credits.
		if expired != whole(90) || out.Cost != whole(10) {
			t.Fatalf("attempt %d: want the grant to expire 90 and the call charged 10 credits; got expired %s, charged %s: "+
				"the expiry took the credits the admitted call held, and the call's charge was cut to what was left",
				attempt, expired, out.Cost)
		}
	}
}
