package storetest

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// overClaimLimits are the hard limits the over-claim tests race for: 50
// units' worth each, as the attack run's product had (20 included, then
// 30 of overage at 0.5 up to a cap of 15).
var overClaimLimits = []struct {
	name    string
	p       billing.Product
	credits billing.Units
	code    string
}{
	{"overage cap", billing.Product{ID: "oc", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(whole(20)), Overage: "allow", Price: 500_000, SpendingCap: ptr(whole(15))}, 0, billing.CodeQuotaExceeded},
	{"prepaid", billing.Product{ID: "pp", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken,
		Price: whole(2)}, whole(100), billing.CodeInsufficientCredits},
	{"hard quota", billing.Product{ID: "hq", BillingModel: billing.Subscription, MeasurementType: billing.PerToken,
		Quota: ptr(whole(50)), Overage: "block"}, 0, billing.CodeQuotaExceeded},
	{"usage cap", billing.Product{ID: "uc", BillingModel: billing.UsageInstant, MeasurementType: billing.PerToken,
		Price: whole(1), SpendingCap: ptr(whole(50))}, 0, billing.CodeQuotaExceeded},
}

// testOverClaimsUnderConcurrency: 300 callers hold one unit each and race
// for 50 units' worth of a hard limit, round after round until they are
// refused; every backend states more than was held (2.5, or 2, which
// lands exactly on the limit). A claim is charged as far as the limit
// allows and never below the call's own hold: an over-claim may not take
// the units other calls in flight hold. At 8c3d93a the in-quota claims of
// the overage cap took them, and the calls that held them were settled at
// 0 units: served free. Every row says what the backend stated
// (UnitsClaimed when cut), the counters equal the ledger, the limit is
// reached and not passed, nothing stays held.
func testOverClaimsUnderConcurrency(t *testing.T, c *suite) {
	const callers = 300
	hold := whole(1)
	for _, lim := range overClaimLimits {
		for _, claim := range []billing.Units{2_500_000, whole(2)} {
			t.Run(fmt.Sprintf("%s claims %s", lim.name, claim), func(t *testing.T) {
				s := c.store(t)
				a := subscribe(t, s, "u1", "svc", lim.p, lim.credits)
				var served, refused, failed atomic.Int64
				var wg sync.WaitGroup
				for i := range callers {
					wg.Go(func() {
						for r := 0; r < 100; r++ {
							res, err := s.Reserve(ctx, a, hold, T0)
							switch {
							case err != nil:
								failed.Add(1)
								return
							case !res.Decision.Allowed:
								if res.Decision.Code != lim.code {
									failed.Add(1)
								}
								refused.Add(1)
								return
							}
							served.Add(1)
							for range (i*7 + r*13) % 11 {
								runtime.Gosched()
							}
							e := EntryFor(a, 0, T0)
							e.Source = store.SourceGateway
							if _, err := s.Settle(ctx, res, claim, e); err != nil {
								failed.Add(1)
								return
							}
						}
					})
				}
				wg.Wait()
				if failed.Load() != 0 {
					t.Fatalf("%d reservations or settlements failed", failed.Load())
				}
				checkOverClaims(t, c, s, a, lim.p, served.Load(), hold, claim)
			})
		}
	}
}

