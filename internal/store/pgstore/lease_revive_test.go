package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestLapsedLeaseNotRevivedBySettle: a node's lease lapses (its row
// expired in the database and was swept: its units went back to the
// allowance), and calls taken before the lapse settle afterwards, one of
// them for more than it held. The extra units must not be leased on the
// lapsed holder's row (grantSQL's upsert made a fresh row for it, the
// next renewal found that row alive and moved the lease's deadline on,
// and the node admitted calls again from the free units it still counted,
// which the database had handed back: found by a review of the fleet's
// leases). The quota must hold.
func TestLapsedLeaseNotRevivedBySettle(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	const ttl = 2 * time.Second
	a := openNode(t, dsn, "a", func(o *Options) { o.LeaseTTL = ttl })
	b := openNode(t, dsn, "b", func(o *Options) { o.LeaseTTL = ttl })
	subscribe(t, a, "u", "svc", "q")
	const quota = 200
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(quota)}
	entry := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Source: store.SourceGateway}

	served := 0
	var inflight []store.Reservation
	for range 3 {
		res, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve: %v %+v", err, res.Decision)
		}
		served++
		inflight = append(inflight, res)
	}
	k := AllowanceKey{"u", "svc", inflight[0].PeriodKey}
	t.Logf("a's lease: free %s after 3 calls in flight", a.leaser.Free(k).Units)

	// a loses the database for longer than the TTL, as far as its lease
	// row is concerned: the row expires and is swept (by any node).
	lapseLeases(t, a, b)
	time.Sleep(ttl) // a's own deadline passes too
	if f := a.leaser.Free(k); !f.IsZero() {
		t.Fatalf("a's lease still valid after the lapse: free %s", f.Units)
	}

	// The calls in flight settle: two as held, one for twice its hold.
	for _, res := range inflight[1:] {
		if _, err := a.Settle(ctx, res, units(1), entry); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Settle(ctx, inflight[0], units(2), entry); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a renewal or two
	if f := a.leaser.Free(k); !f.IsZero() {
		t.Errorf("a's lapsed lease is valid again after the settlements and a renewal: free %s", f.Units)
	}

	// a admits what it can (from its lease, or from a fresh one), holding
	// the calls as calls in flight do.
	var stale []store.Reservation
	for range 3 {
		res, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve: %v %+v", err, res.Decision)
		}
		stale = append(stale, res)
	}
	served += len(stale)

	// b takes everything the database says is left.
	bServed := 0
	for range 1000 {
		res, err := b.Reserve(ctx, acct, units(1), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !res.Decision.Allowed {
			break
		}
		bServed++
		if _, err := b.Settle(ctx, res, units(1), entry); err != nil {
			t.Fatal(err)
		}
	}
	served += bServed
	for _, res := range stale {
		if _, err := a.Settle(ctx, res, units(1), entry); err != nil {
			t.Fatal(err)
		}
	}
	var used, leased int64
	var cut int
	b.pool.QueryRow(ctx, "SELECT used, leased_units FROM allowances WHERE user_id='u'").Scan(&used, &leased)
	b.pool.QueryRow(ctx, "SELECT count(*) FROM ledger WHERE entry ? 'unitsClaimed'").Scan(&cut)
	t.Logf("b served %d; calls served in all %d; used %s, leased %s, rows cut at the limit %d",
		bServed, served, billing.Units(used), billing.Units(leased), cut)
	// Units the calls consumed: the first call 2, every other 1. The
	// first call's extra unit may be cut (its lease had lapsed); nothing
	// admitted afterwards may be.
	if consumed := served + 1; consumed > quota {
		t.Errorf("calls served consumed %d units under a blocked quota of %d (a admitted calls from a lease the database had taken back)", consumed, quota)
	}
	if cut > 1 {
		t.Errorf("%d ledger rows cut at the limit; only the lapsed call's may be", cut)
	}
}

