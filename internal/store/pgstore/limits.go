package pgstore

import (
	"github.com/platformgw/gateway/internal/billing"
)

// limitsOf maps a product's hard limits (billing.judge) onto the three
// dimensions a lease bounds:
//
//   - a blocked quota caps units: used + leased + n <= quota;
//   - a prepaid balance caps credits: credits held + cost <= credits, the
//     cost of n units being n × price whatever the quota;
//   - a spending cap on usage priced per unit (every model but
//     SUBSCRIPTION) caps spend: spend + leased spend + n × price <= cap;
//   - a spending cap of a SUBSCRIPTION product whose overage is billed
//     prices only the units past the quota, in whatever order calls
//     settle, so the cap is a cap on units: quota + the overage units the
//     cap pays for.
//
// A SUBSCRIPTION product with a quota that blocks never prices anything,
// so its cap bounds nothing; one without a quota prices nothing either.
func limitsOf(p billing.Product) Limits {
	var l Limits
	l.Price = p.Price
	blocked := p.Quota != nil && !p.OverageAllowed()
	if blocked {
		q := *p.Quota
		l.Units = &q
	}
	if p.BillingModel == billing.Prepaid && p.Price > 0 {
		l.Credits = true
	}
	if p.SpendingCap != nil && p.Price > 0 {
		switch {
		case p.BillingModel != billing.Subscription:
			c := *p.SpendingCap
			l.Spend = &c
		case p.Quota != nil && !blocked:
			u := *p.Quota + overageUnits(*p.SpendingCap, p.Price)
			l.Units = &u
		}
	}
	return l
}

// overageUnits is the most units whose price fits in budget.
func overageUnits(budget, price billing.Units) billing.Units {
	lo, hi := billing.Units(0), billing.Div(budget, price)+billing.Scale
	for lo < hi { // the largest u with Mul(u, price) <= budget
		mid := lo + (hi-lo+1)/2
		if billing.Mul(mid, price) <= budget {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