// checkOverClaims: served calls have a row each, none charged below its
// hold nor above its claim, a cut row names the claim; the counters equal
// the ledger; the limit is full to within one hold and never passed.
func checkOverClaims(t *testing.T, c *suite, s store.Store, a store.Account, p billing.Product, served int64, hold, claim billing.Units) {
	t.Helper()
	entries := Ledger(t, s, store.LedgerFilter{})
	if int64(len(entries)) != served {
		t.Errorf("%d calls served, %d ledger rows", served, len(entries))
	}
	var cut int
	for _, e := range entries {
		if e.Units < hold || e.Units > claim {
			t.Errorf("row %s charged %s units for a call that held %s and claimed %s", e.ID, e.Units, hold, claim)
		}
		switch {
		case e.Units < claim && e.UnitsClaimed != claim:
			t.Errorf("row %s charged %s of a claim of %s but records the claim as %s", e.ID, e.Units, claim, e.UnitsClaimed)
		case e.Units == claim && e.UnitsClaimed != 0:
			t.Errorf("row %s charged in full records a claim of %s", e.ID, e.UnitsClaimed)
		case e.Units < claim:
			cut++
		}
	}
	st := c.state(t, s, a, T0)
	units, cost := SumUnits(entries)
	if st.Used != units || st.Spend != cost {
		t.Errorf("counters used %s spend %s, ledger %s units costing %s", st.Used, st.Spend, units, cost)
	}
	if st.Reserved != 0 || st.ReservedSpend != 0 || st.CreditsHeld != 0 {
		t.Errorf("holds left: %+v", st)
	}
	// The units the limit allows: 50 for each product here.
	limit := whole(50)
	if units > limit || units <= limit-hold {
		t.Errorf("%s units charged of a limit of %s", units, limit)
	}
	switch {
	case p.BillingModel == billing.Prepaid:
		if st.Credits != 0 && st.Credits >= billing.Mul(hold, p.Price) {
			t.Errorf("credits left %s: the balance should be spent", st.Credits)
		}
		if st.Credits < 0 {
			t.Errorf("credits overdrawn to %s by calls the gateway held", st.Credits)
		}
	case p.SpendingCap != nil:
		if st.Spend > *p.SpendingCap {
			t.Errorf("spend %s past the cap %s", st.Spend, *p.SpendingCap)
		}
	}
	if res, _ := s.Reserve(ctx, a, hold, T0); res.Decision.Allowed && units > limit-hold {
		t.Errorf("one more call allowed at %s of %s", units, limit)
	}
	t.Logf("%d served, %d cut at the limit, %s charged", served, cut, units)
}

// testOverClaimOnTheLimit: claims that land exactly on a hard limit are
// charged in full and are not cut; one past it is cut to the limit and
// says so; the next call is refused.
func testOverClaimOnTheLimit(t *testing.T, c *suite) {
	for _, lim := range overClaimLimits {
		t.Run(lim.name, func(t *testing.T) {
			s := c.store(t)
			a := subscribe(t, s, "u1", "svc", lim.p, lim.credits)
			settle := func(claim billing.Units) store.LedgerEntry {
				t.Helper()
				res, err := s.Reserve(ctx, a, whole(1), T0)
				if err != nil || !res.Decision.Allowed {
					t.Fatalf("hold: %v %+v", err, res.Decision)
				}
				e := EntryFor(a, 0, T0)
				e.Source = store.SourceGateway
				out, err := s.Settle(ctx, res, claim, e)
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			// 47.5 units, then a claim of 2.5 lands on 50 exactly.
			for range 19 {
				settle(2_500_000)
			}
			if e := settle(2_500_000); e.Units != 2_500_000 || e.UnitsClaimed != 0 {
				t.Errorf("a claim landing on the limit: charged %s, claimed %s; want 2.5 charged in full", e.Units, e.UnitsClaimed)
			}
			if res, _ := s.Reserve(ctx, a, whole(1), T0); res.Decision.Allowed || res.Decision.Code != lim.code {
				t.Errorf("a call at the limit: %+v, want %s", res.Decision, lim.code)
			}
			checkOverClaims(t, c, s, a, lim.p, 20, whole(1), 2_500_000)
		})
		t.Run(lim.name+" one past", func(t *testing.T) {
			s := c.store(t)
			a := subscribe(t, s, "u1", "svc", lim.p, lim.credits)
			var last store.LedgerEntry
			for range 16 { // 3 a call: 48, then 2 fit of the 17th's 3
				res, err := s.Reserve(ctx, a, whole(1), T0)
				if err != nil || !res.Decision.Allowed {
					t.Fatalf("hold: %v %+v", err, res.Decision)
				}
				e := EntryFor(a, 0, T0)
				e.Source = store.SourceGateway
				if last, err = s.Settle(ctx, res, whole(3), e); err != nil {
					t.Fatal(err)
				}
			}
			if last.Units != whole(3) || last.UnitsClaimed != 0 {
				t.Fatalf("the 16th call: %+v", last)
			}
			res, err := s.Reserve(ctx, a, whole(1), T0)
			if err != nil || !res.Decision.Allowed {
				t.Fatalf("hold at 48 of 50: %v %+v", err, res.Decision)
			}
			e := EntryFor(a, 0, T0)
			e.Source = store.SourceGateway
			if last, err = s.Settle(ctx, res, whole(3), e); err != nil {
				t.Fatal(err)
			}
			if last.Units != whole(2) || last.UnitsClaimed != whole(3) {
				t.Errorf("a claim of 3 with 2 left: charged %s, claimed %s; want 2 of 3", last.Units, last.UnitsClaimed)
			}
			if res, _ := s.Reserve(ctx, a, whole(1), T0); res.Decision.Allowed {
				t.Errorf("a call past the limit was allowed")
			}
		})
	}
}
