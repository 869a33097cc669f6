package pgstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestSpendPerUnitOldRow: an allowance row from before schema version 8
// (no spend_unit) counts all its spend in the unit of the product that
// uses it next, as every spend was counted before: 2 spent, then a USD cap
// of 10 leaves 8 on a node that never saw the row. A period with spend in
// two units (3 credits, then 10 USD under a USD cap of 10) keeps them
// apart, and store check and the totals a migration compares count both.
func TestSpendPerUnitOldRow(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a := openNode(t, dsn, "a")
	usd := billing.Product{ID: "usd", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: units(1), SpendingCap: ptr(units(10)), Currency: "USD"}
	credits := billing.Product{ID: "pre", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: units(1)}
	serve := func(s *Store, acc store.Account, most int) int {
		t.Helper()
		for n := 0; n < most; n++ {
			res, err := s.Reserve(ctx, acc, units(1), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if !res.Decision.Allowed {
				return n
			}
			if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: acc.UserID, ServiceID: acc.ServiceID,
				ProductID: acc.Product.ID, Source: store.SourceGateway, Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		return most
	}
	subscribe(t, a, "u1", "svc", usd.ID)
	u1 := store.Account{UserID: "u1", ServiceID: "svc", Product: usd}
	if n := serve(a, u1, 2); n != 2 {
		t.Fatalf("%d of 2 served", n)
	}
	subscribe(t, a, "u2", "svc", credits.ID)
	if _, err := a.AddCredits(ctx, "u2", "svc", units(5), time.Now()); err != nil {
		t.Fatal(err)
	}
	u2 := store.Account{UserID: "u2", ServiceID: "svc", Product: credits}
	if n := serve(a, u2, 3); n != 3 {
		t.Fatalf("%d of 3 prepaid served", n)
	}
	if _, err := a.PutSubscription(ctx, store.Subscription{UserID: "u2", ServiceID: "svc", ProductID: usd.ID, Status: "ACTIVE",
		UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	u2.Product = usd
	if n := serve(a, u2, 20); n != 10 {
		t.Errorf("%d served under a USD cap of 10 after 3 credits, want 10", n)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var unit, other *string
	if err := a.pool.QueryRow(ctx, `SELECT spend_unit, spend_other::text FROM allowances WHERE user_id = 'u2'`).Scan(&unit, &other); err != nil {
		t.Fatal(err)
	}
	if unit == nil || *unit != "USD" || other == nil || *other != `{"credits": 3000000}` {
		t.Errorf("u2's row: unit %v, other %v; want USD and 3 credits", deref(unit), deref(other))
	}
	a.Close()
	// u1's row as schema version 7 left it.
	b := openNode(t, dsn, "b")
	if _, err := b.pool.Exec(ctx, `UPDATE allowances SET spend_unit = NULL WHERE user_id = 'u1'`); err != nil {
		t.Fatal(err)
	}
	if n := serve(b, u1, 20); n != 8 {
		t.Errorf("%d served under a USD cap of 10 after 2 spent in a row without a unit, want 8", n)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(ctx, dsn)
	if err != nil || len(rep.Mismatches) != 0 || rep.Accounts != 2 {
		t.Errorf("store check: %v, %+v", err, rep)
	}
	tot, err := b.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tot.Spend != units(23) {
		t.Errorf("total spend %s, want 23 (10 USD and 3 credits, 10 USD)", tot.Spend)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// TestSpendOldRowReadBeforeCharge: a row from before schema version 8
// (2 credits spent, no spend_unit), read under its PREPAID product before
// a move to a USD product with a cap of 10, counts its 2 in USD, the unit
// of the first product that charges it: 8 USD served, and every node reads
// 10 USD spent and no credits after. The embedded store agrees
// (boltstore's TestSpendOldCounterReadBeforeCharge).
func TestSpendOldRowReadBeforeCharge(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	usd := billing.Product{ID: "usd", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: units(1), SpendingCap: ptr(units(10)), Currency: "USD"}
	credits := billing.Product{ID: "pre", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: units(1)}
	serve := func(s *Store, acc store.Account, most int) int {
		t.Helper()
		for n := 0; n < most; n++ {
			res, err := s.Reserve(ctx, acc, units(1), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if !res.Decision.Allowed {
				return n
			}
			if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: acc.UserID, ServiceID: acc.ServiceID,
				ProductID: acc.Product.ID, Source: store.SourceGateway, Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		return most
	}
	a := openNode(t, dsn, "a")
	subscribe(t, a, "u1", "svc", credits.ID)
	if _, err := a.AddCredits(ctx, "u1", "svc", units(5), time.Now()); err != nil {
		t.Fatal(err)
	}
	u1 := store.Account{UserID: "u1", ServiceID: "svc", Product: credits}
	if n := serve(a, u1, 2); n != 2 {
		t.Fatalf("%d of 2 prepaid served", n)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	a.Close()
	b := openNode(t, dsn, "b")
	if _, err := b.pool.Exec(ctx, `UPDATE allowances SET spend_unit = NULL WHERE user_id = 'u1'`); err != nil {
		t.Fatal(err)
	}
	if st, err := b.State(ctx, u1, time.Now()); err != nil || st.Spend != units(2) {
		t.Fatalf("spend read under the PREPAID product: %+v, %v; want 2", st, err)
	}
	if _, err := b.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: usd.ID, Status: "ACTIVE",
		UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	u1.Product = usd
	if n := serve(b, u1, 20); n != 8 {
		t.Errorf("%d served under a USD cap of 10 after 2 spent in a row without a unit, want 8", n)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c := openNode(t, dsn, "c")
	for _, w := range []struct {
		p     billing.Product
		spend billing.Units
	}{{usd, units(10)}, {credits, 0}} {
		u1.Product = w.p
		if st, err := c.State(ctx, u1, time.Now()); err != nil || st.Spend != w.spend {
			t.Errorf("another node, in %q: spend %s, %v; want %s", w.p.CostUnit(), st.Spend, err, w.spend)
		}
	}
}

// TestSpendTwoUnitsTwoNodesConcurrently: two nodes charge one allowance
// row at once in two cost units (node a under a USD product, node b under
// a EUR one, as while a plan change or a reload reaches them at different
// moments), each with a cap of 30 at 1 a unit, in calls from two
// goroutines each: every settlement moves the row's unit under its lock,
// so neither unit's spend takes the other's, neither passes its cap, and
// the spend of each unit is exactly what its calls were charged. Then,
// nothing else in flight, each unit serves up to its cap, store check
// agrees with the ledger, and the totals count both units.
// With and without the nodes' settlement logs (records naming their
// unit, shipped later).
func TestSpendTwoUnitsTwoNodesConcurrently(t *testing.T) {
	t.Run("commit", func(t *testing.T) { spendTwoUnitsTwoNodes(t, false) })
	t.Run("settle log", func(t *testing.T) { spendTwoUnitsTwoNodes(t, true) })
}

func spendTwoUnitsTwoNodes(t *testing.T, withLog bool) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	node := func(id string) *Store {
		return openNode(t, dsn, id, func(o *Options) {
			if withLog {
				o.LogDir = t.TempDir()
			} else {
				o.SettleCommit = true
			}
		})
	}
	a, b := node("a"), node("b")
	usd := billing.Product{ID: "usd", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: units(1), SpendingCap: ptr(units(30)), Currency: "USD"}
	eur := usd
	eur.ID, eur.Currency = "eur", "EUR"
	subscribe(t, a, "u", "svc", usd.ID)
	serve := func(s *Store, acc store.Account, most int) (int, error) {
		for n := 0; n < most; n++ {
			res, err := s.Reserve(ctx, acc, units(1), time.Now())
			if err != nil {
				return n, err
			}
			if !res.Decision.Allowed {
				return n, nil
			}
			if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: acc.UserID, ServiceID: acc.ServiceID,
				ProductID: acc.Product.ID, Source: store.SourceGateway, Time: time.Now()}); err != nil {
				return n, err
			}
		}
		return most, nil
	}
	type run struct {
		s *Store
		p billing.Product
	}
	runs := []run{{a, usd}, {a, usd}, {b, eur}, {b, eur}}
	served := make([]int, len(runs))
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			served[i], errs[i] = serve(r.s, store.Account{UserID: "u", ServiceID: "svc", Product: r.p}, 12)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*Store{a, b} {
		if err := s.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c := openNode(t, dsn, "c")
	spendOf := func(p billing.Product) billing.State {
		t.Helper()
		st, err := c.State(ctx, store.Account{UserID: "u", ServiceID: "svc", Product: p}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	inUSD, inEUR := served[0]+served[1], served[2]+served[3]
	if st := spendOf(usd); st.Spend != units(int64(inUSD)) || st.Used != units(int64(inUSD+inEUR)) {
		t.Errorf("USD: %+v after %d USD and %d EUR calls", st, inUSD, inEUR)
	}
	if st := spendOf(eur); st.Spend != units(int64(inEUR)) {
		t.Errorf("EUR: spend %s after %d EUR calls", st.Spend, inEUR)
	}
	// Nothing else in flight: each unit up to its cap, on either node.
	moreUSD, err := serve(b, store.Account{UserID: "u", ServiceID: "svc", Product: usd}, 40)
	if err != nil {
		t.Fatal(err)
	}
	// b's USD charges acknowledged from its log and not yet shipped
	// (ShipInterval) are leased spend of the row, one sum whatever the
	// unit: until they ship they count against the EUR cap too (without
	// this flush, 6 more EUR calls served where 18 were due), a known
	// limit (configuration.md, spending_cap).
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	moreEUR, err := serve(a, store.Account{UserID: "u", ServiceID: "svc", Product: eur}, 40)
	if err != nil {
		t.Fatal(err)
	}
	if inUSD+moreUSD != 30 || inEUR+moreEUR != 30 {
		t.Errorf("%d+%d USD and %d+%d EUR calls served under caps of 30 each, want 30 each", inUSD, moreUSD, inEUR, moreEUR)
	}
	for _, s := range []*Store{a, b} {
		if err := s.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if st := spendOf(usd); st.Spend != units(30) || st.Used != units(60) {
		t.Errorf("USD at the end: %+v, want 60 used, 30 spent", st)
	}
	if st := spendOf(eur); st.Spend != units(30) {
		t.Errorf("EUR at the end: spend %s, want 30", st.Spend)
	}
	rep, err := Check(ctx, dsn)
	if err != nil || len(rep.Mismatches) != 0 {
		t.Errorf("store check: %v, %+v", err, rep.Mismatches)
	}
	if tot, err := c.Totals(ctx); err != nil || tot.Spend != units(60) {
		t.Errorf("totals: spend %s, %v; want 60 (30 USD and 30 EUR)", tot.Spend, err)
	}
}
