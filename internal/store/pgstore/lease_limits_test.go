package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestLeaseFollowsQuotaChange: 20 calls used under a quota of 1000;
// the subscription moves to a product with a quota of 10 (blocked). The
// docs (operations.md): "moving to a smaller quota than what is used
// blocks further calls until the period renews". boltstore refuses the
// next call; pgstore admits it from the node's lease, leased under the old
// quota.
func TestLeaseFollowsQuotaChange(t *testing.T) {
	s := openNode(t, pgtest.DB(t), "a")
	ctx := context.Background()
	subscribe(t, s, "u", "svc", "q")
	big := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)}
	for range 20 {
		res, err := s.Reserve(ctx, big, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve under the big quota: %v %+v", err, res.Decision)
		}
		if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Source: store.SourceGateway, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	// The change of product (as ops.PutSubscription makes it).
	now := time.Now().UTC()
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "svc", ProductID: "small", Status: "ACTIVE", UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	small := big
	small.Product = quotaProduct(10)
	small.Product.ID = "small"
	st, _ := s.State(ctx, small, time.Now())
	t.Logf("state after the change: used %s, held %s", st.Used, st.Reserved)
	admitted := 0
	for range 50 {
		res, err := s.Reserve(ctx, small, units(1), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !res.Decision.Allowed {
			break
		}
		admitted++
		if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "small", Source: store.SourceGateway, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	st, _ = s.State(ctx, small, time.Now())
	if admitted > 0 {
		t.Errorf("%d calls admitted under a quota of 10 with 20 already used (used now %s)", admitted, st.Used)
	}
	// Back to the larger quota: admitted again at once, not refused from
	// the smaller one's refusal.
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "svc", ProductID: "q", Status: "ACTIVE", UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Reserve(ctx, big, units(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve after the quota was raised again: %v %+v", err, res.Decision)
	}
	if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Source: store.SourceGateway, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.State(ctx, big, time.Now()); st.Used != units(21) {
		t.Errorf("used %s after one more call, want 21", st.Used)
	}
}

// TestLeaseCapWorthMoreUnitsThanUnitsHold: a SUBSCRIPTION product whose
// spending cap pays for more overage units than billing.Units can hold
// (10,000,000 at 0.000001 a unit, 100 included). Its units bound wrapped
// to the quota alone: every call past the quota was refused
// quota_exceeded, where boltstore (billing.Decide) serves and prices it.
// With a quota of MaxUnits the bound wrapped negative and even the first
// call, within the quota, was refused.
func TestLeaseCapWorthMoreUnitsThanUnitsHold(t *testing.T) {
	s := openNode(t, pgtest.DB(t), "a")
	ctx := context.Background()
	subscribe(t, s, "u", "svc", "big-cap")
	a := store.Account{UserID: "u", ServiceID: "svc", Product: billing.Product{ID: "big-cap",
		BillingModel: billing.Subscription, MeasurementType: billing.PerToken,
		Quota: ptr(units(100)), Overage: "allow", Price: 1, SpendingCap: ptr(units(10_000_000))}}
	for i := range 3 {
		res, err := s.Reserve(ctx, a, units(60), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("call %d (60 units, 100 included, the cap pays for 10^13 more): %v %+v", i+1, err, res.Decision)
		}
		if _, err := s.Settle(ctx, res, units(60), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "big-cap", Source: store.SourceGateway, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.State(ctx, a, time.Now())
	if err != nil || st.Used != units(180) || st.Spend != 80 {
		t.Errorf("state %+v %v: want used 180, spend 0.000080", st, err)
	}

	subscribe(t, s, "v", "svc", "big-quota")
	b := store.Account{UserID: "v", ServiceID: "svc", Product: billing.Product{ID: "big-quota",
		BillingModel: billing.Subscription, MeasurementType: billing.PerToken,
		Quota: ptr(billing.MaxUnits), Overage: "allow", Price: 1, SpendingCap: ptr(units(9_000_000))}}
	res, err := s.Reserve(ctx, b, units(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("a first call within a quota of %s: %v %+v", billing.MaxUnits, err, res.Decision)
	}
	if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "v", ServiceID: "svc", ProductID: "big-quota", Source: store.SourceGateway, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseChangeReturnsUnusedPart: a call is in flight on node a's lease
// (a block of 2 under a quota of 10) when the subscription moves to a
// quota of 3. Node a's next call starts a lease under the new quota; the
// old row keeps the unit its call holds and gives the other back at once,
// so node b gets the last unit (1 held, 1 used by a's new call). Before,
// the old row kept both until it expired (lease_ttl) and b was refused
// with a unit left.
func TestLeaseChangeReturnsUnusedPart(t *testing.T) {
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	ctx := context.Background()
	subscribe(t, a, "u", "svc", "q")
	big := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(10)}
	inFlight, err := a.Reserve(ctx, big, units(1), time.Now())
	if err != nil || !inFlight.Decision.Allowed {
		t.Fatalf("reserve under the quota of 10: %v %+v", err, inFlight.Decision)
	}
	if _, err := a.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "svc", ProductID: "small", Status: "ACTIVE", UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	small := big
	small.Product = quotaProduct(3)
	small.Product.ID = "small"
	if res, err := a.Reserve(ctx, small, units(1), time.Now()); err != nil || !res.Decision.Allowed {
		t.Fatalf("node a under the quota of 3: %v %+v", err, res.Decision)
	}
	res, err := b.Reserve(ctx, small, units(1), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var leased int64
	if err := a.pool.QueryRow(ctx, "SELECT leased_units FROM allowances WHERE user_id = 'u'").Scan(&leased); err != nil {
		t.Fatal(err)
	}
	if !res.Decision.Allowed {
		t.Errorf("node b refused the last unit of 3 (2 held by calls in flight): %+v; leased in the database %s",
			res.Decision, billing.Units(leased))
	}
	if _, err := a.Settle(ctx, inFlight, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Source: store.SourceGateway, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseOverageCapSeesEarlierSpend: two nodes, 2 USD spent in 4 units
// at 0.5 under one product, then a move to a SUBSCRIPTION product (USD)
// with quota 5, overage allowed at 1 a unit and a spending cap of 3. The
// fleet may serve 2 more units (1 inside the quota, 1 of overage: 3 USD
// in the period), whichever node serves them. The lease bounded the
// units by the quota plus the 3 overage units the whole cap buys, blind
// to the 2 USD: 4 more units served, 5 USD against the cap of 3.
func TestLeaseOverageCapSeesEarlierSpend(t *testing.T) {
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	ctx := context.Background()
	subscribe(t, a, "u", "svc", "payg")
	before := store.Account{UserID: "u", ServiceID: "svc", Product: billing.Product{ID: "payg", BillingModel: billing.UsagePostpaid,
		MeasurementType: billing.PerRequest, Price: 500_000, Currency: "USD"}}
	serve := func(s *Store, acc store.Account) bool {
		t.Helper()
		res, err := s.Reserve(ctx, acc, units(1), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !res.Decision.Allowed {
			return false
		}
		if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: acc.Product.ID,
			Source: store.SourceGateway, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
		return true
	}
	for range 4 {
		if !serve(a, before) {
			t.Fatal("refused under the product without a cap")
		}
	}
	if _, err := a.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "svc", ProductID: "sub", Status: "ACTIVE",
		UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	after := before
	after.Product = billing.Product{ID: "sub", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(units(5)), Overage: "allow", Price: units(1), SpendingCap: ptr(units(3)), Currency: "USD"}
	served := 0
	for i := range 10 {
		if serve([]*Store{a, b}[i%2], after) {
			served++
		}
	}
	st, err := b.State(ctx, after, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if served != 2 || st.Spend != units(3) {
		t.Errorf("%d calls served after the move, spend %s (used %s); want 2 and 3 USD, the cap", served, st.Spend, st.Used)
	}
}
