package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// A shipment that waits for a row lock longer than the database's
// lock_timeout (a setting operators give a role or a database, so that no
// statement queues behind a long transaction for ever) fails with
// 55P03 lock_not_available, a transient condition like a dropped
// connection. The shipper took it for a statement that rejects the
// records themselves: it tried each record alone, met the same lock, and
// released them from the settlement log, so the calls it had already
// acknowledged were never charged. They must stay in the log and be
// shipped once the lock is gone, each once.
func TestShipmentLockTimeoutKeepsSettlements(t *testing.T) {
	dsn := pgtest.DB(t)
	dir := t.TempDir()
	// lock_timeout as a run-time parameter of the node's connections.
	a := openNode(t, dsn+"&lock_timeout=150ms", "a", func(o *Options) {
		o.LogDir, o.ShipInterval, o.LeaseMax = dir, 20*time.Millisecond, units(20)
	})
	subscribe(t, a, "u", "svc", "q")
	quota := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(50)}
	ctx := context.Background()
	acked := map[string]bool{}
	// The first calls lease a block (the grant takes no lock on the
	// subscription's row for a quota) and are shipped.
	for range 2 {
		acked[call(t, a, quota).ID] = true
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// Another session holds the subscription's row (an operator's open
	// transaction, a long report): every shipment now waits for it and
	// times out.
	blocker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM subscriptions WHERE user_id = 'u' AND service_id = 'svc' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	// Covered by the block leased above: acknowledged from the log.
	for range 2 {
		acked[call(t, a, quota).ID] = true
	}
	time.Sleep(1500 * time.Millisecond) // several shipments meet the lock
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := a.Flush(fctx); err != nil {
		t.Fatalf("flush after the lock: %v", err)
	}
	n, sum, _, ids := ledgerOf(t, a, quota)
	for id := range acked {
		if !ids[id] {
			t.Errorf("acknowledged call %s is not in the ledger", id)
		}
	}
	if n != 4 || sum != units(4) {
		t.Fatalf("ledger: %d entries of %s units, want the 4 acknowledged calls", n, sum)
	}
	st, err := a.State(ctx, quota, time.Now())
	if err != nil || st.Used != units(4) {
		t.Fatalf("counters: %+v %v, want 4 used", st, err)
	}
}
