package boltstore

import (
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

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

// TestExpireCreditsHeldCrash: the deferred expiry of credits held at a
// grant's expiry is replayed from the settlement log after kill -9, with
// nothing applied to the file before it: what the holds that ended gave
// back stays expired once, the sync call in flight at the crash (dropped:
// its call never answered) gives its part back at the start, a job open
// across the crash still expires its part when it ends, and holds taken
// after the restart are numbered past the expiry's cutoff, so they are
// not taken for holds from before it.
func TestExpireCreditsHeldCrash(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour // nothing is applied before the crash
	defer func() { applyGrantsAtOnce = true }()
	applyGrantsAtOnce = false
	path := storePath(t)
	s := openAt(t, path)
	perCall := billing.Product{ID: "percall", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, Price: whole(1)}
	a := subscribe(t, s, "u1", "svc", perCall, 0)
	if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: "A", UserID: "u1", ServiceID: "svc", Credits: whole(100),
		GrantedAt: t0, ExpiresAt: t0.Add(time.Hour), Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	reserveJob(t, s, "j-fails", a, whole(40))
	reserveJob(t, s, "j-open", a, whole(20))
	var calls []store.Reservation
	for _, u := range []int64{10, 5} {
		res, err := s.Reserve(ctx, a, whole(u), t0.Add(time.Minute))
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve: %+v %v", res.Decision, err)
		}
		calls = append(calls, res)
	}
	got, err := s.ExpireCredits(ctx, t0.Add(time.Hour))
	if err != nil || len(got) != 1 || got[0].Expired != whole(25) || got[0].Deferred != whole(75) {
		t.Fatalf("ExpireCredits with 75 held = %+v, %v; want 25 expired, 75 deferred", got, err)
	}
	if _, err := s.UpdateJob(ctx, "j-fails", complete(store.JobFailed, "d")); err != nil { // 40 expire
		t.Fatal(err)
	}
	if _, err := s.Settle(ctx, calls[0], whole(10), entryFor(a, whole(10), t0.Add(time.Hour))); err != nil { // all charged
		t.Fatal(err)
	}
	var onFile store.CreditGrant
	s.view(func(tx *bolt.Tx) (err error) { onFile, err = readGrant(tx, "A"); return err })
	if !onFile.ExpiredAt.IsZero() {
		t.Fatalf("the test meant the expiry to be only in the log, but the file had it: %+v", onFile)
	}
	crash(t, s) // the 5 of calls[1] in flight

	check := func(s *Store, credits, expired, later, deferred int64, when string) {
		t.Helper()
		sub, err := s.GetSubscription(ctx, "u1", "svc")
		if err != nil || sub.Credits != whole(credits) {
			t.Errorf("%s: %+v, %v; want a balance of %d", when, sub, err, credits)
		}
		gs, err := s.ListCreditGrants(ctx, "u1", "svc")
		if err != nil || len(gs) == 0 || gs[0].Expired != whole(expired) || gs[0].ExpiredLater != whole(later) || gs[0].Deferred != whole(deferred) {
			t.Errorf("%s: grants %+v, %v; want A with %d expired (%d later), %d deferred", when, gs, err, expired, later, deferred)
		}
	}
	s = openAt(t, path)
	// 100 - 25 - 40 expired - 10 charged - 5 expired at the start: 20, held by the open job.
	check(s, 20, 70, 45, 20, "after the crash")
	// Credits that do not expire, and a call held after the restart and
	// released: nothing of A's moves.
	if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: "B", UserID: "u1", ServiceID: "svc", Credits: whole(10),
		GrantedAt: t0.Add(2 * time.Hour), Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Reserve(ctx, a, whole(10), t0.Add(2*time.Hour))
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve after the restart: %+v %v", res.Decision, err)
	}
	if _, err := s.Settle(ctx, res, 0, entryFor(a, 0, t0.Add(2*time.Hour))); err != nil {
		t.Fatal(err)
	}
	check(s, 30, 70, 45, 20, "a call held after the restart released")
	// The job open across the crash completes with 5 of its 20: 15 expire.
	if _, err := s.CompleteJob(ctx, "j-open", a, completion(a, "j-open", whole(5)), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	check(s, 10, 85, 60, 0, "the job open across the crash completed")
	crash(t, s)
	s = openAt(t, path)
	check(s, 10, 85, 60, 0, "after a second crash")
	s.Close()
	s = openAt(t, path)
	check(s, 10, 85, 60, 0, "after a clean restart")
}

