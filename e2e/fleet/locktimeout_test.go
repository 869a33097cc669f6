package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/pgtest"
)

// TestFleetShipmentMeetsLockTimeout: the database has a lock_timeout (set
// by its operator, ALTER DATABASE … SET lock_timeout, so that no
// statement queues for ever behind a long transaction), and a session
// holds a subscription's row while a settle log node serves calls of it
// from its lease. Each shipment of those calls waits for the row and
// fails with lock_not_available. The node took that for a record the
// database rejects, tried each alone, met the same lock and released
// them from its settlement log: calls answered 200 and never charged.
// Once the lock is gone every served call must be in the ledger, once.
func TestFleetShipmentMeetsLockTimeout(t *testing.T) {
	dsn := fleetDB(t)
	db := dsn[strings.LastIndex(dsn, "/")+1:]
	if i := strings.IndexByte(db, '?'); i >= 0 {
		db = db[:i]
	}
	ctx := context.Background()
	if _, err := pgtest.Exec(ctx, dsn, `ALTER DATABASE "`+db+`" SET lock_timeout = '150ms'`); err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, dsn, 2, func(f *fleet) { f.leaseTTL = "30s" })
	a := f.nodes[0]
	key, _ := subscribe(t, a, "u-lock", "quota", 0)

	served := map[string]bool{}
	call := func() {
		t.Helper()
		r := invoke(a.base, key)
		if r.status != 200 {
			t.Fatalf("call answered %d %s %v", r.status, r.code, r.err)
		}
		served[r.requestID] = true
	}
	// The first call leases a block of two calls (a quota's grant takes
	// no lock on the subscription's row); it is shipped.
	call()
	if got := len(exportLedger(t, a, "u-lock")); got != 1 {
		t.Fatalf("%d ledger entries after the first call, want 1", got)
	}

	blocker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM subscriptions WHERE user_id = 'u-lock' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	call() // covered by the lease: acknowledged from the node's log
	time.Sleep(1500 * time.Millisecond)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	entries := exportLedger(t, f.nodes[1], "u-lock") // node B: what the database has
	deadline := time.Now().Add(10 * time.Second)
	for len(entries) < len(served) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		entries = exportLedger(t, f.nodes[1], "u-lock")
	}
	charged := map[string]int{}
	for _, e := range entries {
		charged[e.RequestID]++
	}
	for id := range served {
		if charged[id] != 1 {
			t.Errorf("call %s answered 200, charged %d times", id, charged[id])
		}
	}
	if len(entries) != len(served) {
		f.dump()
		t.Fatalf("%d ledger entries for %d calls served", len(entries), len(served))
	}
	if got := unitsUsed(t, f.nodes[1], "u-lock"); got != "2" {
		t.Errorf("units used %s, want 2", got)
	}
}
