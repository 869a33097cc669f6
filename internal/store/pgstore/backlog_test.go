package pgstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// A settle commit node with more calls served while PostgreSQL is down
// than its group commit holds (maxWaiting: a batch being retried and a
// full queue). Every Settle answers within settleWait (the settlement
// kept: ErrSettlementPending); a call admitted once maxWaiting wait is
// refused (ErrUnavailable, before it is forwarded); once the database is
// back every kept settlement is written exactly once. Before, a Settle
// past maxWaiting waited to be queued until the database answered, and
// the calls went on being admitted.
func TestSettleCommitBacklogPastBound(t *testing.T) {
	old := settleWait
	settleWait = time.Second
	t.Cleanup(func() { settleWait = old })
	c := pgtest.Cluster(t, clusterPort())
	dsn := c.DB("pgstore")
	a := openNode(t, dsn, "a", func(o *Options) {
		o.LogDir, o.SettleCommit, o.LeaseTTL = t.TempDir(), true, time.Minute
	})
	ctx := context.Background()
	subscribe(t, a, "u", "svc", "free")
	acct := store.Account{UserID: "u", ServiceID: "svc",
		Product: billing.Product{ID: "free", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest}}
	call(t, a, acct)

	const calls = maxWaiting + 200
	ress := make([]store.Reservation, calls)
	for i := range ress {
		res, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve: %+v %v", res.Decision, err)
		}
		ress[i] = res
	}
	c.Stop()
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := map[string]int{}
	for _, res := range ress {
		wg.Go(func() {
			_, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "free", RequestID: res.ID,
				Source: store.SourceGateway})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				answered["written"]++
			case errors.Is(err, store.ErrSettlementPending):
				answered["kept"]++
			default:
				answered[err.Error()]++
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(settleWait + 10*time.Second):
		mu.Lock()
		t.Errorf("%v answered within %v; the others still wait, the database down", answered, settleWait+10*time.Second)
		mu.Unlock()
	}
	if _, err := a.Reserve(ctx, acct, units(1), time.Now()); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("a call admitted with %d settlements waiting for the database: %v", a.settle.waiting.Load(), err)
	}

	c.Start()
	<-done
	t.Logf("settlements answered with the database down: %v", answered)
	if answered["kept"]+answered["written"] != calls {
		t.Errorf("answers %v, want %d kept", answered, calls)
	}
	for deadline := time.Now().Add(30 * time.Second); a.settle.waiting.Load() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d settlements still wait with the database back", a.settle.waiting.Load())
		}
	}
	ids := map[string]int{}
	if err := a.ScanLedger(ctx, store.LedgerFilter{UserID: "u", ServiceID: "svc"}, func(e store.LedgerEntry) error {
		ids[e.RequestID]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var n, twice int
	for _, c := range ids {
		n += c
		if c > 1 {
			twice++
		}
	}
	if n != calls+1 || twice > 0 {
		t.Errorf("the ledger holds %d entries (%d calls twice); %d calls served", n, twice, calls+1)
	}
}
