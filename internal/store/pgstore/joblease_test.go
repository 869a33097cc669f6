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

// jobLeaseSetup: a node whose lease on a quota of 100 has free units, one
// sync call holding a unit of it, and a job holding 2. It returns the
// node, the account, the sync call's reservation, the lease's allowance
// and the free units the lease has.
func jobLeaseSetup(t *testing.T) (*Store, store.Account, store.Reservation, AllowanceKey, billing.Units) {
	t.Helper()
	ctx := context.Background()
	s := openNode(t, pgtest.DB(t), "a")
	subscribe(t, s, "u", "svc", "q")
	a := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(100)}
	entry := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Source: store.SourceGateway}
	// Calls in quick succession grow the node's lease past what they use.
	for range 6 {
		r, err := s.Reserve(ctx, a, units(1), time.Now())
		if err != nil || !r.Decision.Allowed {
			t.Fatalf("reserve: %+v %v", r.Decision, err)
		}
		if _, err := s.Settle(ctx, r, units(1), entry); err != nil {
			t.Fatal(err)
		}
	}
	sync, err := s.Reserve(ctx, a, units(1), time.Now())
	if err != nil || !sync.Decision.Allowed {
		t.Fatalf("reserve: %+v %v", sync.Decision, err)
	}
	now := time.Now().UTC()
	j := store.Job{ID: "job", UserID: "u", ServiceID: "svc", EndpointID: "e", Status: store.JobPending,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if res, err := s.CreateJobReserved(ctx, j, a, units(2), now); err != nil || !res.Decision.Allowed {
		t.Fatalf("job: %+v %v", res.Decision, err)
	}
	sub, err := s.getSubscription(ctx, "u", "svc")
	if err != nil {
		t.Fatal(err)
	}
	k := AllowanceKey{"u", "svc", periodOf(a.Product, sub.StartedAt, now)}
	free := s.leaser.Free(k).Units
	if free < units(2) {
		t.Fatalf("the node's lease has %s free, want 2 or more for the test to mean anything", free)
	}
	return s, a, sync, k, free
}

func completeJob(s *Store, a store.Account, n billing.Units, fn func(*store.Job) error) (store.Job, error) {
	now := time.Now().UTC()
	if fn == nil {
		fn = func(j *store.Job) error { j.Status, j.CompletedAt = store.JobCompleted, now; return nil }
	}
	return s.CompleteJob(context.Background(), "job", a, store.LedgerEntry{UserID: "u", ServiceID: "svc", Units: n, Time: now}, fn)
}

// leaseRow is what the database counts as leased to the node on k, and
// the allowance's used and leased units.
func leaseRow(t *testing.T, s *Store, k AllowanceKey) (mine, used, leased billing.Units) {
	t.Helper()
	var m, u, l int64
	if err := s.pool.QueryRow(context.Background(), `SELECT coalesce(sum(units), 0) FROM leases
		WHERE holder LIKE $1 AND user_id = $2 AND service_id = $3 AND period = $4`,
		s.node+"/%", k.UserID, k.ServiceID, k.Period).Scan(&m); err != nil {
		t.Fatal(err)
	}
	if err := s.pool.QueryRow(context.Background(), `SELECT used, leased_units FROM allowances
		WHERE user_id = $1 AND service_id = $2 AND period = $3`, k.UserID, k.ServiceID, k.Period).Scan(&u, &l); err != nil {
		t.Fatal(err)
	}
	return billing.Units(m), billing.Units(u), billing.Units(l)
}

