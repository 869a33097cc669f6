package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestRollupsReadOwnSettlements: under settle log a node acknowledges a
// call from its settlement log and ships it within ship_interval. Its
// ledger reads ship first, so it reads its own writes (docs/fleet.md,
// "What a node reads"); its rollup reads did not: right after a call, the
// hourly rollups a node served (GET /platform/usage?rollup=hour, the
// console's and the portal's charts) left out the calls its ledger export
// listed, on the same node at the same moment. A shipment interval long
// enough that nothing ships by itself makes it plain.
func TestRollupsReadOwnSettlements(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a := openNode(t, dsn, "a", func(o *Options) { o.LogDir, o.ShipInterval = t.TempDir(), time.Hour })
	subscribe(t, a, "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(100)}
	for range 3 {
		res, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve: %+v %v", res.Decision, err)
		}
		if _, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q",
			EndpointID: "e", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	var calls int64
	if err := a.ScanRollups(ctx, store.RollupFilter{UserID: "u"}, func(r store.Rollup) error {
		calls += r.Calls
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rows := 0
	if err := a.ScanLedger(ctx, store.LedgerFilter{UserID: "u"}, func(store.LedgerEntry) error { rows++; return nil }); err != nil {
		t.Fatal(err)
	}
	if calls != int64(rows) || rows != 3 {
		t.Errorf("the node's rollups count %d calls, its ledger %d rows, right after 3 calls it acknowledged; want 3 and 3", calls, rows)
	}
}
