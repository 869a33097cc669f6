package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestExpiredBlockPartlyReturnedAtAPriceChange: a node's block of credits
// leased before a grant's expiry is held, so the expiry defers that part
// of the grant; when the product's price then changes (a reload) with a
// call of the block in flight, the node gives back at once what no call
// holds (ReturnPart). What it gives back was the expired grant's and
// expires then, as when the whole block comes back: before, it went back
// into the balance and the caller kept it, and a call at the new price
// was served on credits that had expired.
func TestExpiredBlockPartlyReturnedAtAPriceChange(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	const leaseTTL = time.Second
	a := openNode(t, dsn, "a", func(o *Options) { o.LeaseMax, o.LeaseTTL = units(10), leaseTTL })
	const grant = 100
	now, acct, calls := heldAtExpiry(t, a, "pi_old", grant, 1)
	inFlight := calls[0]
	var held int64
	if err := a.pool.QueryRow(ctx, "SELECT credits_held FROM subscriptions WHERE user_id = 'u'").Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held <= int64(units(1)) {
		t.Fatalf("credits held %s: the test needs a block larger than the call", billing.Units(held))
	}
	expired, err := a.ExpireCredits(ctx, now.Add(time.Minute))
	if err != nil || len(expired) != 1 || expired[0].Deferred != billing.Units(held) {
		t.Fatalf("expire: %+v %v; want %s deferred (the block)", expired, err, billing.Units(held))
	}

	// The price doubles; the block's leftover comes back at once. Every
	// credit left was the expired grant's: the call at the new price is
	// refused.
	dear := acct
	dear.Product = prepaidProduct(2)
	res, err := a.Reserve(ctx, dear, units(1), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision.Allowed {
		t.Errorf("a call at the new price was served on credits of the expired grant: %+v", res.Decision)
		if _, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Settle(ctx, inFlight, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	c := openNode(t, dsn, "c")
	// A row the node no longer tracks (its lease restarted under the new
	// price) ends at its expiry, by any node's sweep (sweepExpired's
	// return, here at once): the last of the expiry's holds, which closes
	// it.
	time.Sleep(leaseTTL + 100*time.Millisecond)
	rows, err := c.pool.Query(ctx, expiredSQL)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := pgx.CollectRows(rows, scanLeaseRef)
	if err != nil || len(refs) != 1 {
		t.Fatalf("expired lease rows %+v, %v; want the one of node a", refs, err)
	}
	if n, err := c.returnLeases(ctx, refs, true); err != nil || n != 1 {
		t.Fatalf("sweep: %d rows, %v", n, err)
	}
	var credits, creditsHeld int64
	if err := c.pool.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions WHERE user_id = 'u' AND service_id = 'svc'").
		Scan(&credits, &creditsHeld); err != nil {
		t.Fatal(err)
	}
	if credits != 0 || creditsHeld != 0 {
		t.Errorf("after settling: credits %s, held %s; want 0 and 0 (%d granted, 1 spent, the rest expired)",
			billing.Units(credits), billing.Units(creditsHeld), grant)
	}
	gs, err := c.ListCreditGrants(ctx, "u", "svc")
	if err != nil || len(gs) != 1 || gs[0].Expired != units(grant-1) || gs[0].Deferred != 0 {
		t.Errorf("the grant after the block came back = %+v, %v; want %d expired, nothing deferred", gs, err, grant-1)
	}
}