// serveUntilRefused serves sync calls of a unit until one is refused and
// returns how many were served.
func serveUntilRefused(t *testing.T, s *Store, a store.Account) billing.Units {
	t.Helper()
	ctx := context.Background()
	var served billing.Units
	for range 200 {
		r, err := s.Reserve(ctx, a, units(1), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !r.Decision.Allowed {
			return served
		}
		if _, err := s.Settle(ctx, r, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q"}); err != nil {
			t.Fatal(err)
		}
		served += units(1)
	}
	t.Fatal("never refused")
	return 0
}

// checkExactlyQuota: everything charged (the ledger, the allowance) is the
// quota of 100, never more.
func checkExactlyQuota(t *testing.T, s *Store, a store.Account, k AllowanceKey) {
	t.Helper()
	ctx := context.Background()
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var sum billing.Units
	if err := s.ScanLedger(ctx, store.LedgerFilter{UserID: "u"}, func(e store.LedgerEntry) error {
		sum += e.Units
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, used, _ := leaseRow(t, s, k)
	if sum != units(100) || used != units(100) {
		t.Fatalf("ledger %s, used %s: want exactly the quota of 100", sum, used)
	}
}

// TestJobCompletionTakesFreeLease: a job's completion past its hold near
// the limit is charged from the node's free leased units (as a sync call's
// settlement past its hold is), and the node serves nothing from them
// afterwards: with one call in flight, everything charged is the quota,
// never more.
func TestJobCompletionTakesFreeLease(t *testing.T) {
	ctx := context.Background()
	s, a, sync, k, free := jobLeaseSetup(t)
	mine, used, _ := leaseRow(t, s, k)
	// All that is left but the call in flight's unit: what the database
	// leaves (100 - used - the node's lease) plus the lease's free units.
	left := units(100) - used - mine + free
	j, err := completeJob(s, a, left+units(5), nil)
	if err != nil || j.Units != left {
		t.Fatalf("completion of %s = %s charged, %v; want %s (the node's %s free leased units used)", left+units(5), j.Units, err, left, free)
	}
	if f := s.leaser.Free(k); !f.IsZero() {
		t.Fatalf("the lease keeps %+v free after the completion took them", f)
	}
	if m, _, _ := leaseRow(t, s, k); m != units(1) {
		t.Fatalf("the node's lease row holds %s, want the call in flight's 1", m)
	}
	if _, err := s.Settle(ctx, sync, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q"}); err != nil {
		t.Fatal(err)
	}
	if n := serveUntilRefused(t, s, a); n != 0 {
		t.Fatalf("served %s more after the quota was charged", n)
	}
	checkExactlyQuota(t, s, a, k)
	var claimed billing.Units
	s.ScanLedger(ctx, store.LedgerFilter{UserID: "u"}, func(e store.LedgerEntry) error {
		claimed += e.UnitsClaimed
		return nil
	})
	if claimed != left+units(5) {
		t.Fatalf("unitsClaimed %s, want the completion's %s", claimed, left+units(5))
	}
}

// TestJobCompletionLeaseUnitsBackOnRollback: a completion whose
// transaction fails after it took the node's free leased units gives them
// back to the lease (and its row keeps them): the node serves them, and
// everything charged in the end is still the quota, never more.
func TestJobCompletionLeaseUnitsBackOnRollback(t *testing.T) {
	ctx := context.Background()
	s, a, sync, k, free := jobLeaseSetup(t)
	mine, used, leased := leaseRow(t, s, k)
	left := units(100) - used - mine + free

	// The job's update fails after the charge was worked out (the lease
	// row shrunk) in the same transaction.
	if _, err := s.pool.Exec(ctx, `CREATE FUNCTION fail_job() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'job update refused by the test'; END $$;
		CREATE TRIGGER fail_job BEFORE UPDATE ON jobs FOR EACH ROW WHEN (NOT NEW.open) EXECUTE FUNCTION fail_job()`); err != nil {
		t.Fatal(err)
	}
	if _, err := completeJob(s, a, left, nil); err == nil {
		t.Fatal("the completion succeeded through the failing trigger")
	}
	if f := s.leaser.Free(k).Units; f != free {
		t.Fatalf("after the rollback the lease has %s free, want its %s back", f, free)
	}
	if m, u, l := leaseRow(t, s, k); m != mine || u != used || l != leased {
		t.Fatalf("after the rollback: lease row %s used %s leased %s, want %s %s %s", m, u, l, mine, used, leased)
	}
	if _, err := s.pool.Exec(ctx, `DROP TRIGGER fail_job ON jobs`); err != nil {
		t.Fatal(err)
	}

	// The caller's change failing in the attempt that has the units: back too.
	calls := 0
	refuse := errors.New("refused by the test")
	_, err := completeJob(s, a, left, func(j *store.Job) error {
		calls++
		if calls > 1 {
			return refuse
		}
		j.Status = store.JobCompleted
		return nil
	})
	if !errors.Is(err, refuse) || calls != 2 {
		t.Fatalf("completion = %v after %d attempts, want the change's error on the second", err, calls)
	}
	if f := s.leaser.Free(k).Units; f != free {
		t.Fatalf("after the change failed the lease has %s free, want its %s back", f, free)
	}

	// The units back are served: the job completes within what the
	// database leaves, the lease's free units and the rest go to calls.
	j, err := completeJob(s, a, units(100)-used-mine, nil)
	if err != nil || j.Units != units(100)-used-mine {
		t.Fatalf("completion = %s charged, %v; want %s", j.Units, err, units(100)-used-mine)
	}
	if _, err := s.Settle(ctx, sync, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q"}); err != nil {
		t.Fatal(err)
	}
	if n, want := serveUntilRefused(t, s, a), free; n != want {
		t.Fatalf("served %s after the completion, want the lease's %s free units", n, want)
	}
	checkExactlyQuota(t, s, a, k)
}

// TestJobCompletionGetsOtherNodesIdleLease: a job's completion past its
// hold near the limit on node b, while node a holds a lease whose units
// it does not use, is charged in full: b asks the other nodes to give
// their unused leases on the allowance back and completes once they
// did (docs/fleet.md, "Async jobs"). It was cut by those units. A lease
// a call in flight holds units of is not given back: the completion is
// cut by it, and the call is charged in full.
func TestJobCompletionGetsOtherNodesIdleLease(t *testing.T) {
	for _, inFlight := range []bool{false, true} {
		name := "idle"
		if inFlight {
			name = "call in flight"
		}
		t.Run(name, func(t *testing.T) { testCompletionOtherNodesLease(t, inFlight) })
	}
}

func testCompletionOtherNodesLease(t *testing.T, inFlight bool) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a := openNode(t, dsn, "a")
	b := openNode(t, dsn, "b")
	subscribe(t, a, "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(100)}
	entry := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Source: store.SourceGateway}
	for range 7 { // a's lease grows past what its calls use
		r, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil || !r.Decision.Allowed {
			t.Fatalf("reserve: %+v %v", r.Decision, err)
		}
		if _, err := a.Settle(ctx, r, units(1), entry); err != nil {
			t.Fatal(err)
		}
	}
	var call store.Reservation
	if inFlight {
		var err error
		if call, err = a.Reserve(ctx, acct, units(1), time.Now()); err != nil || !call.Decision.Allowed {
			t.Fatalf("reserve: %+v %v", call.Decision, err)
		}
	}
	now := time.Now().UTC()
	j := store.Job{ID: "job", UserID: "u", ServiceID: "svc", EndpointID: "e", Status: store.JobPending,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if res, err := b.CreateJobReserved(ctx, j, acct, units(2), now); err != nil || !res.Decision.Allowed {
		t.Fatalf("job: %+v %v", res.Decision, err)
	}
	sub, err := a.getSubscription(ctx, "u", "svc")
	if err != nil {
		t.Fatal(err)
	}
	k := AllowanceKey{"u", "svc", periodOf(acct.Product, sub.StartedAt, now)}
	free := a.leaser.Free(k).Units
	if free < units(2) {
		t.Fatalf("a's lease has %s free, want 2 or more for the test to mean anything", free)
	}
	mine, used, _ := leaseRow(t, a, k)
	// Everything not used: the job's hold, a's lease and the rest.
	left := units(100) - used
	want := left
	if inFlight {
		want = left - mine // a's lease stays with a
	}
	done, err := completeJob(b, acct, left, nil)
	if err != nil || done.Units != want {
		t.Fatalf("completion of %s on b = %s charged, %v; want %s (a's lease holds %s, %s free)", left, done.Units, err, want, mine, free)
	}
	if inFlight {
		if _, err := a.Settle(ctx, call, units(1), entry); err != nil {
			t.Fatal(err)
		}
		if n := serveUntilRefused(t, a, acct); n != free {
			t.Fatalf("a served %s more, want its lease's %s free units", n, free)
		}
	} else if n := serveUntilRefused(t, a, acct); n != 0 {
		t.Fatalf("a served %s more after the quota was charged", n)
	}
	checkExactlyQuota(t, a, acct, k)
}
