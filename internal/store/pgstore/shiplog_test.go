package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// call reserves and settles one unit on s; the settlement must be
// acknowledged.
func call(t *testing.T, s *Store, a store.Account) store.LedgerEntry {
	t.Helper()
	ctx := context.Background()
	res, err := s.Reserve(ctx, a, units(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve: %+v %v", res.Decision, err)
	}
	e, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: a.UserID, ServiceID: a.ServiceID, ProductID: a.Product.ID,
		Source: store.SourceGateway})
	if err != nil || e.Units != units(1) {
		t.Fatalf("settle: %+v %v", e, err)
	}
	return e
}

// tryCall reserves one unit on s and, when the call is admitted, settles
// it; false when the reservation is refused. A failed settlement fails t.
func tryCall(t *testing.T, s *Store, a store.Account) bool {
	t.Helper()
	ctx := context.Background()
	res, err := s.Reserve(ctx, a, units(1), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !res.Decision.Allowed {
		return false
	}
	if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: a.UserID, ServiceID: a.ServiceID, ProductID: a.Product.ID,
		Source: store.SourceGateway}); err != nil {
		t.Fatal(err)
	}
	return true
}

// ledgerOf reads the ledger of a subscription: its entries by call, and
// the sums of units and costs.
func ledgerOf(t *testing.T, s *Store, a store.Account) (n int, sum, cost billing.Units, ids map[string]bool) {
	t.Helper()
	ids = map[string]bool{}
	err := s.ScanLedger(context.Background(), store.LedgerFilter{UserID: a.UserID, ServiceID: a.ServiceID}, func(e store.LedgerEntry) error {
		n++
		sum += e.Units
		cost += e.Cost
		if ids[e.ID] {
			t.Errorf("ledger id %s twice", e.ID)
		}
		ids[e.ID] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n, sum, cost, ids
}

// A node killed with settlements in its log that PostgreSQL does not have
// yet, some shipped and some not: at restart every acknowledged call is
// charged once, with the ledger id it was acknowledged with, the counters
// equal the ledger and the dead incarnation's lease is given back.
func TestSettleLogKillRestart(t *testing.T) {
	dsn := pgtest.DB(t)
	dir := t.TempDir()
	slow := func(o *Options) {
		o.LogDir, o.ShipInterval, o.LeaseMax = dir, time.Hour, units(10)
	}
	a := openNode(t, dsn, "a", slow)
	subscribe(t, a, "u", "svc", "q")
	subscribe(t, a, "u", "pp", "pp")
	if _, err := a.AddCredits(context.Background(), "u", "pp", units(100), time.Now()); err != nil {
		t.Fatal(err)
	}
	quota := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(50)}
	pre := store.Account{UserID: "u", ServiceID: "pp", Product: prepaidProduct(2)}
	acked := map[string]bool{}
	for range 7 {
		acked[call(t, a, quota).ID] = true
		acked[call(t, a, pre).ID] = true
	}
	// Shipped, but still in the log's current segment: the replay meets
	// them again.
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 13 {
		acked[call(t, a, quota).ID] = true
		acked[call(t, a, pre).ID] = true
	}
	if a.Unshipped() != 26 {
		t.Fatalf("%d settlements unshipped, want 26", a.Unshipped())
	}
	if len(acked) != 40 {
		t.Fatalf("%d distinct ledger ids acknowledged, want 40", len(acked))
	}
	a.abandon() // kill -9: nothing more shipped, no lease given back

	// What PostgreSQL has before the restart: the unshipped calls' units
	// are still leased, never free for another node.
	b := openNode(t, dsn, "b")
	st, err := b.State(context.Background(), quota, time.Now())
	if err != nil || st.Used != units(7) || st.Used+st.Reserved > units(50) || st.Used+st.Reserved < units(20) {
		t.Fatalf("before the restart: %+v %v", st, err)
	}

	for round := range 2 {
		a2 := openNode(t, dsn, "a", slow)
		for _, acct := range []store.Account{quota, pre} {
			n, sum, cost, ids := ledgerOf(t, a2, acct)
			if n != 20 || sum != units(20) {
				t.Fatalf("round %d, %s: %d entries of %s units, want 20", round, acct.ServiceID, n, sum)
			}
			for id := range ids {
				if !acked[id] {
					t.Errorf("ledger id %s was not acknowledged", id)
				}
			}
			st, err := a2.State(context.Background(), acct, time.Now())
			if err != nil || st.Used != sum || st.Spend != cost {
				t.Fatalf("round %d, %s: counters %+v (%v), ledger %s units %s cost", round, acct.ServiceID, st, err, sum, cost)
			}
			if st.Reserved != 0 || st.CreditsHeld != 0 {
				t.Errorf("round %d, %s: the dead incarnation's lease is still held: %+v", round, acct.ServiceID, st)
			}
			if acct.ServiceID == "pp" && st.Credits != units(100)-cost {
				t.Errorf("credits %s, want %s", st.Credits, units(100)-cost)
			}
		}
		if a2.Unshipped() != 0 {
			t.Fatalf("unshipped after the restart: %d", a2.Unshipped())
		}
		if err := a2.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// The database down: calls the lease covers are acknowledged from the log
// and shipped once it is back, each once; the node needs no restart.
func TestSettleLogDatabaseDown(t *testing.T) {
	c := pgtest.Cluster(t, clusterPort())
	dsn := c.DB("pgstore")
	s := openNode(t, dsn, "a", func(o *Options) {
		o.LogDir, o.ShipInterval, o.LeaseMax, o.LeaseTTL = t.TempDir(), 20*time.Millisecond, units(100), 30*time.Second
	})
	subscribe(t, s, "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)}
	for range 20 {
		call(t, s, acct)
	}
	c.Stop()
	// Acknowledged from the log, the database down, as long as the lease
	// has units.
	down := 0
	for ; down < 30; down++ {
		res, err := s.Reserve(context.Background(), acct, units(1), time.Now())
		if err != nil {
			break
		}
		if !res.Decision.Allowed {
			t.Fatalf("refused: %+v", res.Decision)
		}
		if _, err := s.Settle(context.Background(), res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q"}); err != nil {
			t.Fatalf("settle from the lease, the database down: %v", err)
		}
	}
	if down == 0 {
		t.Fatal("no call served from the lease with the database down")
	}
	time.Sleep(300 * time.Millisecond) // the shipper fails a few times
	if s.Unshipped() == 0 {
		t.Fatal("everything shipped with the database down")
	}
	c.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("not shipped after the database came back: %v (%d left)", err, s.Unshipped())
	}
	n, sum, _, _ := ledgerOf(t, s, acct)
	st, err := s.State(context.Background(), acct, time.Now())
	want := 20 + down
	if err != nil || n != want || sum != units(int64(want)) || st.Used != units(int64(want)) {
		t.Fatalf("after the database came back: %d entries, %s units, state %+v (%v); want %d", n, sum, st, err, want)
	}
	if st.Used+st.Reserved > units(1000) {
		t.Fatalf("state %+v", st)
	}
}
