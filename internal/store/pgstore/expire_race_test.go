package pgstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestJobExpiryOnEveryNodeAtOnce: every node runs the job expiry sweep
// (every 30 s). Three nodes sweeping 600 expired jobs at the same instant,
// while completions of the same jobs arrive on them too: each job ends
// once (failed by one sweep, or completed and charged once), every hold is
// released once, and the counters equal the ledger and lease rows (store
// check).
func TestJobExpiryOnEveryNodeAtOnce(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	nodes := []*Store{openNode(t, dsn, "a"), openNode(t, dsn, "b"), openNode(t, dsn, "c")}
	subscribe(t, nodes[0], "u", "svc", "pp")
	if _, err := nodes[0].AddCredits(ctx, "u", "svc", units(10000), time.Now()); err != nil {
		t.Fatal(err)
	}
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: prepaidProduct(1)}
	now := time.Now().UTC()
	const jobs = 600
	for i := range jobs {
		j := store.Job{ID: fmt.Sprintf("j%d", i), UserID: "u", ServiceID: "svc", Status: store.JobPending,
			CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
		if res, err := nodes[i%3].CreateJobReserved(ctx, j, acct, units(2), now); err != nil || !res.Decision.Allowed {
			t.Fatalf("job %d: %+v %v", i, res.Decision, err)
		}
	}
	later := now.Add(2 * time.Minute)
	var wg sync.WaitGroup
	var mu sync.Mutex
	expired, completed := 0, 0
	start := make(chan struct{})
	for _, s := range nodes {
		wg.Go(func() {
			<-start
			n, err := s.ExpireJobs(ctx, later, "expired")
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			expired += n
			mu.Unlock()
		})
	}
	// Completions of every tenth job race the sweeps (their deadline has
	// not passed on the completing node's clock here: they may win).
	for i := 0; i < jobs; i += 10 {
		s := nodes[(i+1)%3]
		wg.Go(func() {
			<-start
			_, err := s.CompleteJob(ctx, fmt.Sprintf("j%d", i), acct, store.LedgerEntry{UserID: "u", ServiceID: "svc",
				ProductID: "pp", Units: units(2), Source: store.SourceCompletion}, func(j *store.Job) error {
				if j.Terminal() {
					return store.ErrExists
				}
				j.Status = store.JobCompleted
				return nil
			})
			if err == nil {
				mu.Lock()
				completed++
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	t.Logf("%d expired, %d completed", expired, completed)
	if expired+completed != jobs {
		t.Errorf("%d expired + %d completed, want %d jobs ended once each", expired, completed, jobs)
	}
	var open, held, credits, rows int64
	if err := nodes[0].pool.QueryRow(ctx, "SELECT count(*) FROM jobs WHERE open").Scan(&open); err != nil {
		t.Fatal(err)
	}
	if err := nodes[0].pool.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions").Scan(&credits, &held); err != nil {
		t.Fatal(err)
	}
	if err := nodes[0].pool.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if open != 0 || held != 0 || rows != int64(completed) || credits != int64(units(10000-2*int64(completed))) {
		t.Errorf("after the sweeps: %d open jobs, %d credits held, %d ledger rows, balance %d; want 0, 0, %d, 10000 less 2 a completion",
			open, held, rows, credits, completed)
	}
	if rep, err := Check(ctx, dsn); err != nil {
		t.Errorf("store check: %v %+v", err, rep.Mismatches)
	}
}
