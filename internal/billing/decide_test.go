package billing_test

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

func ptr(u billing.Units) *billing.Units { return &u }

var (
	whole = billing.Whole
	// Products of every model, as the tests below use them.
	quotaBlock = billing.Product{ID: "qb", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(whole(100))}
	quotaAllow = billing.Product{ID: "qa", BillingModel: billing.Subscription, MeasurementType: billing.PerToken,
		Quota: ptr(whole(100)), Overage: "allow", Price: 500_000, SpendingCap: ptr(whole(10))}
	quotaAllowNoCap = billing.Product{ID: "qn", BillingModel: billing.Subscription, MeasurementType: billing.PerToken,
		Quota: ptr(whole(100)), Overage: "ALLOW", Price: 500_000}
	unlimited = billing.Product{ID: "un", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest}
	prepaid   = billing.Product{ID: "pp", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken,
		Price: 250_000}
	postpaidCap = billing.Product{ID: "po", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerByte,
		Price: 10_000, SpendingCap: ptr(whole(5))}
	instantCap = billing.Product{ID: "in", BillingModel: billing.UsageInstant, MeasurementType: billing.PerTimeUnit,
		Price: whole(2), SpendingCap: ptr(whole(5))}
	expensiveCap = billing.Product{ID: "ex", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken,
		Price: whole(10), SpendingCap: ptr(whole(5))}
	instantNoCap = billing.Product{ID: "in2", BillingModel: billing.UsageInstant, MeasurementType: billing.PerRequest,
		Price: whole(2)}
)

