package pgstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestLeaseNotReturnedIdleBeforeGroupCommit: under settle commit (no
// settlement log), a lease whose calls have settled in memory but whose
// charges still wait for the group commit must not be given back as idle.
// It was (held zero, lastUse old, Busy only knew the settlement log): the
// units those charges consume went back to the allowance, another node
// leased and served them, and the charges, committed later, found no lease
// row and were cut at the limit: served past a blocked quota, never
// charged (found by a review of the fleet's leases). Here the group commit
// is delayed by a batch of another subscription waiting on a row lock (a
// slow commit, or a database away a few seconds, does the same).
func TestLeaseNotReturnedIdleBeforeGroupCommit(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	subscribe(t, a, "u", "svc", "q")
	subscribe(t, a, "u2", "svc", "post")
	const quota = 20
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(quota)}
	post := store.Account{UserID: "u2", ServiceID: "svc", Product: billing.Product{ID: "post", BillingModel: billing.UsagePostpaid,
		MeasurementType: billing.PerRequest, Price: units(1)}}
	entry := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Source: store.SourceGateway}

	// a serves 4 calls of u (in flight).
	var inflight []store.Reservation
	for range 4 {
		res, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve: %v %+v", err, res.Decision)
		}
		inflight = append(inflight, res)
	}
	// Something holds u2's subscription row (a long transaction, another
	// node's batch): a's settlement loop blocks on u2's batch.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM subscriptions WHERE user_id = 'u2' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	pres, err := a.Reserve(ctx, post, units(1), time.Now())
	if err != nil || !pres.Decision.Allowed {
		t.Fatalf("reserve u2: %v %+v", err, pres.Decision)
	}
	wg.Go(func() {
		a.Settle(ctx, pres, units(1), store.LedgerEntry{UserID: "u2", ServiceID: "svc", ProductID: "post", Source: store.SourceGateway})
	})
	time.Sleep(200 * time.Millisecond) // u2's batch is in the database, waiting
	// u's four calls end: their charges queue behind it.
	for _, res := range inflight {
		wg.Go(func() {
			if _, err := a.Settle(ctx, res, units(1), entry); err != nil {
				t.Errorf("settle: %v", err)
			}
		})
	}
	time.Sleep(3500 * time.Millisecond) // past leaseIdle and a renewal
	var used, leased int64
	b.pool.QueryRow(ctx, "SELECT used, leased_units FROM allowances WHERE user_id='u'").Scan(&used, &leased)
	t.Logf("while a's charges wait: used %s, leased %s", billing.Units(used), billing.Units(leased))
	if leased < int64(units(4)) {
		t.Errorf("a's lease was given back while its four charges waited for the group commit: leased %s", billing.Units(leased))
	}

	bServed := 0
	for range 100 {
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
	tx.Commit(ctx)
	wg.Wait()
	var cut int
	b.pool.QueryRow(ctx, "SELECT used, leased_units FROM allowances WHERE user_id='u'").Scan(&used, &leased)
	b.pool.QueryRow(ctx, "SELECT count(*) FROM ledger WHERE user_id = 'u' AND entry ? 'unitsClaimed'").Scan(&cut)
	served := len(inflight) + bServed
	t.Logf("b served %d; calls served in all %d under a quota of %d; used %s, leased %s; rows cut to fit: %d",
		bServed, served, quota, billing.Units(used), billing.Units(leased), cut)
	if served > quota || cut > 0 {
		t.Errorf("%d calls served under a blocked quota of %d (%d charged short)", served, quota, cut)
	}
}

// TestLeaserSettlePastHoldNotIdle: a settlement for more than its hold
// counts as a use of the lease, as one within its hold does. It did not:
// between Leaser.Settle (the call's units out of held) and the charge
// reaching the settlement log or the group commit's count, a renewal could
// find the lease idle (nothing held, last used when the call began) and
// give its row back.
func TestLeaserSettlePastHoldNotIdle(t *testing.T) {
	ctx := context.Background()
	clock := time.Unix(1_000_000, 0)
	now := func() time.Time { return clock }
	db := &simDB{now: now, allow: map[AllowanceKey]*simAllow{}, leases: map[string]map[AllowanceKey]*simLease{}}
	l := NewLeaser(db, "n", LeaseConfig{TTL: 30 * time.Second, Max: units(100)}, now)
	k := AllowanceKey{"u", "svc", 0}
	lim := Limits{Units: ptr(units(1000))}
	for _, charge := range []int64{2, 50} { // from the free units; leased for it
		h, _, err := l.Take(ctx, k, lim, units(1))
		if err != nil {
			t.Fatal(err)
		}
		clock = clock.Add(3 * time.Second) // a long call
		if _, covered, err := l.Settle(ctx, h, lim, lim.Need(units(charge))); err != nil || !covered {
			t.Fatalf("settle %d units: covered %v, %v", charge, covered, err)
		}
		if n, err := l.Renew(ctx, 2*time.Second); err != nil || n != 0 {
			t.Fatalf("a renewal just after a settlement of %d units past its hold returned %d leases as idle (%v)", charge, n, err)
		}
	}
}
