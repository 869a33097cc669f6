package pgstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

func quotaProduct(q int64) billing.Product {
	return billing.Product{ID: "q", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: ptr(units(q))}
}

func prepaidProduct(price int64) billing.Product {
	return billing.Product{ID: "pp", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: units(price)}
}

func capProduct(price, cap int64) billing.Product {
	return billing.Product{ID: "cap", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: units(price), SpendingCap: ptr(units(cap))}
}

// race runs callers goroutines spread over nodes, each calling (reserve,
// then settle the units reserved) until refused, and returns the calls
// served.
func race(t *testing.T, nodes []*Store, callers int, a store.Account) int64 {
	t.Helper()
	var served atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		s := nodes[i%len(nodes)]
		wg.Go(func() {
			for range 1000 { // bounded: far more than any limit here
				res, err := s.Reserve(context.Background(), a, units(1), time.Now())
				dec := res.Decision
				if err != nil {
					errs <- err
					return
				}
				if !dec.Allowed {
					return
				}
				served.Add(1)
				if _, err := s.Settle(context.Background(), res, units(1), store.LedgerEntry{UserID: a.UserID, ServiceID: a.ServiceID,
					ProductID: a.Product.ID, Source: store.SourceGateway}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return served.Load()
}

func threeNodes(t *testing.T, tune ...func(*Options)) (string, []*Store) {
	dsn := pgtest.DB(t)
	var nodes []*Store
	for _, n := range []string{"a", "b", "c"} {
		nodes = append(nodes, openNode(t, dsn, n, tune...))
	}
	return dsn, nodes
}

// 300 callers over three nodes against a quota of 100: exactly 100 served,
// 100 used, nothing left leased once the nodes close.
func TestRaceQuotaAcrossNodes(t *testing.T) {
	_, nodes := threeNodes(t)
	subscribe(t, nodes[0], "u", "svc", "q")
	a := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(100)}
	if got := race(t, nodes, 300, a); got != 100 {
		t.Fatalf("served %d calls against a quota of 100", got)
	}
	st, err := nodes[1].State(context.Background(), a, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.Used != units(100) {
		t.Fatalf("used %s, want 100", st.Used)
	}
	var ledger int
	nodes[2].ScanLedger(context.Background(), store.LedgerFilter{UserID: "u"}, func(e store.LedgerEntry) error {
		ledger++
		return nil
	})
	if ledger != 100 {
		t.Fatalf("%d ledger entries, want 100", ledger)
	}
	for _, n := range nodes {
		n.Close()
	}
	s := openNode(t, nodes[0].opts.DSN, "check")
	st, _ = s.State(context.Background(), a, time.Now())
	if st.Reserved != 0 {
		t.Fatalf("%s units still leased after every node closed", st.Reserved)
	}
}

// A prepaid balance of 50 credits at 1 credit a call: 50 served, the
// balance 0, never negative.
func TestRacePrepaidAcrossNodes(t *testing.T) {
	_, nodes := threeNodes(t)
	subscribe(t, nodes[0], "u", "svc", "pp")
	if _, err := nodes[0].AddCredits(context.Background(), "u", "svc", units(50), time.Now()); err != nil {
		t.Fatal(err)
	}
	a := store.Account{UserID: "u", ServiceID: "svc", Product: prepaidProduct(1)}
	if got := race(t, nodes, 300, a); got != 50 {
		t.Fatalf("served %d calls on 50 credits", got)
	}
	for _, n := range nodes {
		n.Close()
	}
	s := openNode(t, nodes[0].opts.DSN, "check")
	sub, err := s.GetSubscription(context.Background(), "u", "svc")
	if err != nil || sub.Credits != 0 || sub.CreditsHeld != 0 {
		t.Fatalf("after the race: %+v %v", sub, err)
	}
}

// A spending cap of 60 at 2 a call: 30 served, spend 60.
func TestRaceSpendingCapAcrossNodes(t *testing.T) {
	_, nodes := threeNodes(t)
	subscribe(t, nodes[0], "u", "svc", "cap")
	a := store.Account{UserID: "u", ServiceID: "svc", Product: capProduct(2, 60)}
	if got := race(t, nodes, 300, a); got != 30 {
		t.Fatalf("served %d calls under a cap of 60 at 2 each", got)
	}
	st, err := nodes[0].State(context.Background(), a, time.Now())
	if err != nil || st.Spend != units(60) {
		t.Fatalf("spend %s (%v), want 60", st.Spend, err)
	}
}

// Closing a node gives its unused units back at once.
func TestLeaseReturnedOnClose(t *testing.T) {
	dsn := pgtest.DB(t)
	a := openNode(t, dsn, "a")
	subscribe(t, a, "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)}
	res, err := a.Reserve(context.Background(), acct, units(1), time.Now())
	dec := res.Decision
	if err != nil || !dec.Allowed {
		t.Fatal(dec, err)
	}
	check := openNode(t, dsn, "check")
	st, _ := check.State(context.Background(), acct, time.Now())
	if st.Reserved != units(2) {
		t.Fatalf("leased %s after the first call, want a first block of two calls", st.Reserved)
	}
	if _, err := a.Settle(context.Background(), res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	st, _ = check.State(context.Background(), acct, time.Now())
	if st.Reserved != 0 || st.Used != units(1) {
		t.Fatalf("after close: used %s leased %s, want 1 and 0", st.Used, st.Reserved)
	}
}

// A node that dies strands at most its lease, and only until it expires:
// another node then serves the whole quota, never more.
func TestDeadNodeStrandsItsLeaseUntilExpiry(t *testing.T) {
	dsn := pgtest.DB(t)
	ttl := func(o *Options) { o.LeaseTTL = 2 * time.Second; o.LeaseMax = units(10) }
	a := openNode(t, dsn, "a", ttl)
	b := openNode(t, dsn, "b", ttl)
	subscribe(t, a, "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(50)}
	for range 10 {
		res, err := a.Reserve(context.Background(), acct, units(1), time.Now())
		dec := res.Decision
		if err != nil || !dec.Allowed {
			t.Fatal(dec, err)
		}
		if _, err := a.Settle(context.Background(), res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc"}); err != nil {
			t.Fatal(err)
		}
	}
	a.refills.Wait() // a refill in flight lands before the node dies
	a.abandon()      // killed: no lease given back
	st, err := b.State(context.Background(), acct, time.Now())
	if err != nil || st.Used != units(10) || st.Reserved <= 0 || st.Reserved > units(10) {
		t.Fatalf("after a died: used %s, stranded %s (%v); want 10 used and a lease of at most lease_max stranded", st.Used, st.Reserved, err)
	}
	stranded := int64(st.Reserved / billing.Scale)
	served := race(t, []*Store{b}, 20, acct)
	if served != 40-stranded {
		t.Fatalf("b served %d while a's %d units were stranded, want %d", served, stranded, 40-stranded)
	}
	deadline := time.Now().Add(10 * time.Second)
	for served < 40 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		served += race(t, []*Store{b}, 5, acct)
	}
	if served != 40 {
		t.Fatalf("b served %d once a's lease expired, want 40", served)
	}
	st, _ = b.State(context.Background(), acct, time.Now())
	if st.Used != units(50) {
		t.Fatalf("used %s, want 50", st.Used)
	}
}

func TestSettleTwiceAndReleases(t *testing.T) {
	dsn := pgtest.DB(t)
	a := openNode(t, dsn, "a")
	subscribe(t, a, "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(10)}
	ctx := context.Background()
	res, err := a.Reserve(ctx, acct, units(3), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	e, err := a.Settle(ctx, res, units(5), store.LedgerEntry{UserID: "u", ServiceID: "svc"})
	if err != nil || e.Units != units(5) || e.ID == "" {
		t.Fatalf("settle more than held, within the quota: %+v %v", e, err)
	}
	if _, err := a.Settle(ctx, res, units(1), store.LedgerEntry{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second settle: %v", err)
	}
	res, _ = a.Reserve(ctx, acct, units(1), time.Now())
	e, err = a.Settle(ctx, res, units(20), store.LedgerEntry{UserID: "u", ServiceID: "svc"})
	if err != nil || e.Units != units(5) || e.UnitsClaimed != units(20) {
		t.Fatalf("settle past the quota is capped: %+v %v", e, err)
	}
	res, _ = a.Reserve(ctx, acct, units(1), time.Now())
	dec := res.Decision
	if dec.Allowed || dec.Code != billing.CodeQuotaExceeded {
		t.Fatalf("after the quota: %+v %+v", dec, res)
	}
	if _, err := a.Reserve(ctx, store.Account{UserID: "x", ServiceID: "svc", Product: quotaProduct(1)}, units(1), time.Now()); !errors.Is(err, store.ErrNoAccount) {
		t.Fatalf("no subscription: %v", err)
	}
}

// Batches that settle calls of several subscriptions consume each call's
// units from its own lease row: what the database holds for the node's
// leases is what the node counts as its own, nothing left behind.
func TestLeaseRowsMatchTheNode(t *testing.T) {
	s := openNode(t, pgtest.DB(t), "a")
	ctx := context.Background()
	subscribe(t, s, "u", "svc", "q")
	subscribe(t, s, "p", "svc", "pp")
	if _, err := s.AddCredits(ctx, "p", "svc", units(1000), time.Now()); err != nil {
		t.Fatal(err)
	}
	accts := []store.Account{
		{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)},
		{UserID: "p", ServiceID: "svc", Product: prepaidProduct(1)},
	}
	var wg sync.WaitGroup
	for i := range 60 {
		a := accts[i%2]
		wg.Go(func() {
			for range 5 {
				res, err := s.Reserve(ctx, a, units(1), time.Now())
				dec := res.Decision
				if err != nil || !dec.Allowed {
					t.Error(dec, err)
					return
				}
				if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: a.UserID, ServiceID: "svc"}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	s.refills.Wait() // refills in flight land: the node counts them meanwhile
	for _, a := range accts {
		var leased, credits int64
		if err := s.pool.QueryRow(ctx, "SELECT coalesce(sum(units), 0), coalesce(sum(credits), 0) FROM leases WHERE user_id = $1",
			a.UserID).Scan(&leased, &credits); err != nil {
			t.Fatal(err)
		}
		st, err := s.State(ctx, a, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		mine := s.leaser.MineOf(a.UserID, "svc")
		if billing.Units(leased) != mine.Units || billing.Units(credits) != mine.Credits || st.Reserved != 0 || st.CreditsHeld != 0 {
			t.Errorf("%s: the database leases %d units %d credits, the node counts %+v; state %+v", a.UserID, leased, credits, mine, st)
		}
	}
}