func TestDecide(t *testing.T) {
	tests := []struct {
		name    string
		p       billing.Product
		s       billing.State
		units   billing.Units
		allowed bool
		code    string
		overage billing.Units
		cost    billing.Units
	}{
		// SUBSCRIPTION, quota, overage blocked.
		{"quota: exactly the rest allowed", quotaBlock, billing.State{Used: whole(60), Reserved: whole(30)}, whole(10), true, "", 0, 0},
		{"quota: one unit over refused", quotaBlock, billing.State{Used: whole(60), Reserved: whole(30)}, whole(11), false, billing.CodeQuotaExceeded, whole(1), 0},
		{"quota: one millionth over refused", quotaBlock, billing.State{Used: whole(60), Reserved: whole(30)}, whole(10) + 1, false, billing.CodeQuotaExceeded, 1, 0},
		{"quota: exactly at quota from empty", quotaBlock, billing.State{}, whole(100), true, "", 0, 0},
		{"quota: used up", quotaBlock, billing.State{Used: whole(100)}, 1, false, billing.CodeQuotaExceeded, 1, 0},
		{"quota: reports pushed past it", quotaBlock, billing.State{Used: whole(150)}, whole(1), false, billing.CodeQuotaExceeded, whole(1), 0},
		{"quota: zero units always allowed", quotaBlock, billing.State{Used: whole(150)}, 0, true, "", 0, 0},

		// SUBSCRIPTION, quota, overage allowed and priced, spending cap 10.
		{"overage: within quota is free", quotaAllow, billing.State{Used: whole(50)}, whole(50), true, "", 0, 0},
		{"overage: partly past quota", quotaAllow, billing.State{Used: whole(90)}, whole(15), true, "", whole(5), 2_500_000},
		{"overage: reservations count toward quota", quotaAllow, billing.State{Used: whole(90), Reserved: whole(10)}, whole(2), true, "", whole(2), whole(1)},
		{"overage: exactly up to the cap", quotaAllow, billing.State{Used: whole(100)}, whole(20), true, "", whole(20), whole(10)},
		{"overage: one millionth of money past the cap", quotaAllow, billing.State{Used: whole(100)}, whole(20) + 2, false, billing.CodeQuotaExceeded, whole(20) + 2, whole(10) + 1},
		{"overage: settled spend counts", quotaAllow, billing.State{Used: whole(110), Spend: whole(5)}, whole(10), true, "", whole(10), whole(5)},
		{"overage: held units count", quotaAllow, billing.State{Used: whole(110), Spend: whole(5), Reserved: whole(8)}, whole(3), false, billing.CodeQuotaExceeded, whole(3), 1_500_000},
		{"overage: no cap", quotaAllowNoCap, billing.State{Used: whole(1000), Spend: whole(1000)}, whole(1000), true, "", whole(1000), whole(500)},

		// SUBSCRIPTION without quota: unlimited and free.
		{"unlimited", unlimited, billing.State{Used: whole(1_000_000)}, billing.MaxUnits, true, "", 0, 0},

		// PREPAID at 0.25 credits a unit.
		{"prepaid: credits exactly enough", prepaid, billing.State{Credits: whole(10)}, whole(40), true, "", 0, whole(10)},
		{"prepaid: one millionth short", prepaid, billing.State{Credits: whole(10) - 1}, whole(40), false, billing.CodeInsufficientCredits, 0, whole(10)},
		{"prepaid: cost one millionth over", prepaid, billing.State{Credits: whole(10)}, whole(40) + 4, false, billing.CodeInsufficientCredits, 0, whole(10) + 1},
		{"prepaid: holds count against credits", prepaid, billing.State{Credits: whole(10), CreditsHeld: 2_500_000}, whole(30), true, "", 0, 7_500_000},
		{"prepaid: holds count against credits, over", prepaid, billing.State{Credits: whole(10), CreditsHeld: 2_500_000}, whole(30) + 4, false, billing.CodeInsufficientCredits, 0, 7_500_001},
		{"prepaid: empty balance", prepaid, billing.State{}, 4, false, billing.CodeInsufficientCredits, 0, 1},
		{"prepaid: overdrawn balance", prepaid, billing.State{Credits: -whole(1)}, whole(1), false, billing.CodeInsufficientCredits, 0, 250_000},

		// USAGE_POSTPAID at 0.01 with a cap of 5.
		{"postpaid: up to the cap", postpaidCap, billing.State{Spend: whole(4)}, whole(100), true, "", 0, whole(1)},
		{"postpaid: past the cap", postpaidCap, billing.State{Spend: whole(4)}, whole(100) + 100, false, billing.CodeQuotaExceeded, 0, whole(1) + 1},
		{"postpaid: reservation past the cap", postpaidCap, billing.State{Spend: whole(4), ReservedSpend: whole(1)}, whole(1), false, billing.CodeQuotaExceeded, 0, 10_000},
		// USAGE_INSTANT at 2 with a cap of 5, and without.
		{"instant: up to the cap", instantCap, billing.State{Spend: whole(1)}, whole(2), true, "", 0, whole(4)},
		{"instant: past the cap", instantCap, billing.State{Spend: whole(1)}, whole(2) + 1, false, billing.CodeQuotaExceeded, 0, whole(4) + 2},
		{"instant: no cap", instantNoCap, billing.State{Spend: whole(1_000_000)}, whole(1_000_000), true, "", 0, whole(2_000_000)},

		// A cost that saturates must not wrap the cap check around.
		{"cap: saturated cost", expensiveCap, billing.State{Spend: whole(1)}, billing.MaxUnits, false, billing.CodeQuotaExceeded, 0, math.MaxInt64},
		{"cap: saturated cost, reserved spend", expensiveCap, billing.State{ReservedSpend: 1}, billing.MaxUnits, false, billing.CodeQuotaExceeded, 0, math.MaxInt64},
		{"cap: saturated overage cost", billing.Product{BillingModel: billing.Subscription, Quota: ptr(0), Overage: "allow", Price: whole(10), SpendingCap: ptr(whole(5))},
			billing.State{Spend: whole(1)}, billing.MaxUnits, false, billing.CodeQuotaExceeded, billing.MaxUnits, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := billing.Decide(tt.p, tt.s, tt.units)
			if d.Allowed != tt.allowed || d.Code != tt.code || d.Units != tt.units || d.Overage != tt.overage || d.Cost != tt.cost {
				t.Errorf("Decide = %+v, want allowed %v code %q overage %s cost %s", d, tt.allowed, tt.code, tt.overage, tt.cost)
			}
			if d.Allowed != (d.Reason == "") {
				t.Errorf("Decide = %+v: a reason goes with every refusal and only with one", d)
			}
		})
	}
}

