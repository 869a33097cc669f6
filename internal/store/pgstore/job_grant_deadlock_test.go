package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestJobCreationBesideALeaseGrant: an async job created on a node while
// a sync call of the same subscription on that node leases a block. The
// job's transaction took the allowance's row lock (its hold is a lease row
// granted by the same statement), then read what the node's own lease
// holds (Leaser.Mine) to show the caller its state, waiting for the
// lease's mutex; the sync call held that mutex across its grant, which
// waited in PostgreSQL for the row the job's transaction held. Neither
// PostgreSQL nor Go sees such a deadlock: it lasted until the sync
// caller's context ended (a client timeout; never, for a caller that
// waits), with the allowance's and subscription's rows locked meanwhile,
// so every node's grants and settlement shipments of the subscription
// stalled behind it (found by TestFleetMixedTrafficKeepsTheBooks: a job
// creation and the shipments of all three nodes stuck for the client's
// 15 s). Here the order is forced: a third transaction holds the
// allowance row while the job's grant and then the call's grant queue
// behind it.
func TestJobCreationBesideALeaseGrant(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	subscribe(t, a, "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(100)}
	// The allowance row exists (a call through b).
	res, err := b.Reserve(ctx, acct, units(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve on b: %+v %v", res.Decision, err)
	}
	k := AllowanceKey{"u", "svc", res.PeriodKey}

	// Another transaction holds the allowance row.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	lock, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, "SELECT 1 FROM allowances WHERE user_id = $1 AND service_id = $2 AND period = $3 FOR UPDATE",
		k.UserID, k.ServiceID, k.Period); err != nil {
		t.Fatal(err)
	}
	waiting := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			var w int
			// Asked outside the locking transaction, which would read
			// one snapshot of the statistics.
			if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&w); err != nil {
				t.Fatal(err)
			}
			if w >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d statements waiting for the row, want %d", w, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// The job's grant queues first, then the call's (holding its lease's
	// mutex through the round trip).
	now := time.Now().UTC()
	job := store.Job{ID: "j", UserID: "u", ServiceID: "svc", Status: store.JobPending, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	jobDone := make(chan error, 1)
	go func() {
		res, err := a.CreateJobReserved(ctx, job, acct, units(1), now)
		if err == nil && !res.Decision.Allowed {
			t.Errorf("job refused: %+v", res.Decision)
		}
		jobDone <- err
	}()
	waiting(1)
	callCtx, cancelCall := context.WithCancel(ctx)
	defer cancelCall()
	callDone := make(chan error, 1)
	go func() {
		res, err := a.Reserve(callCtx, acct, units(1), time.Now())
		if err == nil && !res.Decision.Allowed {
			t.Errorf("call refused: %+v", res.Decision)
		}
		callDone <- err
	}()
	waiting(2)
	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Both go through, the job first. Bounded only so that a deadlock
	// fails the test rather than hanging it: each takes milliseconds.
	select {
	case err := <-jobDone:
		if err != nil {
			t.Fatalf("job: %v", err)
		}
	case <-time.After(20 * time.Second):
		cancelCall() // ends the deadlock, so that the test can end
		t.Fatalf("the job's creation and the call's lease grant deadlocked (the job ended with %v once the call gave up)", <-jobDone)
	}
	if err := <-callDone; err != nil {
		t.Fatalf("call: %v", err)
	}
}
