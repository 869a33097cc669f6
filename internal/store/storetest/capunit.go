package storetest

import (
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testCapAfterProductChange: a move to another product within a period
// keeps what was spent in it, and the new product's spending cap counts
// the spend in its own cost unit, whoever spent it. 2 USD spent in 4
// units at 0.5 USD under one product, then a move to a SUBSCRIPTION
// product of the same currency with quota 5, overage allowed at 1 USD a
// unit and a cap of 3 USD: one unit inside the quota and one of overage
// (3 USD in the period) are served, no more. A fleet node enforced that
// cap as a cap on units (the quota and the 3 overage units the cap buys),
// blind to the 2 USD, and served 5 USD against the cap of 3.
func testCapAfterProductChange(t *testing.T, c *suite) {
	before := billing.Product{ID: "payg-usd", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: 500_000, Currency: "USD"}
	after := billing.Product{ID: "sub-usd", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(whole(5)), Overage: "allow", Price: whole(1), SpendingCap: ptr(whole(3)), Currency: "USD"}
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", before, 0)
	if n := serveUntilRefused(t, s, a, 4); n != 4 {
		t.Fatalf("%d of 4 calls served under %s", n, before.ID)
	}
	a = moveTo(t, s, a, after)
	if st := c.state(t, s, a, T0); st.Spend != whole(2) || st.Used != whole(4) {
		t.Fatalf("after the move: used %s, spend %s; want 4 and 2", st.Used, st.Spend)
	}
	if n := serveUntilRefused(t, s, a, 10); n != 2 {
		t.Errorf("%d calls served after the move, want 2 (1 inside the quota, 1 of overage up to the cap of 3 USD)", n)
	}
	if st := c.state(t, s, a, T0); st.Spend != whole(3) || st.Used != whole(6) {
		t.Errorf("at the end: used %s, spend %s; want 6 and 3 (the cap)", st.Used, st.Spend)
	}
}

// moveTo changes a's subscription to product p within its period, as
// the admin API's plan change does (the period keeps its start).
func moveTo(t *testing.T, s store.Store, a store.Account, p billing.Product) store.Account {
	t.Helper()
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: a.UserID, ServiceID: a.ServiceID, ProductID: p.ID,
		Status: "ACTIVE", UpdatedAt: T0.Add(-time.Minute)}); err != nil {
		t.Fatalf("PutSubscription: %v", err)
	}
	a.Product = p
	return a
}

// serveUntilRefused reserves and settles calls of one unit at T0 until
// one is refused or most have been served, and returns how many were.
func serveUntilRefused(t *testing.T, s store.Store, a store.Account, most int) int {
	t.Helper()
	for n := 0; n < most; n++ {
		res, err := s.Reserve(ctx, a, whole(1), T0)
		if err != nil {
			t.Fatalf("Reserve: %v", err)
		}
		if !res.Decision.Allowed {
			return n
		}
		if _, err := s.Settle(ctx, res, whole(1), EntryFor(a, 0, T0)); err != nil {
			t.Fatalf("Settle: %v", err)
		}
	}
	return most
}

// testSpendPerCostUnit: a spending cap counts only spend in its product's
// cost unit (billing.Product.CostUnit): credits spent under a PREPAID
// product, or money of another currency, earlier in the period are no
// part of it. 2 credits spent, then a move to a USD product with a cap of
// 10 at 1 USD a unit: 10 units may be served, and the period's spend
// reads 10 (USD) at the end, 2 under the PREPAID product again, after a
// restart too. With one spend sum a period both stores served 8.
func testSpendPerCostUnit(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", prepaidWhole, whole(10))
	if n := serveUntilRefused(t, s, a, 2); n != 2 {
		t.Fatalf("%d of 2 prepaid calls served", n)
	}
	usd := billing.Product{ID: "payg-usd-cap", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: whole(1), SpendingCap: ptr(whole(10)), Currency: "USD"}
	a = moveTo(t, s, a, usd)
	if st := c.state(t, s, a, T0); st.Spend != 0 {
		t.Errorf("after the move: spend %s in USD, want 0 (the 2 spent were credits)", st.Spend)
	}
	if n := serveUntilRefused(t, s, a, 20); n != 10 {
		t.Errorf("%d calls served under a USD cap of 10 after 2 credits spent, want 10", n)
	}
	eur := usd
	eur.ID, eur.Currency = "payg-eur-cap", "EUR"
	check := func(s store.Store, when string) {
		t.Helper()
		for _, w := range []struct {
			p     billing.Product
			spend billing.Units
		}{{usd, whole(10)}, {prepaidWhole, whole(2)}, {eur, 0}} {
			a.Product = w.p
			if st := c.state(t, s, a, T0); st.Spend != w.spend || st.Used != whole(12) {
				t.Errorf("%s, in %q: used %s, spend %s; want 12 and %s", when, w.p.CostUnit(), st.Used, st.Spend, w.spend)
			}
		}
	}
	check(s, "at the end")
	if c.reopen != nil {
		check(c.restart(t, s), "after a restart")
	}
}