func TestFit(t *testing.T) {
	tests := []struct {
		name  string
		p     billing.Product
		s     billing.State
		units billing.Units
		want  billing.Units
	}{
		{"quota: rest of the quota", quotaBlock, billing.State{Used: whole(60), Reserved: whole(30)}, whole(25), whole(10)},
		{"quota: all allowed", quotaBlock, billing.State{Used: whole(60)}, whole(25), whole(25)},
		{"quota: none left", quotaBlock, billing.State{Used: whole(100)}, whole(25), 0},
		{"overage: up to the cap", quotaAllow, billing.State{Used: whole(90)}, whole(1000), whole(30)},
		{"unlimited", unlimited, billing.State{}, billing.MaxUnits, billing.MaxUnits},
		{"prepaid: what the credits buy", prepaid, billing.State{Credits: whole(10), CreditsHeld: whole(1)}, whole(100), whole(36) + 1}, // 36.000001 × 0.25 rounds to 9
		{"prepaid: rounding lets half a millionth through", prepaid, billing.State{Credits: 1}, whole(1), 5},                            // 5 × 0.25 = 1.25 → 1
		{"prepaid: overdrawn", prepaid, billing.State{Credits: -whole(1)}, whole(1), 0},
		{"postpaid: up to the cap", postpaidCap, billing.State{Spend: whole(4)}, whole(500), whole(100) + 49}, // 100.000049 × 0.01 rounds to 1
		{"instant: up to the cap", instantCap, billing.State{Spend: whole(1)}, billing.MaxUnits, whole(2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := billing.Fit(tt.p, tt.s, tt.units)
			if got != tt.want {
				t.Errorf("Fit(%s) = %s, want %s", tt.units, got, tt.want)
			}
			if got > tt.units {
				t.Errorf("Fit(%s) = %s, more than asked", tt.units, got)
			}
			if got > 0 && !billing.Decide(tt.p, tt.s, got).Allowed {
				t.Errorf("Decide(Fit = %s) refused", got)
			}
			if got < tt.units && billing.Decide(tt.p, tt.s, got+1).Allowed {
				t.Errorf("Decide(Fit+1 = %s) allowed: Fit is not the largest", got+1)
			}
		})
	}
}