// TestLeaserLapsedLeaseStaysDead: the Leaser alone, on the simulation's
// database and a virtual clock. Once a lease's own deadline has passed it
// never admits again: a settlement past its hold leases nothing on the
// lapsed row (which would make a fresh row for the old holder), and a
// renewal sent after the deadline does not move it, even when the
// database still has the row. The next call starts a new row.
func TestLeaserLapsedLeaseStaysDead(t *testing.T) {
	ctx := context.Background()
	clock := time.Unix(1_000_000, 0)
	now := func() time.Time { return clock }
	db := &simDB{now: now, allow: map[AllowanceKey]*simAllow{}, leases: map[string]map[AllowanceKey]*simLease{}}
	const ttl = 10 * time.Second
	l := NewLeaser(db, "n", LeaseConfig{TTL: ttl, Max: units(100)}, now)
	k := AllowanceKey{"u", "svc", 0}
	lim := Limits{Units: ptr(units(1000))}

	h1, _, err := l.Take(ctx, k, lim, units(1))
	if err != nil {
		t.Fatal(err)
	}
	if l.Free(k).IsZero() {
		t.Fatal("no free units leased ahead")
	}

	// The renewals fail past the node's deadline (not past the row's).
	clock = clock.Add(ttl - ttl/20)
	if f := l.Free(k); !f.IsZero() {
		t.Fatalf("lapsed lease still admits: free %s", f.Units)
	}
	// A renewal gets through now: the row was alive, the lease is not.
	if _, err := l.Renew(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if f := l.Free(k); !f.IsZero() {
		t.Fatalf("a renewal sent after the deadline revived the lease: free %s", f.Units)
	}

	// The row expires and is swept; a call settles past its hold.
	clock = clock.Add(2 * ttl)
	db.sweep()
	grants := db.trips
	consume, covered, err := l.Settle(ctx, h1, lim, lim.Need(units(2)))
	if err != nil {
		t.Fatal(err)
	}
	if covered {
		t.Errorf("a charge past the hold of a lapsed lease counted as covered (consume %s)", consume.Units)
	}
	if db.trips != grants {
		t.Errorf("the settlement of a lapsed lease asked the database for more units")
	}
	if rows := db.leases[h1.Holder]; len(rows) != 0 {
		t.Errorf("the lapsed holder %s has a lease row again: %+v", h1.Holder, rows[k])
	}
	if _, err := l.Renew(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if f := l.Free(k); !f.IsZero() {
		t.Fatalf("the lapsed lease admits again after the settlements and a renewal: free %s", f.Units)
	}

	// The next call leases afresh, on a new row.
	h3, _, err := l.Take(ctx, k, lim, units(1))
	if err != nil {
		t.Fatal(err)
	}
	if h3.Holder == h1.Holder {
		t.Errorf("a new lease reuses the lapsed holder %s", h1.Holder)
	}
}

// TestGrantDoesNotReviveExpiredRow: grantSQL adds nothing to a lease row
// that has expired and leaves its expiry alone (its upsert moved the
// expiry on, reviving the row as a renewal never does): errLeaseExpired,
// the allowance untouched. (In a transaction that locks the rows first,
// so that no node's sweep gives the expired row back meanwhile.)
func TestGrantDoesNotReviveExpiredRow(t *testing.T) {
	ctx := context.Background()
	s := openNode(t, pgtest.DB(t), "a")
	subscribe(t, s, "u", "svc", "q")
	k := AllowanceKey{"u", "svc", 0}
	lim := Limits{Units: ptr(units(100))}
	big, small := Vec{Units: units(5)}, Vec{Units: units(1)}
	if g, err := (pgLeases{s}).Grant(ctx, "h/1", k, lim, big, small, time.Minute); err != nil || g.Granted != big {
		t.Fatalf("grant: %+v %v", g, err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, q := range []string{
		"SELECT 1 FROM subscriptions WHERE user_id = 'u' FOR UPDATE",
		"SELECT 1 FROM allowances WHERE user_id = 'u' FOR UPDATE",
		"UPDATE leases SET expires_at = now() - interval '1 second' WHERE holder = 'h/1'",
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	g, _, err := grant(ctx, tx, "h/1", k, lim, big, small, time.Minute)
	if !errors.Is(err, errLeaseExpired) || !g.Granted.IsZero() {
		t.Fatalf("grant on an expired row: %+v %v, want errLeaseExpired", g, err)
	}
	var leased, held int64
	var alive bool
	if err := tx.QueryRow(ctx, "SELECT leased_units FROM allowances WHERE user_id = 'u'").Scan(&leased); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "SELECT units, expires_at > now() FROM leases WHERE holder = 'h/1'").Scan(&held, &alive); err != nil {
		t.Fatal(err)
	}
	if leased != int64(big.Units) || held != int64(big.Units) || alive {
		t.Errorf("after a grant on the expired row: leased %s, the row holds %s, alive %v; want 5, 5, false",
			billing.Units(leased), billing.Units(held), alive)
	}
	// A new holder leases as usual.
	if g, _, err := grant(ctx, tx, "h/2", k, lim, big, small, time.Minute); err != nil || g.Granted != big {
		t.Fatalf("grant on a new holder: %+v %v", g, err)
	}
}

// lapseLeases makes a's lease rows expire and waits until b's sweep has
// taken them: a lost the database for longer than the TTL, as far as
// its lease rows go.
func lapseLeases(t *testing.T, a, b *Store) {
	t.Helper()
	ctx := context.Background()
	if _, err := a.pool.Exec(ctx, "UPDATE leases SET expires_at = now() - interval '1 second' WHERE holder LIKE $1",
		a.node+"/%"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM leases WHERE holder LIKE $1", a.node+"/%").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a's lease never swept")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