// testJobSpendInItsUnit: a job admitted under a USD product and
// completed after a restart counts its spend in USD, the unit its terms
// were taken under: the product's currency is kept with the job's terms
// and hold (a product's JSON leaves it out), or the completion's spend
// went to a unit of its own and a USD cap never saw it.
func testJobSpendInItsUnit(t *testing.T, c *suite) {
	c.needRestart(t)
	usd := billing.Product{ID: "payg-usd-cap", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken,
		Price: whole(1), SpendingCap: ptr(whole(10)), Currency: "USD"}
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", usd, 0)
	j := newJob("job", T0.Add(time.Hour))
	j.Terms = &store.JobTerms{}
	j.ProductID = usd.ID
	if res, err := s.CreateJobReserved(ctx, j, a, whole(4), T0); err != nil || !res.Decision.Allowed {
		t.Fatalf("CreateJobReserved: %+v, %v", res.Decision, err)
	}
	s = c.restart(t, s)
	if got, err := s.GetJob(ctx, "job"); err != nil || got.Terms == nil || got.Terms.Product == nil || got.Terms.Product.Currency != "USD" {
		t.Fatalf("after restart: terms %+v, %v", got.Terms, err)
	}
	if done, err := s.CompleteJob(ctx, "job", a, completion(a, "job", whole(3)), complete(store.JobCompleted, "d")); err != nil || done.Cost != whole(3) {
		t.Fatalf("CompleteJob after restart = %+v, %v; want 3 units costing 3", done, err)
	}
	if st := c.state(t, s, a, T0); st.Spend != whole(3) {
		t.Errorf("spend in USD %s after the job, want 3", st.Spend)
	}
}

