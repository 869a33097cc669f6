package boltstore

import (
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// serveN reserves and settles calls of one unit until one is refused or
// most were served, and returns how many were.
func serveN(t *testing.T, s *Store, a store.Account, most int) int {
	t.Helper()
	for n := 0; n < most; n++ {
		res, err := s.Reserve(ctx, a, whole(1), t0)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Decision.Allowed {
			return n
		}
		if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
			t.Fatal(err)
		}
	}
	return most
}

// TestSpendPerUnitOldCounter: a counter written before spend was kept per
// cost unit (no "unit") counts all its spend in the unit of the product
// that uses it next, as every spend was counted before: 2 spent, then a
// USD cap of 10 leaves 8. The store check agrees with the ledger after a
// period whose spend is in two units (credits and USD), and after the old
// counter took a unit.
func TestSpendPerUnitOldCounter(t *testing.T) {
	path := storePath(t)
	usd := billing.Product{ID: "usd", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: whole(1), SpendingCap: ptr(whole(10)), Currency: "USD"}
	credits := billing.Product{ID: "pre", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: whole(1)}
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", usd, 0)
	if n := serveN(t, s, a, 2); n != 2 {
		t.Fatalf("%d of 2 served", n)
	}
	// The same for a second subscription in credits and then USD: a
	// period with spend in two units, for the check.
	b := subscribe(t, s, "u2", "svc", credits, whole(5))
	b.Product = credits
	if n := serveN(t, s, b, 3); n != 3 {
		t.Fatalf("%d of 3 prepaid served", n)
	}
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u2", ServiceID: "svc", ProductID: usd.ID, Status: "ACTIVE",
		UpdatedAt: t0.Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}
	b.Product = usd
	if n := serveN(t, s, b, 20); n != 10 {
		t.Errorf("%d served under a USD cap of 10 after 3 credits, want 10", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// u1's counter as an earlier version wrote it: no unit.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketCounters).ForEach(func(k, v []byte) error {
			user, _, _, _ := splitCounterKey(k)
			if user != "u1" {
				return nil
			}
			var c counter
			if err := getJSON(tx, bucketCounters, k, &c); err != nil {
				return err
			}
			if c.Unit == nil || *c.Unit != "USD" || c.Spend != amount(whole(2)) {
				t.Errorf("u1's counter %+v, want 2 spent in USD", c)
			}
			c.Unit = nil
			return putRaw(tx, bucketCounters, append([]byte(nil), k...), encodeCounter(c))
		})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s = openAt(t, path)
	if n := serveN(t, s, a, 20); n != 8 {
		t.Errorf("%d served under a USD cap of 10 after 2 spent in a counter without a unit, want 8", n)
	}
	a.Product = credits
	if st := stateOf(t, s, a, t0); st.Spend != 0 {
		t.Errorf("u1's spend in credits %s, want 0: the old counter's spend went to USD", st.Spend)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := CheckFile(path)
	if err != nil || len(rep.Cross.Mismatches) != 0 || rep.Cross.Accounts != 2 {
		t.Errorf("store check: %v, %+v", err, rep.Cross)
	}
}

