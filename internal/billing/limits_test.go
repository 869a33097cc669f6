package billing_test

import (
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

func TestHardLimits(t *testing.T) {
	none := billing.Units(-1) // no bound in that dimension
	tests := []struct {
		name         string
		p            billing.Product
		units, spend billing.Units
		credits      bool
	}{
		{"blocked quota caps units", quotaBlock, whole(100), none, false},
		{"unlimited bounds nothing", unlimited, none, none, false},
		{"prepaid bounds credits", prepaid, none, none, true},
		// As Decide: an overdrawn balance refuses calls that cost nothing.
		{"free prepaid bounds credits", billing.Product{BillingModel: billing.Prepaid}, none, none, true},
		{"postpaid cap caps spend", postpaidCap, none, whole(5), false},
		{"instant cap caps spend", instantCap, none, whole(5), false},
		{"instant without cap bounds nothing", instantNoCap, none, none, false},
		// 100 included, then 0.5 a unit up to a cap of 10: 20 more units.
		{"billed overage with a cap caps units", quotaAllow, whole(120), none, false},
		{"billed overage without a cap bounds nothing", quotaAllowNoCap, none, none, false},
		{"cap of a blocked quota bounds only the quota", billing.Product{BillingModel: billing.Subscription,
			Quota: ptr(whole(5)), Price: whole(1), SpendingCap: ptr(whole(3))}, whole(5), none, false},
		{"subscription cap without a quota bounds nothing", billing.Product{BillingModel: billing.Subscription,
			Price: whole(1), SpendingCap: ptr(whole(3))}, none, none, false},
		{"cap at price 0 bounds nothing", billing.Product{BillingModel: billing.UsagePostpaid,
			SpendingCap: ptr(whole(3))}, none, none, false},
		// 0.3 a unit with 1 to spend: 3.333334 units cost 1.0000002, rounded to 1.
		{"overage units round down to what the cap pays", billing.Product{BillingModel: billing.Subscription,
			Quota: ptr(whole(2)), Overage: "allow", Price: 300_000, SpendingCap: ptr(whole(1))}, whole(2) + 3_333_334, none, false},
		{"prepaid with a cap bounds both", billing.Product{BillingModel: billing.Prepaid, Price: whole(2),
			SpendingCap: ptr(whole(10))}, none, whole(10), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := tt.p.HardLimits()
			if got := unitsBound(l); got != tt.units {
				t.Errorf("Units = %s, want %s", got, tt.units)
			}
			if got := bound(l.Spend); got != tt.spend {
				t.Errorf("Spend = %s, want %s", got, tt.spend)
			}
			if l.Credits != tt.credits {
				t.Errorf("Credits = %v, want %v", l.Credits, tt.credits)
			}
			if l.Price != tt.p.Price {
				t.Errorf("Price = %s, want %s", l.Price, tt.p.Price)
			}
			if l.Units != nil && tt.p.Quota != nil && l.Units == tt.p.Quota {
				t.Error("Units aliases the product's quota")
			}
		})
	}
}

// unitsBound is l's cap on units in a period with nothing used or spent.
func unitsBound(l billing.HardLimits) billing.Units {
	if l.Units == nil {
		return -1
	}
	return l.UnitsBound(0, 0)
}

func bound(u *billing.Units) billing.Units {
	if u == nil {
		return -1
	}
	return *u
}

// TestHardLimitsCapPastUnits: a SUBSCRIPTION cap that pays for more
// overage units than Units can hold (a cap of 10,000,000 at 0.000001 a
// unit) bounds nothing Decide would refuse. overageUnits' upper bound,
// Div saturated at MaxInt64 plus one unit, wrapped negative: the bound
// was the quota alone, so pgstore refused every overage unit that Decide
// (and boltstore) let through and priced under the cap.
func TestHardLimitsCapPastUnits(t *testing.T) {
	p := billing.Product{ID: "big-cap", BillingModel: billing.Subscription, MeasurementType: billing.PerToken,
		Quota: ptr(whole(100)), Overage: "allow", Price: 1, SpendingCap: ptr(whole(10_000_000))}
	st := billing.State{Used: whole(100)}
	if d := billing.Decide(p, st, whole(1000)); !d.Allowed {
		t.Fatalf("Decide refuses 1000 overage units: %+v", d)
	}
	l := p.HardLimits()
	if unitsBound(l) < whole(100)+whole(1000) {
		t.Errorf("Units = %s: the bound refuses what Decide allows", unitsBound(l))
	}
	// Quota and overage together past what Units holds: saturated, not wrapped.
	p.Quota, p.Price, p.SpendingCap = ptr(billing.MaxUnits), 1, ptr(whole(9_000_000))
	if l := p.HardLimits(); unitsBound(l) < billing.MaxUnits {
		t.Errorf("Units = %s for a quota of %s and a cap worth 9e12 more units", unitsBound(l), billing.MaxUnits)
	}
}

// TestUnitsBoundAsDecide: the cap on units of a SUBSCRIPTION product
// whose overage is billed and capped allows exactly what Decide allows,
// whatever the period used and spent before (under another product
// too): after 2 spent of a cap of 3, at 1 a unit past a quota of 5, one
// unit of overage, not the 3 the whole cap buys.
func TestUnitsBoundAsDecide(t *testing.T) {
	for _, p := range []billing.Product{
		{BillingModel: billing.Subscription, Quota: ptr(whole(5)), Overage: "allow", Price: whole(1), SpendingCap: ptr(whole(3))},
		{BillingModel: billing.Subscription, Quota: ptr(whole(2)), Overage: "allow", Price: 300_000, SpendingCap: ptr(whole(1))},
		{BillingModel: billing.Subscription, Quota: ptr(whole(10)), Overage: "allow", Price: 500_000, SpendingCap: ptr(whole(10))},
	} {
		l := p.HardLimits()
		for _, used := range []billing.Units{0, whole(1), whole(2), whole(4), whole(5), whole(6), whole(8), whole(12), whole(30)} {
			for _, spend := range []billing.Units{0, 400_000, whole(1), whole(2), 2_999_999, whole(3), whole(4), whole(10), whole(11)} {
				st := billing.State{Used: used, Spend: spend}
				most := billing.Fit(p, st, whole(1000))
				// Past the cap Decide still lets through a sliver
				// whose price rounds to 0 (a millionth at 0.3), which
				// adds no spend; the bound keeps it out.
				got := max(0, l.UnitsBound(used, spend)-used)
				if got != most && !(got < most && spend >= *p.SpendingCap && billing.Mul(most-got, p.Price) == 0) {
					t.Errorf("quota %s, price %s, cap %s; used %s, spent %s: bound leaves %s units, Decide allows %s",
						*p.Quota, p.Price, *p.SpendingCap, used, spend, got, most)
				}
			}
		}
	}
	l := billing.Product{BillingModel: billing.Subscription, Quota: ptr(whole(5)), Overage: "allow", Price: whole(1),
		SpendingCap: ptr(whole(3))}.HardLimits()
	if got := l.UnitsBound(whole(4), whole(2)); got != whole(6) {
		t.Errorf("after 4 units and 2 spent: bound %s, want 6 (1 inside the quota, 1 the cap pays for)", got)
	}
}