// testSpendUnitRoundTrip: a period whose subscription moves PREPAID →
// USD → EUR → USD → EUR within it keeps each unit's spend apart and
// counts a unit's earlier spend again when its product comes back, by
// every charge (a call settled, a usage report, a job completion): 2
// credits; 3 USD; a job admitted under USD; 4 EUR in calls and 1 in a
// report; the job completed (2 units, in USD, the unit its terms were
// taken under, though the subscription is in EUR by then); back in USD
// 5 spent, so 5 more calls under the cap of 10, no more; back in EUR 5.
// After a restart every unit reads the same.
func testSpendUnitRoundTrip(t *testing.T, c *suite) {
	usd := billing.Product{ID: "payg-usd-cap", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: whole(1), SpendingCap: ptr(whole(10)), Currency: "USD"}
	eur := usd
	eur.ID, eur.Currency = "payg-eur-cap", "EUR"
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", prepaidWhole, whole(10))
	if n := serveUntilRefused(t, s, a, 2); n != 2 {
		t.Fatalf("%d of 2 prepaid calls served", n)
	}
	a = moveTo(t, s, a, usd)
	if n := serveUntilRefused(t, s, a, 3); n != 3 {
		t.Fatalf("%d of 3 USD calls served", n)
	}
	j := newJob("job", T0.Add(time.Hour))
	j.Terms = &store.JobTerms{}
	j.ProductID = usd.ID
	if res, err := s.CreateJobReserved(ctx, j, a, whole(2), T0); err != nil || !res.Decision.Allowed {
		t.Fatalf("CreateJobReserved: %+v, %v", res.Decision, err)
	}
	jobAccount := a
	a = moveTo(t, s, a, eur)
	if st := c.state(t, s, a, T0); st.Spend != 0 {
		t.Errorf("after the move to EUR: spend %s, want 0", st.Spend)
	}
	if n := serveUntilRefused(t, s, a, 4); n != 4 {
		t.Fatalf("%d of 4 EUR calls served", n)
	}
	if _, err := s.Record(ctx, a, EntryFor(a, whole(1), T0), OKResponse); err != nil {
		t.Fatalf("Record: %v", err)
	}
	if done, err := s.CompleteJob(ctx, "job", jobAccount, completion(jobAccount, "job", whole(2)),
		complete(store.JobCompleted, "d")); err != nil || done.Cost != whole(2) {
		t.Fatalf("CompleteJob = %+v, %v; want 2 units costing 2", done, err)
	}
	if st := c.state(t, s, a, T0); st.Spend != whole(5) {
		t.Errorf("in EUR after the job: spend %s, want 5 (the job's 2 are USD)", st.Spend)
	}
	a = moveTo(t, s, a, usd)
	if st := c.state(t, s, a, T0); st.Spend != whole(5) {
		t.Errorf("back in USD: spend %s, want 5 (3 in calls, 2 in the job)", st.Spend)
	}
	if n := serveUntilRefused(t, s, a, 20); n != 5 {
		t.Errorf("%d calls served back in USD with 5 of 10 spent, want 5", n)
	}
	a = moveTo(t, s, a, eur)
	check := func(s store.Store, when string) {
		t.Helper()
		for _, w := range []struct {
			p     billing.Product
			spend billing.Units
		}{{usd, whole(10)}, {eur, whole(5)}, {prepaidWhole, whole(2)}} {
			a.Product = w.p
			if st := c.state(t, s, a, T0); st.Spend != w.spend || st.Used != whole(17) || st.Reserved != 0 || st.ReservedSpend != 0 {
				t.Errorf("%s, in %q: %+v; want 17 used, %s spent, nothing held", when, w.p.CostUnit(), st, w.spend)
			}
		}
	}
	check(s, "at the end")
	if c.reopen != nil {
		check(c.restart(t, s), "after a restart")
	}
}

// testCurrencyReload: a reload that changes a product's currency within a
// period (same product id, no change of subscription) starts its spend in
// the new unit from nothing, and one that changes it back finds the spend
// of the first: 10 USD spent under a USD cap of 10, the currency made EUR,
// 10 more served (in EUR), made USD again: refused at once, the 10 USD
// still there; a call admitted under USD and settled after the change to
// EUR is charged in USD, the unit it was admitted under.
func testCurrencyReload(t *testing.T, c *suite) {
	usd := billing.Product{ID: "payg-cap", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: whole(1), SpendingCap: ptr(whole(10)), Currency: "USD"}
	eur := usd
	eur.Currency = "EUR"
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", usd, 0)
	if n := serveUntilRefused(t, s, a, 9); n != 9 {
		t.Fatalf("%d of 9 USD calls served", n)
	}
	inFlight, err := s.Reserve(ctx, a, whole(1), T0)
	if err != nil || !inFlight.Decision.Allowed {
		t.Fatalf("Reserve under USD: %+v, %v", inFlight.Decision, err)
	}
	a.Product = eur // the reload
	if _, err := s.Settle(ctx, inFlight, whole(1), EntryFor(inFlight.Account, 0, T0)); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if st := c.state(t, s, a, T0); st.Spend != 0 {
		t.Errorf("in EUR after the reload: spend %s, want 0 (the call admitted under USD is charged in USD)", st.Spend)
	}
	if n := serveUntilRefused(t, s, a, 20); n != 10 {
		t.Errorf("%d calls served in EUR after the reload, want 10", n)
	}
	a.Product = usd // and back
	if n := serveUntilRefused(t, s, a, 5); n != 0 {
		t.Errorf("%d calls served back in USD with 10 of 10 spent, want 0", n)
	}
	for _, w := range []struct {
		p     billing.Product
		spend billing.Units
	}{{usd, whole(10)}, {eur, whole(10)}} {
		a.Product = w.p
		if st := c.state(t, s, a, T0); st.Spend != w.spend || st.Used != whole(20) || st.ReservedSpend != 0 {
			t.Errorf("in %s: %+v; want 20 used, %s spent, nothing held", w.p.Currency, st, w.spend)
		}
	}
}
