package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// testExpireCreditsHeld: credits held at a grant's expiry (open jobs,
// calls in flight) are not removed by it, so a call served before the
// expiry and settled after it is not charged twice; what those holds give
// back unspent expires as they end (store.ExpireGrantsHeld), so a caller
// cannot save expiring credits by holding them in jobs that then fail or
// complete small. Holds taken after the expiry are not affected, and an
// open job's deferred part survives a restart.
func testExpireCreditsHeld(t *testing.T, c *suite) {
	c.needRestart(t)
	s := c.store(t)
	p := payments(t, s)
	a := subscribe(t, s, "u1", "svc", prepaidWhole, 0)
	at := T0.Add(time.Hour)
	g := grant("A", "u1", "svc", 100, T0)
	g.ExpiresAt = at
	if _, err := p.GrantCredits(ctx, g); err != nil {
		t.Fatal(err)
	}
	for _, j := range []struct {
		id    string
		units int64
	}{{"j-fails", 30}, {"j-small", 20}, {"j-all", 10}, {"j-restart", 10}} {
		reserveJob(t, s, j.id, a, whole(j.units))
	}
	balance := func(want int64, when string) {
		t.Helper()
		if c.sync != nil {
			c.sync(t, s)
		}
		if b := c.balance(t, s, "u1", "svc"); b != whole(want) {
			t.Errorf("%s: balance %s, want %d", when, b, want)
		}
	}
	grantA := func(expired, later, deferred int64, when string) {
		t.Helper()
		gs, err := p.ListCreditGrants(ctx, "u1", "svc")
		if err != nil || len(gs) == 0 || gs[0].ID != "A" {
			t.Fatalf("%s: grants %+v, %v", when, gs, err)
		}
		if g := gs[0]; g.Expired != whole(expired) || g.ExpiredLater != whole(later) || g.Deferred != whole(deferred) {
			t.Errorf("%s: grant A expired %s (later %s), deferred %s; want %d (%d), %d", when, g.Expired, g.ExpiredLater,
				g.Deferred, expired, later, deferred)
		}
	}
	// 70 held by the jobs, 30 free: 30 expire now, 70 are deferred.
	got, err := p.ExpireCredits(ctx, at)
	if err != nil || len(got) != 1 || got[0].Expired != whole(30) || got[0].Deferred != whole(70) {
		t.Fatalf("ExpireCredits with 70 held = %+v, %v; want 30 expired, 70 deferred", got, err)
	}
	balance(70, "after the expiry")
	grantA(30, 0, 70, "after the expiry")

	// Credits that do not expire, and a job holding them after the
	// expiry: its failure gives them back, and nothing expires.
	b := grant("B", "u1", "svc", 50, at)
	if _, err := p.GrantCredits(ctx, b); err != nil {
		t.Fatal(err)
	}
	reserveJob(t, s, "j-after", a, whole(20))
	if _, err := s.UpdateJob(ctx, "j-after", complete(store.JobFailed, "d")); err != nil {
		t.Fatal(err)
	}
	balance(120, "a job held after the expiry failed")
	grantA(30, 0, 70, "a job held after the expiry failed")

	// A job held at the expiry fails: its 30 expire.
	if _, err := s.UpdateJob(ctx, "j-fails", complete(store.JobFailed, "d")); err != nil {
		t.Fatal(err)
	}
	balance(90, "a job held at the expiry failed")
	grantA(60, 30, 40, "a job held at the expiry failed")
	// One completes with 5 of its 20 units: 5 spent, 15 expire.
	if _, err := s.CompleteJob(ctx, "j-small", a, completion(a, "j-small", whole(5)), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	balance(70, "a job held at the expiry completed with fewer units")
	grantA(75, 45, 20, "a job held at the expiry completed with fewer units")
	// One charges all it held: nothing expires.
	if _, err := s.CompleteJob(ctx, "j-all", a, completion(a, "j-all", whole(10)), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	balance(60, "a job held at the expiry charged all it held")
	grantA(75, 45, 10, "a job held at the expiry charged all it held")

	// The last one outlives a restart, then fails.
	s = c.restart(t, s)
	p = payments(t, s)
	balance(60, "after the restart")
	if _, err := s.UpdateJob(ctx, "j-restart", complete(store.JobFailed, "d")); err != nil {
		t.Fatal(err)
	}
	// A's 100: 15 charged, 85 expired; B's 50 untouched.
	balance(50, "the job held at the expiry failed after a restart")
	grantA(85, 55, 0, "the job held at the expiry failed after a restart")
	if got, err := p.ExpireCredits(ctx, at.Add(time.Hour)); err != nil || len(got) != 0 {
		t.Errorf("ExpireCredits again = %+v, %v; want nothing", got, err)
	}
	entries, _, err := s.ListAudit(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Action == "credits.expire" && e.UserID == "u1" {
			n++
		}
	}
	if n != 4 { // the expiry, two jobs giving back, one after the restart
		t.Errorf("%d credits.expire audit entries, want 4", n)
	}
}

// testExpireCreditsHeldCalls: sync calls in flight at a grant's expiry.
// What each store counts as held differs (the embedded store the calls'
// holds, a fleet node the block it leased), so only what holds once every
// hold has ended: what the calls charged is spent, the rest of the grant
// expired, whether a call settled with fewer units, with all it held, or
// was dropped by a restart.
func testExpireCreditsHeldCalls(t *testing.T, c *suite) {
	c.needRestart(t)
	s := c.store(t)
	p := payments(t, s)
	a := subscribe(t, s, "u2", "svc", prepaidWhole, 0)
	at := T0.Add(time.Hour)
	g := grant("C", "u2", "svc", 40, T0)
	g.ExpiresAt = at
	if _, err := p.GrantCredits(ctx, g); err != nil {
		t.Fatal(err)
	}
	var held []store.Reservation
	for _, units := range []int64{10, 10, 5} {
		res, err := s.Reserve(ctx, a, whole(units), T0.Add(time.Minute))
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("Reserve %d: %+v, %v", units, res.Decision, err)
		}
		held = append(held, res)
	}
	if c.sync != nil {
		c.sync(t, s)
	}
	got, err := p.ExpireCredits(ctx, at)
	if err != nil || len(got) != 1 || got[0].Expired+got[0].Deferred != whole(40) || got[0].Deferred < whole(25) {
		t.Fatalf("ExpireCredits with 25 held = %+v, %v; want all 40 expired or deferred, at least 25 deferred", got, err)
	}
	// Settled with 4 of 10 units, with all 10; the third is in flight at
	// the restart, which drops it (its call never answered).
	for i, units := range []int64{4, 10} {
		if _, err := s.Settle(ctx, held[i], whole(units), EntryFor(a, whole(units), at.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	s = c.restart(t, s)
	p = payments(t, s)
	if c.sync != nil {
		c.sync(t, s)
	}
	if b := c.balance(t, s, "u2", "svc"); b != 0 {
		t.Errorf("balance %s once every call held at the expiry ended, want 0 (40 granted, 14 spent, 26 expired)", b)
	}
	gs, err := p.ListCreditGrants(ctx, "u2", "svc")
	if err != nil || len(gs) != 1 || gs[0].Expired != whole(26) || gs[0].Deferred != 0 || gs[0].ExpiredLater != whole(26)-got[0].Expired {
		t.Errorf("grant C once every call ended = %+v, %v; want 26 expired, nothing deferred", gs, err)
	}
}

// heldRefundStart is the start of the refund cases: grant A of 100
// expiring, grant B of 50 without expiry, 20 spent, jobs holding 5 each
// (jobs of them), then A's expiry: of the balance of 130, 50 held and B's
// 50, A has 30 free (expired) and 50 held (deferred), 20 left (spent).
func heldRefundStart(t *testing.T, s store.Store, user string, jobs int) (store.Payments, store.Account) {
	t.Helper()
	p := payments(t, s)
	a := subscribe(t, s, user, "svc", prepaidWhole, 0)
	at := T0.Add(time.Hour)
	g := grant(user+"-A", user, "svc", 100, T0)
	g.ExpiresAt = at
	if _, err := p.GrantCredits(ctx, g); err != nil {
		t.Fatal(err)
	}
	if _, err := p.GrantCredits(ctx, grant(user+"-B", user, "svc", 50, T0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	spend(t, s, a, 20)
	for i := range jobs {
		reserveJob(t, s, fmt.Sprintf("%s-j%d", user, i), a, whole(int64(50/jobs)))
	}
	got, err := p.ExpireCredits(ctx, at)
	if err != nil || len(got) != 1 || got[0].Expired != whole(30) || got[0].Deferred != whole(50) {
		t.Fatalf("ExpireCredits with 50 held = %+v, %v; want 30 expired, 50 deferred", got, err)
	}
	return p, a
}

// checkGrantFigures checks the expiring grant of heldRefundStart and the
// balance.
func checkGrantFigures(t *testing.T, c *suite, s store.Store, p store.Payments, user string, balance, reversed, expired, later, deferred int64, when string) {
	t.Helper()
	if c.sync != nil {
		c.sync(t, s)
	}
	if b := c.balance(t, s, user, "svc"); b != whole(balance) {
		t.Errorf("%s: balance %s, want %d", when, b, balance)
	}
	gs, err := p.ListCreditGrants(ctx, user, "svc")
	if err != nil || len(gs) != 2 || gs[0].ID != user+"-A" {
		t.Fatalf("%s: grants %+v, %v", when, gs, err)
	}
	g := gs[0]
	if g.Reversed != whole(reversed) || g.Expired != whole(expired) || g.ExpiredLater != whole(later) || g.Deferred != whole(deferred) {
		t.Errorf("%s: grant A reversed %s, expired %s (later %s), deferred %s; want %d, %d (%d), %d", when,
			g.Reversed, g.Expired, g.ExpiredLater, g.Deferred, reversed, expired, later, deferred)
	}
	if sum := g.Reversed + g.Expired + g.Deferred + g.Left(); sum != g.Credits {
		t.Errorf("%s: grant A reversed + expired + deferred + left = %s, want its %s credits", when, sum, g.Credits)
	}
	if gs[1].Reversed != 0 || gs[1].Expired != 0 || gs[1].Left() != whole(50) {
		t.Errorf("%s: grant B %+v, want its 50 untouched", when, gs[1])
	}
}

// testExpireCreditsHeldRefund: refunds of a grant whose expiry deferred
// credits to open jobs, before and after the jobs give them back: a
// refund changes only what the grant had reversed (it takes at most what
// is left: not expired, not deferred), the jobs' give-back only what it
// deferred and expired.
func testExpireCreditsHeldRefund(t *testing.T, c *suite) {
	s := c.store(t)
	p, a := heldRefundStart(t, s, "u3", 2) // two jobs of 25
	checkGrantFigures(t, c, s, p, "u3", 100, 0, 30, 0, 50, "after the expiry")
	reverse := func(id string, credits, reversed int64) {
		t.Helper()
		_, g, err := p.ReverseCredits(ctx, store.CreditReversal{ID: id, GrantID: "u3-A", Credits: whole(credits), At: T0.Add(2 * time.Hour)})
		if err != nil || g.Reversed != whole(reversed) {
			t.Fatalf("ReverseCredits %s = %+v, %v; want %d reversed", id, g, err, reversed)
		}
	}
	reverse("re_1", 10, 10) // 10 of the 20 left
	checkGrantFigures(t, c, s, p, "u3", 90, 10, 30, 0, 50, "refunded 10")
	if _, err := s.UpdateJob(ctx, "u3-j0", complete(store.JobFailed, "d")); err != nil { // its 25 expire
		t.Fatal(err)
	}
	checkGrantFigures(t, c, s, p, "u3", 65, 10, 55, 25, 25, "a job held at the expiry failed")
	reverse("re_2", 30, 20) // the 10 left
	checkGrantFigures(t, c, s, p, "u3", 55, 20, 55, 25, 25, "refunded the rest")
	// The last job charges 5 of its 25: 20 expire.
	if _, err := s.CompleteJob(ctx, "u3-j1", a, completion(a, "u3-j1", whole(5)), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	checkGrantFigures(t, c, s, p, "u3", 30, 20, 75, 45, 0, "the last job held at the expiry completed")
}

// testExpireCreditsHeldRefundConcurrent: refunds of a grant racing the
// jobs held at its expiry giving back what it deferred: however they
// interleave, every refund takes what it asked (the jobs' give-back
// leaves what is left alone) and the grant ends with everything the jobs
// gave back expired, nothing deferred. (The embedded store wrote a
// refund's grant whole, as the refund had read it: a job's give-back
// between that read and the write was put back to deferred.)
func testExpireCreditsHeldRefundConcurrent(t *testing.T, c *suite) {
	s := c.store(t)
	const n = 10
	p, _ := heldRefundStart(t, s, "u4", n) // ten jobs of 5
	var wg sync.WaitGroup
	errs := make([]error, 2*n)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = s.UpdateJob(ctx, fmt.Sprintf("u4-j%d", i), complete(store.JobFailed, "d"))
		})
		wg.Go(func() {
			_, _, errs[n+i] = p.ReverseCredits(ctx, store.CreditReversal{ID: fmt.Sprintf("re_u4_%d", i), GrantID: "u4-A",
				Credits: whole(1), At: T0.Add(2 * time.Hour)})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	// 130 - 30 expired - 10 refunded - 50 given back and expired.
	checkGrantFigures(t, c, s, p, "u4", 40, 10, 80, 50, 0, "every job failed and every refund took 1")
}

// testExpireCreditsHeldOrder: what holds from before an expiry charge is
// taken oldest grant first, as ordinary spending takes it, grants that do
// not expire included, and what they give back expires only as far as it
// is of the expiring grants. Grants A 100 and B 100 expire, C 50 does
// not and is older than B; a job holds all 250 at the expiry (nothing
// expires then: A and B defer 100 each). A charge of 150 spends A and C,
// and B's 100 expire: the balance ends at 0. (Both stores took the charge
// from the deferred credits first, A and B's 50, so C's 50 stayed and
// only 50 of B expired: the caller kept 50.) A job that gives back all
// 250 leaves C's 50; one that charges all 250 expires nothing. One case
// restarts the store between the expiry and the job's end.
func testExpireCreditsHeldOrder(t *testing.T, c *suite) {
	for _, tc := range []struct {
		name     string
		charge   int64 // what the job charges of the 250 it holds (-1: it fails)
		restart  bool
		balance  int64
		expiredB int64
		expiredA int64
	}{
		{"charges150", 150, false, 0, 100, 0},
		{"charges150AfterRestart", 150, true, 0, 100, 0},
		{"charges50", 50, false, 50, 100, 50},
		{"givesBackAll", -1, false, 50, 100, 100},
		{"chargesAll", 250, false, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.restart {
				c.needRestart(t)
			}
			s := c.store(t)
			p := payments(t, s)
			user := "uo-" + tc.name
			a := subscribe(t, s, user, "svc", prepaidWhole, 0)
			at := T0.Add(time.Hour)
			for _, g := range []struct {
				id      string
				credits int64
				grant   time.Time
				expires bool
			}{{"A", 100, T0, true}, {"C", 50, T0.Add(time.Minute), false}, {"B", 100, T0.Add(2 * time.Minute), true}} {
				cg := grant(user+"-"+g.id, user, "svc", g.credits, g.grant)
				if g.expires {
					cg.ExpiresAt = at
				}
				if _, err := p.GrantCredits(ctx, cg); err != nil {
					t.Fatal(err)
				}
			}
			reserveJob(t, s, user+"-j", a, whole(250))
			got, err := p.ExpireCredits(ctx, at)
			if err != nil || len(got) != 2 || got[0].Expired != 0 || got[0].Deferred != whole(100) ||
				got[1].Expired != 0 || got[1].Deferred != whole(100) {
				t.Fatalf("ExpireCredits with all 250 held = %+v, %v; want A and B 100 deferred each", got, err)
			}
			if tc.restart {
				s = c.restart(t, s)
				p = payments(t, s)
			}
			if tc.charge < 0 {
				if _, err := s.UpdateJob(ctx, user+"-j", complete(store.JobFailed, "d")); err != nil {
					t.Fatal(err)
				}
			} else if _, err := s.CompleteJob(ctx, user+"-j", a, completion(a, user+"-j", whole(tc.charge)),
				complete(store.JobCompleted, "d")); err != nil {
				t.Fatal(err)
			}
			if c.sync != nil {
				c.sync(t, s)
			}
			if b := c.balance(t, s, user, "svc"); b != whole(tc.balance) {
				t.Errorf("balance %s once the job held at the expiry ended, want %d", b, tc.balance)
			}
			gs, err := p.ListCreditGrants(ctx, user, "svc")
			if err != nil || len(gs) != 3 {
				t.Fatalf("grants %+v, %v", gs, err)
			}
			want := map[string]int64{"A": tc.expiredA, "C": 0, "B": tc.expiredB}
			for _, g := range gs {
				id := g.ID[len(user)+1:]
				if g.Expired != whole(want[id]) || g.ExpiredLater != whole(want[id]) || g.Deferred != 0 {
					t.Errorf("grant %s expired %s (later %s), deferred %s; want %d expired after the expiry, nothing deferred",
						id, g.Expired, g.ExpiredLater, g.Deferred, want[id])
				}
			}
		})
	}
}
