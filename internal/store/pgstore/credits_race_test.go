package pgstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestCreditsChangedWhileNodesServe: an operator grants and takes back
// credits through one node while two others serve calls of the same
// prepaid balance from their leases, near its end. Whatever the order,
// the balance ends at what was granted less what was taken back less
// what the ledger charged, what is held is what lease rows hold (store
// check), and a balance used up (or taken below zero) refuses the next
// call.
func TestCreditsChangedWhileNodesServe(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	op, x, y := openNode(t, dsn, "op"), openNode(t, dsn, "x"), openNode(t, dsn, "y", func(o *Options) { o.LogDir = t.TempDir() })
	subscribe(t, op, "u", "svc", "pp")
	if _, err := op.AddCredits(ctx, "u", "svc", units(50), time.Now()); err != nil {
		t.Fatal(err)
	}
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: prepaidProduct(1)}
	entry := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}
	var served atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		s := []*Store{x, y}[i%2]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := s.Reserve(ctx, acct, units(1), time.Now())
				if err != nil {
					t.Error(err)
					return
				}
				if !res.Decision.Allowed {
					time.Sleep(time.Millisecond)
					continue
				}
				if _, err := s.Settle(ctx, res, units(1), entry); err != nil {
					t.Error(err)
					return
				}
				served.Add(1)
			}
		})
	}
	// The operator: +30, -20, +25, -40, +10 ... while they serve.
	granted := units(50)
	for _, d := range []int64{30, -20, 25, -40, 10, -5, 15, -30} {
		time.Sleep(20 * time.Millisecond)
		if _, err := op.AddCredits(ctx, "u", "svc", units(d), time.Now()); err != nil {
			t.Fatal(err)
		}
		granted += units(d)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if err := y.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	x.Close()
	y.Close()
	var charged billing.Units
	if err := op.ScanLedger(ctx, store.LedgerFilter{UserID: "u"}, func(e store.LedgerEntry) error {
		charged += e.Cost
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var credits, held int64
	if err := op.pool.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions").Scan(&credits, &held); err != nil {
		t.Fatal(err)
	}
	t.Logf("granted %s in all, %d calls served, %s charged; balance %s, held %s", granted, served.Load(), charged,
		billing.Units(credits), billing.Units(held))
	// Credits may stay held by lease rows of leases a take-back made
	// stale while their calls were in flight (kept until they expire,
	// docs/fleet.md); store check proves them against the rows.
	if billing.Units(credits) != granted-charged {
		t.Errorf("balance %s (held %s); want %s, granted less charged", billing.Units(credits), billing.Units(held), granted-charged)
	}
	if charged != units(served.Load()) {
		t.Errorf("%s charged for %d calls served", charged, served.Load())
	}
	if billing.Units(credits) < units(1) {
		// Taken back past what was left (allowed: the balance goes below
		// zero), or used up: one more call is refused on a new node.
		z := openNode(t, dsn, "z")
		if res, err := z.Reserve(ctx, acct, units(1), time.Now()); err != nil || res.Decision.Allowed {
			t.Errorf("a call at a balance of %s: %+v %v, want refused", billing.Units(credits), res.Decision, err)
		}
	}
	if rep, err := Check(ctx, dsn); err != nil {
		t.Errorf("store check: %v %+v", err, rep.Mismatches)
	}
}