// TestExpireCreditsHeldOrderCrash: the stack of a deferred expiry (what
// the holds hold by the age of the credits, store.HeldStack) is replayed
// from the settlement log after kill -9 with nothing applied to the file:
// grants A 100 and B 100 expire with C 50 older than B that does not, a
// job holds 150 and a sync call 100 at the expiry. The call, in flight
// at the crash, gives its 100 back at the start, and they are B's (the
// newest): they expire; the job, open across the crash, then charges 150,
// A's and C's. With C's place in the stack lost (the slack put above B),
// C's 50 came back and 50 of B were charged: a balance of 50.
func TestExpireCreditsHeldOrderCrash(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour // nothing is applied before the crash
	defer func() { applyGrantsAtOnce = true }()
	applyGrantsAtOnce = false
	path := storePath(t)
	s := openAt(t, path)
	perToken := billing.Product{ID: "pertoken", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, Price: whole(1)}
	a := subscribe(t, s, "u1", "svc", perToken, 0)
	at := t0.Add(time.Hour)
	for _, g := range []store.CreditGrant{
		{ID: "A", Credits: whole(100), GrantedAt: t0, ExpiresAt: at},
		{ID: "C", Credits: whole(50), GrantedAt: t0.Add(time.Minute)},
		{ID: "B", Credits: whole(100), GrantedAt: t0.Add(2 * time.Minute), ExpiresAt: at},
	} {
		g.UserID, g.ServiceID, g.Source = "u1", "svc", "stripe"
		if _, err := s.GrantCredits(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	reserveJob(t, s, "j", a, whole(150))
	if res, err := s.Reserve(ctx, a, whole(100), t0.Add(time.Minute)); err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve: %+v %v", res.Decision, err)
	}
	got, err := s.ExpireCredits(ctx, at)
	if err != nil || len(got) != 2 || got[0].Deferred != whole(100) || got[1].Deferred != whole(100) {
		t.Fatalf("ExpireCredits with all 250 held = %+v, %v; want A and B 100 deferred each", got, err)
	}
	crash(t, s) // the 100 of the call in flight, the job open
	check := func(s *Store, when string) {
		t.Helper()
		sub, err := s.GetSubscription(ctx, "u1", "svc")
		if err != nil || sub.Credits != 0 {
			t.Errorf("%s: %+v, %v; want a balance of 0 (250 granted, 150 spent, B's 100 expired)", when, sub, err)
		}
		gs, err := s.ListCreditGrants(ctx, "u1", "svc")
		if err != nil || len(gs) != 3 {
			t.Fatalf("%s: grants %+v, %v", when, gs, err)
		}
		for _, g := range gs {
			want := whole(0)
			if g.ID == "B" {
				want = whole(100)
			}
			if g.Expired != want || g.ExpiredLater != want || g.Deferred != 0 {
				t.Errorf("%s: grant %s expired %s (later %s), deferred %s; want %s expired, nothing deferred",
					when, g.ID, g.Expired, g.ExpiredLater, g.Deferred, want)
			}
		}
	}
	s = openAt(t, path)
	if _, err := s.CompleteJob(ctx, "j", a, completion(a, "j", whole(150)), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	check(s, "the job open across the crash charged 150")
	crash(t, s)
	s = openAt(t, path)
	check(s, "after a second crash")
	s.Close()
	s = openAt(t, path)
	check(s, "after a clean restart")
}

// TestReverseCreditsRacesDeferredExpiry: a refund reads its grant, then
// a job held at the grant's expiry fails before the refund's record is
// appended: the job's give-back expires what the expiry deferred, and
// the refund must not write back the grant as it read it (deferred, not
// expired yet): the balance is right either way, the grant's figures
// must be too.
func TestReverseCreditsRacesDeferredExpiry(t *testing.T) {
	s := openTemp(t)
	perCall := billing.Product{ID: "percall", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, Price: whole(1)}
	a := subscribe(t, s, "u", "svc", perCall, 0)
	if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: "A", UserID: "u", ServiceID: "svc", Credits: whole(100),
		GrantedAt: t0, ExpiresAt: t0.Add(time.Hour), Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Reserve(ctx, a, whole(20), t0.Add(time.Minute))
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve: %+v %v", res.Decision, err)
	}
	if _, err := s.Settle(ctx, res, whole(20), entryFor(a, whole(20), t0.Add(time.Minute))); err != nil { // 20 spent
		t.Fatal(err)
	}
	reserveJob(t, s, "j-fails", a, whole(30))
	// Balance 80, 30 held: 50 expire, 30 deferred, 20 left (spent).
	got, err := s.ExpireCredits(ctx, t0.Add(time.Hour))
	if err != nil || len(got) != 1 || got[0].Expired != whole(50) || got[0].Deferred != whole(30) {
		t.Fatalf("ExpireCredits = %+v, %v; want 50 expired, 30 deferred", got, err)
	}
	defer func() { reverseRead = nil }()
	reverseRead = func() {
		reverseRead = nil
		if _, err := s.UpdateJob(ctx, "j-fails", complete(store.JobFailed, "d")); err != nil { // its 30 expire
			t.Error(err)
		}
	}
	if _, _, err := s.ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "A", Credits: whole(20), At: t0.Add(2 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		sub, err := s.GetSubscription(ctx, "u", "svc")
		// 100 - 20 spent - 50 expired - 20 refunded - 30 expired later.
		if err != nil || sub.Credits != whole(-20) || sub.CreditsHeld != 0 {
			t.Errorf("%s: %+v, %v; want a balance of -20, nothing held", when, sub, err)
		}
		gs, err := s.ListCreditGrants(ctx, "u", "svc")
		if err != nil || len(gs) != 1 {
			t.Fatalf("%s: grants %+v, %v", when, gs, err)
		}
		if g := gs[0]; g.Reversed != whole(20) || g.Expired != whole(80) || g.ExpiredLater != whole(30) || g.Deferred != 0 || g.Left() != 0 {
			t.Errorf("%s: grant A reversed %s, expired %s (later %s), deferred %s, left %s; want 20, 80 (30), 0, 0",
				when, g.Reversed, g.Expired, g.ExpiredLater, g.Deferred, g.Left())
		}
	}
	check("after the refund")
	path := s.path
	s.Close()
	s = openAt(t, path)
	check("after a restart")
}