func TestHoldUnholdCharge(t *testing.T) {
	for _, p := range []billing.Product{quotaBlock, quotaAllow, unlimited, prepaid, postpaidCap, instantCap} {
		t.Run(p.ID, func(t *testing.T) {
			s0 := billing.State{Used: whole(99), Spend: whole(1), Credits: whole(50)}
			d := billing.Decide(p, s0, whole(2))
			s := s0
			s.Hold(p, d)
			if s.Reserved != s0.Reserved+d.Units || s.ReservedSpend != s0.ReservedSpend+d.Cost {
				t.Errorf("Hold(%+v): %+v", d, s)
			}
			wantHeld := billing.Units(0)
			if p.BillingModel == billing.Prepaid {
				wantHeld = d.Cost
			}
			if s.CreditsHeld != wantHeld {
				t.Errorf("Hold: credits held %s, want %s", s.CreditsHeld, wantHeld)
			}
			if s.Used != s0.Used || s.Spend != s0.Spend || s.Credits != s0.Credits {
				t.Errorf("Hold charged something: %+v", s)
			}
			s.Unhold(p, d)
			if s != s0 {
				t.Errorf("Unhold after Hold = %+v, want %+v", s, s0)
			}
			s.Unhold(p, d) // a second release never goes below zero
			if s.Reserved != 0 || s.ReservedSpend != 0 || s.CreditsHeld != 0 {
				t.Errorf("double Unhold went negative: %+v", s)
			}

			s = s0
			s.Charge(p, d)
			if s.Used != s0.Used+d.Units || s.Spend != s0.Spend+d.Cost {
				t.Errorf("Charge(%+v) = %+v", d, s)
			}
			wantCredits := s0.Credits
			if p.BillingModel == billing.Prepaid {
				wantCredits -= d.Cost
			}
			if s.Credits != wantCredits || s.Reserved != 0 || s.CreditsHeld != 0 {
				t.Errorf("Charge(%+v) = %+v, want credits %s", d, s, wantCredits)
			}
		})
	}
	// Charge saturates instead of wrapping.
	s := billing.State{Used: math.MaxInt64 - 1, Spend: math.MaxInt64 - 1}
	s.Charge(instantNoCap, billing.Decision{Units: whole(1), Cost: whole(2)})
	if s.Used != math.MaxInt64 || s.Spend != math.MaxInt64 {
		t.Errorf("Charge did not saturate: %+v", s)
	}
	// A prepaid balance overdrawn by huge reports bottoms out instead of
	// wrapping round to a large positive balance.
	s = billing.State{Credits: -whole(2)}
	for range 3 {
		s.Charge(prepaid, billing.Decision{Units: billing.MaxUnits, Cost: math.MaxInt64})
		if s.Credits != math.MinInt64 {
			t.Fatalf("Charge of an overdrawn balance: credits %d, want %d", int64(s.Credits), int64(math.MinInt64))
		}
	}
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name    string
		p       billing.Product
		s       billing.State
		units   billing.Units
		charged bool
		want    billing.Breakdown
	}{
		{"quota: within", quotaBlock, billing.State{Used: whole(40), Reserved: whole(10)}, whole(5), true, billing.Breakdown{
			UnitsUsed: whole(5), UnitsRemaining: ptr(whole(50)), TotalUnitsUsedThisCycle: whole(40)}},
		{"quota: exactly used up is not overage", quotaBlock, billing.State{Used: whole(100)}, whole(5), true, billing.Breakdown{
			UnitsUsed: whole(5), UnitsRemaining: ptr(0), TotalUnitsUsedThisCycle: whole(100)}},
		{"quota: reported past a blocked quota", quotaBlock, billing.State{Used: whole(101)}, whole(5), true, billing.Breakdown{
			UnitsUsed: whole(5), UnitsRemaining: ptr(0), TotalUnitsUsedThisCycle: whole(101), IsOverage: true, IsOverLimit: true}},
		{"quota: estimate adds the units", quotaBlock, billing.State{Used: whole(90)}, whole(5), false, billing.Breakdown{
			UnitsUsed: whole(5), UnitsRemaining: ptr(whole(5)), TotalUnitsUsedThisCycle: whole(95)}},
		{"quota: estimate past the quota", quotaBlock, billing.State{Used: whole(98)}, whole(5), false, billing.Breakdown{
			UnitsUsed: whole(5), UnitsRemaining: ptr(0), TotalUnitsUsedThisCycle: whole(103), IsOverage: true, IsOverLimit: true}},
		{"overage allowed, under the cap", quotaAllow, billing.State{Used: whole(110), Spend: whole(5)}, whole(10), true, billing.Breakdown{
			UnitsUsed: whole(10), UnitsRemaining: ptr(0), TotalUnitsUsedThisCycle: whole(110), IsOverage: true, IsOverageAllowed: true,
			RemainingSpendingCap: ptr(whole(5))}},
		{"overage allowed, estimate priced", quotaAllow, billing.State{Used: whole(100), Spend: whole(4), Reserved: whole(2), ReservedSpend: whole(1)}, whole(4), false, billing.Breakdown{
			UnitsUsed: whole(4), UnitsRemaining: ptr(0), TotalUnitsUsedThisCycle: whole(104), IsOverage: true, IsOverageAllowed: true,
			RemainingSpendingCap: ptr(whole(3))}},
		{"overage allowed, past the cap", quotaAllow, billing.State{Used: whole(200), Spend: whole(11)}, whole(2), true, billing.Breakdown{
			UnitsUsed: whole(2), UnitsRemaining: ptr(0), TotalUnitsUsedThisCycle: whole(200), IsOverage: true, IsOverageAllowed: true,
			IsOverLimit: true, RemainingSpendingCap: ptr(0)}},
		{"unlimited", unlimited, billing.State{Used: whole(7)}, whole(1), true, billing.Breakdown{
			UnitsUsed: whole(1), TotalUnitsUsedThisCycle: whole(7)}},
		{"prepaid", prepaid, billing.State{Used: whole(4), Credits: whole(9), CreditsHeld: whole(1)}, whole(4), true, billing.Breakdown{
			UnitsUsed: whole(4), TotalUnitsUsedThisCycle: whole(4), RemainingCredits: ptr(whole(8))}},
		{"prepaid estimate", prepaid, billing.State{Credits: whole(9), CreditsHeld: whole(1)}, whole(4), false, billing.Breakdown{
			UnitsUsed: whole(4), TotalUnitsUsedThisCycle: whole(4), RemainingCredits: ptr(whole(7))}},
		{"prepaid overdrawn by a report", prepaid, billing.State{Used: whole(44), Credits: -whole(1)}, whole(44), true, billing.Breakdown{
			UnitsUsed: whole(44), TotalUnitsUsedThisCycle: whole(44), IsOverLimit: true, RemainingCredits: ptr(-whole(1))}},
		// 95 used and 5 held of a quota of 100, at 0.5 a unit past it: the
		// estimate's 10 units and the 5 held end 10 past the quota together
		// whichever settles first (5 of the cap of 10). Decide priced the
		// 10 behind the holds (5 spent) and the holds were priced past them
		// again (2.5 more): 2.5 of the cap shown left, not 5.
		{"overage allowed, estimate behind holds counts them once", quotaAllow, billing.State{Used: whole(95), Reserved: whole(5)}, whole(10), false, billing.Breakdown{
			UnitsUsed: whole(10), UnitsRemaining: ptr(0), TotalUnitsUsedThisCycle: whole(105), IsOverage: true, IsOverageAllowed: true,
			RemainingSpendingCap: ptr(whole(5))}},
		{"prepaid overdrawn to the floor with a hold does not wrap", prepaid, billing.State{Credits: math.MinInt64, CreditsHeld: whole(1)}, whole(4), false, billing.Breakdown{
			UnitsUsed: whole(4), TotalUnitsUsedThisCycle: whole(4), IsOverLimit: true, RemainingCredits: ptr(math.MinInt64)}},
		{"postpaid with cap", postpaidCap, billing.State{Used: whole(300), Spend: whole(3), ReservedSpend: whole(1)}, whole(100), true, billing.Breakdown{
			UnitsUsed: whole(100), TotalUnitsUsedThisCycle: whole(300), RemainingSpendingCap: ptr(whole(1))}},
		{"postpaid past the cap", postpaidCap, billing.State{Used: whole(600), Spend: whole(6)}, whole(100), true, billing.Breakdown{
			UnitsUsed: whole(100), TotalUnitsUsedThisCycle: whole(600), IsOverLimit: true, RemainingSpendingCap: ptr(0)}},
		{"instant estimate", instantCap, billing.State{Used: whole(1), Spend: whole(2)}, whole(1), false, billing.Breakdown{
			UnitsUsed: whole(1), TotalUnitsUsedThisCycle: whole(2), RemainingSpendingCap: ptr(whole(1))}},
		{"instant without cap", instantNoCap, billing.State{Used: whole(1), Spend: whole(2)}, whole(1), true, billing.Breakdown{
			UnitsUsed: whole(1), TotalUnitsUsedThisCycle: whole(1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := billing.Summarize(tt.p, tt.s, tt.units, tt.charged)
			if !sameBreakdown(got, tt.want) {
				t.Errorf("Summarize =\n %s\nwant\n %s", showBreakdown(got), showBreakdown(tt.want))
			}
		})
	}
}

