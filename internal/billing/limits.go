package billing

import "math"

// HardLimits are a product's hard limits (the refusals of judge) as bounds
// on three quantities of a billing period, for a store that enforces them
// by counting rather than by calling Decide (pgstore's leases):
//
//   - a blocked quota caps units: used + held + n <= quota;
//   - a prepaid balance caps credits: credits held + cost <= credits, the
//     cost of n units being n × price whatever the quota (at price 0,
//     a balance below zero refuses every call);
//   - a spending cap on usage priced per unit (every model but
//     SUBSCRIPTION) caps spend: spend + held spend + n × price <= cap;
//   - a spending cap of a SUBSCRIPTION product whose overage is billed
//     prices only the units past the quota, in whatever order calls
//     settle (orderPriced), so the cap is a cap on units: the quota (or
//     the units already used past it) plus the overage units that what
//     the period's spend leaves of the cap pays for (UnitsBound). A
//     bound of the quota plus the units the whole cap buys did not see
//     spend recorded earlier in the period under another product: after
//     2 USD spent, a cap of 3 USD let 3 more USD of overage through on a
//     fleet node where judge lets 1.
//
// A SUBSCRIPTION product with a quota that blocks never prices anything,
// so its cap bounds nothing; one without a quota prices nothing either.
// The rules sit here, beside judge, so that a change to a limit is made
// to both.
type HardLimits struct {
	// Units caps settled plus held units in the period; with OverageCap
	// it is the quota, and the cap is UnitsBound.
	Units *Units
	// OverageCap is the spending cap of a SUBSCRIPTION product whose
	// overage is billed: with it, the cap on units depends on the
	// period's settled units and spend (UnitsBound).
	OverageCap *Units
	// Spend caps settled plus held spend in the period.
	Spend *Units
	// Credits: the prepaid balance bounds the credits held.
	Credits bool
	// Price is what one unit costs in the Spend and Credits dimensions.
	Price Units
	// Unit is the cost unit the period's spend is counted in for Spend
	// and OverageCap (CostUnit): spend in other units is no part of it.
	Unit string
}

// HardLimits maps the product's hard limits onto the three bounds.
func (p Product) HardLimits() HardLimits {
	var l HardLimits
	l.Price, l.Unit = p.Price, p.CostUnit()
	blocked := p.Quota != nil && !p.OverageAllowed()
	if blocked {
		q := *p.Quota
		l.Units = &q
	}
	if p.BillingModel == Prepaid {
		// At any price: judge refuses every call of a PREPAID product on
		// an overdrawn balance (cost 0 > a negative balance), so must
		// the leases. Bounding only priced products let a PREPAID product
		// of price 0 be called on PostgreSQL where the embedded store
		// (and the portal, and the docs) refused.
		l.Credits = true
	}
	if p.SpendingCap != nil && p.Price > 0 {
		switch {
		case p.BillingModel != Subscription:
			c := *p.SpendingCap
			l.Spend = &c
		case p.Quota != nil && !blocked:
			q, c := *p.Quota, *p.SpendingCap
			l.Units, l.OverageCap = &q, &c
		}
	}
	return l
}

// UnitsBound is the most units settled plus held in a period may reach,
// once used units are settled in it and spend spent (in the product's
// cost unit): Units, or with an OverageCap what judge allows, the quota
// or the units already used past it (units are priced only past both:
// pastQuota), plus the overage units that what spend leaves of the cap
// pays for. It saturates at math.MaxInt64. Units must be set.
func (l HardLimits) UnitsBound(used, spend Units) Units {
	if l.OverageCap == nil {
		return *l.Units
	}
	from := max(*l.Units, used)
	return from + min(overageUnits(*l.OverageCap-max(spend, 0), l.Price), math.MaxInt64-from)
}

// overageUnits is the most units whose price fits in budget, saturating
// at math.MaxInt64 (as Div does) when budget buys more than Units holds.
func overageUnits(budget, price Units) Units {
	most := Div(budget, price)
	if most > math.MaxInt64-Scale {
		return math.MaxInt64
	}
	lo, hi := Units(0), most+Scale
	for lo < hi { // the largest u with Mul(u, price) <= budget
		mid := lo + (hi-lo+1)/2
		if Mul(mid, price) <= budget {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