// stripUnit makes user's counters as a version before spend was kept per
// cost unit wrote them: no "unit".
func stripUnit(t *testing.T, path, user string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketCounters).ForEach(func(k, v []byte) error {
			if u, _, _, _ := splitCounterKey(k); u != user {
				return nil
			}
			var c counter
			if err := getJSON(tx, bucketCounters, k, &c); err != nil {
				return err
			}
			c.Unit = nil
			return putRaw(tx, bucketCounters, append([]byte(nil), k...), encodeCounter(c))
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSpendOldCounterReadBeforeCharge: a counter without a unit (2
// credits spent before the upgrade) that is only read under its PREPAID
// product (a summary, a refused call) before a move to a USD product with
// a cap of 10 counts its 2 in USD, as the database does (a counter takes
// the unit of the first product that charges it) and as PostgreSQL does:
// 8 USD served, and the spend reads 10 before and after a restart. The
// memory took the unit of the first product that read it: 10 USD were
// served against the cap of 10, and after a restart the database's
// counter said 12 (the 2 credits counted as USD).
func TestSpendOldCounterReadBeforeCharge(t *testing.T) {
	path := storePath(t)
	usd := billing.Product{ID: "usd", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: whole(1), SpendingCap: ptr(whole(10)), Currency: "USD"}
	credits := billing.Product{ID: "pre", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: whole(1)}
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", credits, whole(5))
	a.Product = credits
	if n := serveN(t, s, a, 2); n != 2 {
		t.Fatalf("%d of 2 prepaid served", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	stripUnit(t, path, "u1")
	s = openAt(t, path)
	if st := stateOf(t, s, a, t0); st.Spend != whole(2) {
		t.Fatalf("spend read under the PREPAID product %s, want 2", st.Spend)
	}
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: usd.ID, Status: "ACTIVE",
		UpdatedAt: t0.Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}
	a.Product = usd
	if n := serveN(t, s, a, 20); n != 8 {
		t.Errorf("%d served under a USD cap of 10 after 2 spent in a counter without a unit, want 8", n)
	}
	before := stateOf(t, s, a, t0).Spend
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openAt(t, path)
	if after := stateOf(t, s, a, t0).Spend; after != before || after != whole(10) {
		t.Errorf("spend in USD %s before a restart, %s after; want 10 both", before, after)
	}
	a.Product = credits
	if st := stateOf(t, s, a, t0); st.Spend != 0 {
		t.Errorf("spend in credits %s after a restart, want 0: the old counter's spend went to USD", st.Spend)
	}
}

// TestSpendUnitsReplayedAfterCrash: records of the settlement log replayed
// at a start after a crash count their charges in the unit they name, and
// one written before records named a unit (no partUnit) in the counter's:
// 2 credits, then 3 USD applied to the database; a record of the former
// format charging 1 and the process killed: 4 USD after the replay (the
// counter's unit then), 2 credits; then 1 EUR, 1 USD and 1 under a
// listing without a currency (the unit "", kept apart from the others
// too), killed before any is applied: 5 USD, 1 EUR, 1 in "", 2 credits,
// as the memory had them, and the store check agrees with the ledger.
func TestSpendUnitsReplayedAfterCrash(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	usd := billing.Product{ID: "usd", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: whole(1), SpendingCap: ptr(whole(10)), Currency: "USD"}
	eur := usd
	eur.ID, eur.Currency = "eur", "EUR"
	bare := usd
	bare.ID, bare.Currency = "bare", ""
	credits := billing.Product{ID: "pre", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: whole(1)}
	path := storePath(t)
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", credits, whole(5))
	move := func(p billing.Product) {
		t.Helper()
		if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: p.ID, Status: "ACTIVE",
			UpdatedAt: t0.Add(-time.Minute)}); err != nil {
			t.Fatal(err)
		}
		a.Product = p
	}
	a.Product = credits
	if n := serveN(t, s, a, 2); n != 2 {
		t.Fatalf("%d of 2 prepaid served", n)
	}
	move(usd)
	if n := serveN(t, s, a, 3); n != 3 {
		t.Fatalf("%d of 3 USD served", n)
	}
	res, err := s.Reserve(ctx, a, whole(1), t0)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("Reserve: %+v, %v", res.Decision, err)
	}
	if _, err := s.Settle(ctx, res, 0, entryFor(a, 0, t0)); err != nil {
		t.Fatal(err)
	}
	period := res.PeriodKey
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	applyInterval = time.Hour // nothing applied before the crashes below
	s = openAt(t, path)
	// A charge as a version before partUnit wrote it.
	e := entryFor(a, whole(1), t0)
	e.Cost = whole(1)
	old := &settlement{acct: &acctChange{userID: "u1", serviceID: "svc", period: period,
		ops: []acctOp{{kind: opCharge, units: whole(1), cost: whole(1)}}}, ledger: &e}
	if raw := old.encode(nil); raw[0]&partUnit != 0 {
		t.Fatalf("flags %#x: the record names a unit", raw[0])
	}
	_, b, err := s.commitRecord(old, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.await(b); err != nil {
		t.Fatal(err)
	}
	crash(t, s)
	s = openAt(t, path)
	check := func(when string, want map[string]billing.Units) {
		t.Helper()
		for _, p := range []billing.Product{credits, usd, eur, bare} {
			a.Product = p
			if st := stateOf(t, s, a, t0); st.Spend != want[p.CostUnit()] {
				t.Errorf("%s, in %q: spend %s, want %s", when, p.CostUnit(), st.Spend, want[p.CostUnit()])
			}
		}
	}
	check("after the old record's replay", map[string]billing.Units{"credits": whole(2), "USD": whole(4)})
	for _, p := range []billing.Product{eur, usd, bare} {
		move(p)
		if n := serveN(t, s, a, 1); n != 1 {
			t.Fatalf("under %s: %d of 1 served", p.ID, n)
		}
	}
	want := map[string]billing.Units{"credits": whole(2), "USD": whole(5), "EUR": whole(1), "": whole(1)}
	check("before the crash", want)
	crash(t, s)
	s = openAt(t, path)
	check("after the replay", want)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := CheckFile(path)
	if err != nil || len(rep.Cross.Mismatches) != 0 {
		t.Errorf("store check: %v, %+v", err, rep.Cross)
	}
}