// TestOverdrawnBalanceNeverWraps: reports are charged past a prepaid
// balance, down to the smallest Units. Such a balance less a call's hold
// wrapped round to a large positive one, and every call was allowed for
// as long as something was held (an async job holds for up to job_ttl).
func TestOverdrawnBalanceNeverWraps(t *testing.T) {
	prepaid := billing.Product{ID: "p10", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: whole(10)}
	s := billing.State{Credits: whole(10)}
	s.Hold(prepaid, billing.Decide(prepaid, s, whole(1))) // a job in flight
	huge := billing.Decide(prepaid, s, billing.MaxUnits)  // its cost saturates
	s.Charge(prepaid, huge)                               // a report charged past the balance
	s.Charge(prepaid, huge)
	if s.Credits != math.MinInt64 || s.CreditsHeld <= 0 {
		t.Fatalf("state %+v: want the balance at the floor and a hold", s)
	}
	if f := s.CreditsFree(); f != math.MinInt64 {
		t.Errorf("CreditsFree = %v, want the floor", f)
	}
	if d := billing.Decide(prepaid, s, whole(1000)); d.Allowed || d.Code != billing.CodeInsufficientCredits {
		t.Errorf("1000 units on an overdrawn balance: %+v, want insufficient_credits", d)
	}
	if d := billing.Decide(prepaid, s, 0); d.Allowed {
		t.Errorf("0 units on an overdrawn balance allowed: %+v", d)
	}
}

