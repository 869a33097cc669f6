package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestShippedRecordWithoutSubscriptionKept: a settlement acknowledged
// from the settlement log whose subscription is gone when it is shipped
// (its row deleted by hand, a database restored from before it was made)
// is recorded in the ledger, charged nothing, with its units in
// unitsClaimed. It was logged and released from the log with the others:
// an acknowledged charge lost without a trace in the ledger. The other
// records of its shipment are written as usual.
func TestShippedRecordWithoutSubscriptionKept(t *testing.T) {
	ctx := context.Background()
	a := openNode(t, pgtest.DB(t), "a", func(o *Options) {
		o.LogDir, o.ShipInterval, o.LeaseMax = t.TempDir(), time.Hour, units(10)
	})
	subscribe(t, a, "u", "svc", "q")
	subscribe(t, a, "v", "svc", "q")
	gone := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(50)}
	kept := store.Account{UserID: "v", ServiceID: "svc", Product: quotaProduct(50)}
	var res []store.Reservation
	for _, acct := range []store.Account{gone, kept} {
		r, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil || !r.Decision.Allowed {
			t.Fatalf("reserve: %v %+v", err, r.Decision)
		}
		res = append(res, r)
	}
	if _, err := a.pool.Exec(ctx, "DELETE FROM subscriptions WHERE user_id = 'u'"); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, acct := range []store.Account{gone, kept} {
		e, err := a.Settle(ctx, res[i], units(1), store.LedgerEntry{UserID: acct.UserID, ServiceID: "svc", ProductID: "q", Source: store.SourceGateway})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.ID)
	}
	if n := a.Unshipped(); n != 2 {
		t.Fatalf("%d settlements unshipped, want 2", n)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := a.Unshipped(); n != 0 {
		t.Fatalf("%d settlements unshipped after the flush", n)
	}
	for i, user := range []string{"u", "v"} {
		var n int
		var units, claimed int64
		if err := a.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum((entry->>'units')::bigint), 0), coalesce(sum((entry->>'unitsClaimed')::bigint), 0)
			FROM ledger WHERE user_id = $1`, user).Scan(&n, &units, &claimed); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s (acknowledged as %s): %d ledger rows, units %d, claimed %d", user, ids[i], n, units, claimed)
		if n != 1 {
			t.Errorf("user %s: %d ledger rows for its acknowledged call, want 1", user, n)
		}
	}
}