func sameBreakdown(a, b billing.Breakdown) bool {
	eq := func(x, y *billing.Units) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.UnitsUsed == b.UnitsUsed && a.TotalUnitsUsedThisCycle == b.TotalUnitsUsedThisCycle &&
		a.IsOverLimit == b.IsOverLimit && a.IsOverage == b.IsOverage && a.IsOverageAllowed == b.IsOverageAllowed &&
		eq(a.UnitsRemaining, b.UnitsRemaining) && eq(a.RemainingCredits, b.RemainingCredits) &&
		eq(a.RemainingSpendingCap, b.RemainingSpendingCap)
}

func showBreakdown(b billing.Breakdown) string {
	raw, _ := json.Marshal(b)
	return string(raw)
}

// TestSpendingCapCountsHoldsTogether: under a SUBSCRIPTION quota with
// priced overage, which calls are overage depends on the order they settle
// in. 20 included, 0.5 a unit, cap 15: 50 holds take it all. The hold
// taken last settles first, inside the quota, for nothing; the 49 still
// held will cost 15 together, so a 51st call is refused, and the 49 all
// settle in full, whatever their order.
func TestSpendingCapCountsHoldsTogether(t *testing.T) {
	p := billing.Product{ID: "c", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(whole(20)), Overage: "allow", Price: 500_000, SpendingCap: ptr(whole(15))}
	var s billing.State
	var held []billing.Decision
	for i := range 50 {
		d := billing.Decide(p, s, whole(1))
		if !d.Allowed {
			t.Fatalf("hold %d refused: %+v", i, d)
		}
		s.Hold(p, d)
		held = append(held, d)
	}
	if d := billing.Decide(p, s, whole(1)); d.Allowed {
		t.Fatalf("51st hold allowed: %+v", d)
	}
	settle := func(d billing.Decision) {
		t.Helper()
		s.Unhold(p, d)
		c := billing.DecideCharge(p, s, d.Units)
		if !c.Allowed {
			t.Fatalf("settling a held unit refused: %+v in %+v", c, s)
		}
		s.Charge(p, c)
	}
	settle(held[49])
	if s.Spend != 0 || s.ReservedSpend != whole(15) {
		t.Errorf("after the overage hold settled first: %+v, want spend 0 and 15 held", s)
	}
	if d := billing.Decide(p, s, whole(1)); d.Allowed {
		t.Fatalf("a call past the cap allowed once a hold settled out of order: %+v in %+v", d, s)
	}
	for i := 48; i >= 0; i-- {
		settle(held[i])
	}
	if s.Used != whole(50) || s.Spend != whole(15) || s.Reserved != 0 || s.ReservedSpend != 0 {
		t.Errorf("after every settlement: %+v, want 50 used, spend 15, nothing held", s)
	}
}

// TestOverClaimInsideQuotaKeepsHolds: 20 included, 0.5 a unit, cap 15;
// 50 calls hold a unit each. The first to settle states 2.5 units: inside
// the quota they cost nothing, but they push 1.5 of the units held in
// flight past what the cap can pay. Its charge is cut to its own unit, so
// every other hold still settles in full; judged by its own cost (0) it
// took 2.5 and three calls in flight could only be settled at 0.
func TestOverClaimInsideQuotaKeepsHolds(t *testing.T) {
	p := billing.Product{ID: "c", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(whole(20)), Overage: "allow", Price: 500_000, SpendingCap: ptr(whole(15))}
	var s billing.State
	var held []billing.Decision
	for range 50 {
		d := billing.Decide(p, s, whole(1))
		s.Hold(p, d)
		held = append(held, d)
	}
	s.Unhold(p, held[0])
	if d := billing.DecideCharge(p, s, 2_500_000); d.Allowed {
		t.Errorf("a claim of 2.5 with 49 units held on a 50-unit limit allowed: %+v", d)
	}
	if got := billing.FitCharge(p, s, 2_500_000); got != whole(1) {
		t.Errorf("FitCharge = %s, want the call's own unit", got)
	}
	s.Charge(p, billing.DecideCharge(p, s, whole(1)))
	for _, d := range held[1:] {
		s.Unhold(p, d)
		if got := billing.FitCharge(p, s, 2_500_000); got != whole(1) {
			t.Fatalf("a held call fits %s of its claim in %+v, want its unit", got, s)
		}
		s.Charge(p, billing.DecideCharge(p, s, whole(1)))
	}
	if s.Used != whole(50) || s.Spend != whole(15) {
		t.Errorf("after every settlement: %+v, want 50 used, spend 15", s)
	}
	// A call that adds nothing to the spend is not refused by a cap a
	// report already passed.
	over := billing.State{Used: whole(60), Spend: whole(20)}
	if d := billing.DecideCharge(p, over, 0); !d.Allowed {
		t.Errorf("a charge of 0 past the cap refused: %+v", d)
	}
}

// TestRefusalReasons: an insufficient_credits refusal says the balance
// (after what calls in flight hold) and what the call costs at which
// price; a quota refusal gains the period's reset time in RFC 3339.
func TestRefusalReasons(t *testing.T) {
	p := prepaid
	p.UnitLabel = "token"
	d := billing.Decide(p, billing.State{Credits: whole(3), CreditsHeld: 500_000}, whole(12))
	want := "not enough credits: the balance is 2.5, this call costs 3 (0.25 per token)"
	if d.Allowed || d.Reason != want {
		t.Errorf("reason %q, want %q", d.Reason, want)
	}
	end := time.Date(2026, 12, 17, 9, 30, 0, 0, time.FixedZone("CET", 3600))
	if got := billing.WithReset("quota for this period is used up", end); got != "quota for this period is used up; the period resets at 2026-12-17T08:30:00Z" {
		t.Errorf("WithReset = %q", got)
	}
}

func TestQuotaAndCapLeft(t *testing.T) {
	tests := []struct {
		name    string
		s       billing.State
		limit   billing.Units
		quota   billing.Units // QuotaLeft(limit)
		capLeft billing.Units // SpendingCapLeft(limit)
	}{
		{"untouched", billing.State{}, whole(10), whole(10), whole(10)},
		{"settled and held both count", billing.State{Used: whole(3), Reserved: whole(2), Spend: whole(1), ReservedSpend: whole(4)}, whole(10), whole(5), whole(5)},
		{"exactly used up", billing.State{Used: whole(6), Reserved: whole(4), Spend: whole(10)}, whole(10), 0, 0},
		{"past it is 0, never negative", billing.State{Used: whole(12), Reserved: whole(1), Spend: whole(9), ReservedSpend: whole(3)}, whole(10), 0, 0},
		{"millionths", billing.State{Used: 1, ReservedSpend: 2}, 5, 4, 3},
		{"zero limit", billing.State{}, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.s.QuotaLeft(tt.limit); got != tt.quota {
				t.Errorf("QuotaLeft(%s) = %s, want %s", tt.limit, got, tt.quota)
			}
			if got := tt.s.SpendingCapLeft(tt.limit); got != tt.capLeft {
				t.Errorf("SpendingCapLeft(%s) = %s, want %s", tt.limit, got, tt.capLeft)
			}
		})
	}
}

// TestHoldsOfTwoProductsReleaseAllSpend: a hold taken under a product
// priced by the quota (the spend of every hold together) and one taken
// after a reload changed it to a usage product (each hold its own cost):
// both released, no spend is left held. 8 was, and the spending cap
// refused early until a restart.
func TestHoldsOfTwoProductsReleaseAllSpend(t *testing.T) {
	p := billing.Product{ID: "p", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(whole(1)), Overage: "allow", Price: whole(5), SpendingCap: ptr(whole(100))}
	p2 := billing.Product{ID: "p", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: whole(1), SpendingCap: ptr(whole(100))}
	s := billing.State{Used: whole(1), Spend: 0}
	a := billing.Decide(p, s, whole(3))
	s.Hold(p, a)
	b := billing.Decide(p2, s, whole(2))
	s.Hold(p2, b)
	s.Unhold(p, a)
	s.Charge(p, billing.DecideCharge(p, s, whole(3)))
	s.Unhold(p2, b)
	s.Charge(p2, billing.DecideCharge(p2, s, whole(2)))
	if s.Reserved != 0 || s.ReservedSpend != 0 {
		t.Errorf("every hold released, yet %s units and %s spend held", s.Reserved, s.ReservedSpend)
	}
}

// TestCeiling: the most a call holding a reservation can be charged is its
// hold plus what the hard limits leave after every hold, and nothing binds
// where no hard limit can.
func TestCeiling(t *testing.T) {
	free := billing.Product{ID: "pf", BillingModel: billing.Prepaid, MeasurementType: billing.PerByte}
	tests := []struct {
		name  string
		p     billing.Product
		s     billing.State // before the call's hold
		hold  billing.Units
		want  billing.Units
		bound bool
	}{
		{"quota block: the rest of the quota", quotaBlock, billing.State{Used: whole(60), Reserved: whole(10)}, whole(5), whole(30), true},
		{"quota block: only the hold left", quotaBlock, billing.State{Used: whole(95)}, whole(5), whole(5), true},
		{"prepaid: what the credits buy", prepaid, billing.State{Credits: whole(10)}, whole(4), whole(40) + 1, true},
		{"prepaid: others' holds count", prepaid, billing.State{Credits: whole(10), CreditsHeld: whole(5)}, whole(4), whole(20) + 1, true},
		{"spending cap", instantCap, billing.State{Spend: whole(1)}, whole(1), whole(2), true},
		{"overage allow under a cap", quotaAllow, billing.State{Used: whole(90)}, whole(1), whole(30), true},
		{"overage allow, no cap", quotaAllowNoCap, billing.State{Used: whole(90)}, whole(1), 0, false},
		{"unlimited", unlimited, billing.State{}, whole(1), 0, false},
		{"prepaid at price 0", free, billing.State{}, whole(1), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.s
			d := billing.Decide(tt.p, s, tt.hold)
			if !d.Allowed {
				t.Fatalf("hold refused: %+v", d)
			}
			s.Hold(tt.p, d)
			got, bound := billing.Ceiling(tt.p, s, d)
			if got != tt.want || bound != tt.bound {
				t.Errorf("Ceiling = %s, %v; want %s, %v", got, bound, tt.want, tt.bound)
			}
			if bound && got < tt.hold {
				t.Errorf("Ceiling %s below the hold %s", got, tt.hold)
			}
		})
	}
}
