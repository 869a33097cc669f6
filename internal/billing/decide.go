package billing

import (
	"fmt"
	"math"
	"time"
)

// Denial codes, the same strings as the JSON error codes of the wire contract.
const (
	CodeQuotaExceeded       = "quota_exceeded"
	CodeInsufficientCredits = "insufficient_credits"
)

// State is what one subscription has consumed in its current period and
// what it holds: the input of every decision.
type State struct {
	Used          Units `json:"used"`           // settled units this period
	Reserved      Units `json:"reserved"`       // units held by calls in flight
	Spend         Units `json:"spend"`          // settled priced spend this period
	ReservedSpend Units `json:"reserved_spend"` // spend held by calls in flight
	Credits       Units `json:"credits"`        // prepaid balance after settled charges
	CreditsHeld   Units `json:"credits_held"`   // credits held by calls in flight
}

// QuotaLeft is what is left of a quota of q units in this state: neither
// settled nor held by calls in flight, never below 0. Decide prices
// against it, and the RateLimit headers, the breakdowns and the admin
// API's summaries show it, all from here.
func (s State) QuotaLeft(q Units) Units { return max(0, q-s.Used-s.Reserved) }

// CreditsFree is the prepaid balance neither spent nor held by calls in
// flight. It saturates: reports are charged past the balance (down to the
// smallest Units, see Charge), and such a balance less a hold wrapped round
// to a large positive one, on which every call was allowed.
func (s State) CreditsFree() Units {
	f := s.Credits - s.CreditsHeld
	if s.CreditsHeld > 0 && f > s.Credits {
		return math.MinInt64
	}
	return f
}

// SpendingCapLeft is what is left of a spending cap c in this state:
// neither spent nor held, never below 0.
func (s State) SpendingCapLeft(c Units) Units { return max(0, c-s.Spend-s.ReservedSpend) }

// Decision says whether some units may be consumed and what they cost.
type Decision struct {
	Allowed bool
	Code    string // CodeQuotaExceeded or CodeInsufficientCredits when refused
	Reason  string // human words for the refusal
	Units   Units
	Overage Units // how many of Units lie past the quota
	Cost    Units // priced cost of Units: credits for PREPAID, money otherwise
}

// price returns the overage units and cost of consuming units on top of
// used+reserved.
func price(p Product, s State, units Units) (overage, cost Units) {
	if p.Quota != nil {
		if left := s.QuotaLeft(*p.Quota); units > left {
			overage = units - left
		}
	}
	priced := units
	if p.BillingModel == Subscription {
		// Only overage is priced, and only overage the product allows:
		// past a blocked quota the price is never charged (Warnings says
		// so, the catalog lists no overage price), though a report is
		// recorded there.
		priced = 0
		if p.OverageAllowed() {
			priced = overage
		}
	}
	return overage, Mul(priced, p.Price)
}

// Decide tells whether the subscription in state s may consume units now,
// without changing anything. The limits are hard: a quota with overage
// blocked, the prepaid balance, and the spending cap.
func Decide(p Product, s State, units Units) Decision {
	overage, cost := price(p, s, units)
	return judge(p, s, units, overage, cost)
}

// DecideCharge decides the charge of units for a call whose own hold s no
// longer includes. The units are priced against the settled usage, not
// behind the other calls' holds: priced behind them, units within the
// included quota were billed as overage whenever other calls were in
// flight. The hard limits still count those holds, so that a charge never
// takes what another call was promised.
func DecideCharge(p Product, s State, units Units) Decision {
	if !p.OverageAllowed() {
		// A blocked quota counts the holds (they are promises); its units
		// are never priced by the quota, so that changes no price.
		return Decide(p, s, units)
	}
	if !orderPriced(p) {
		s.Reserved = 0 // only the overage shown depends on it
		return Decide(p, s, units)
	}
	overage := pastQuota(*p.Quota, s.Used, sat(s.Used+units))
	return judge(p, s, units, overage, Mul(overage, p.Price))
}

// insufficientCredits says what the balance is and what the call costs, so
// a caller knows how much to top up.
func insufficientCredits(p Product, s State, cost Units) string {
	unit := p.UnitLabel
	if unit == "" {
		unit = "unit"
	}
	return fmt.Sprintf("not enough credits: the balance is %s, this call costs %s (%s per %s)",
		s.CreditsFree(), cost, p.Price, unit)
}

// WithReset adds to a quota or spending cap refusal when the period resets
// (RFC 3339, UTC): retryAfter says it in seconds, this says it as a time.
func WithReset(reason string, end time.Time) string {
	return reason + "; the period resets at " + end.UTC().Format(time.RFC3339)
}

func judge(p Product, s State, units, overage, cost Units) Decision {
	d := Decision{Allowed: true, Units: units, Overage: overage, Cost: cost}
	switch {
	case overage > 0 && !p.OverageAllowed():
		d.Allowed, d.Code, d.Reason = false, CodeQuotaExceeded, "quota for this period is used up"
	case p.BillingModel == Prepaid && cost > s.CreditsFree():
		d.Allowed, d.Code, d.Reason = false, CodeInsufficientCredits, insufficientCredits(p, s, cost)
	case p.SpendingCap != nil && addsSpend(p, s, units, cost) && spendAfter(p, s, units, cost) > *p.SpendingCap:
		d.Allowed, d.Code, d.Reason = false, CodeQuotaExceeded, "spending cap for this period is reached"
	}
	return d
}

// addsSpend tells whether consuming units adds to what the period will
// spend once every hold settles: only such a call can cross the spending
// cap (one that adds nothing is never refused by a cap a report already
// passed). Under an order-priced quota that is not the call's own cost: a
// charge priced against the settled usage alone costs nothing while it is
// inside the quota, yet it pushes the calls in flight past the quota, into
// the spend their holds were promised. Judged by its own cost, a backend
// that stated more units than its call held took that room inside the
// quota, and the calls whose holds it took were settled at 0 units: served
// free.
func addsSpend(p Product, s State, units, cost Units) bool {
	if orderPriced(p) {
		return spendAfter(p, s, units, cost) > spendAfter(p, s, 0, 0)
	}
	return cost > 0
}

// orderPriced tells whether which of a period's units are overage depends
// on the order its calls settle in: a SUBSCRIPTION quota, past which units
// are priced. There a hold's own cost is no promise: a hold taken inside
// the quota (cost 0) is billed as overage when holds taken after it settle
// first, and one taken past the quota is billed nothing when it settles
// first. Summing the holds' own costs therefore under-counted what the
// calls in flight would cost together, and the spending cap let calls
// through that it then could not charge. A blocked quota prices nothing
// past it (price), so its holds are priced at their own cost, 0: repriced
// past it, a report that took the period over the quota showed spend held
// that no settlement charges.
func orderPriced(p Product) bool {
	return p.BillingModel == Subscription && p.Quota != nil && p.OverageAllowed()
}

// pastQuota is how many of the units from from to to lie past quota q.
func pastQuota(q, from, to Units) Units { return max(0, to-q) - max(0, from-q) }

// spendAfter is the period's spend once units costing cost are charged on
// top of s and every hold of s is settled too, in whatever order. Sums
// saturate: Mul saturates at MaxInt64 for huge quantities, and a plain sum
// wrapped negative and let the call through.
func spendAfter(p Product, s State, units, cost Units) Units {
	if orderPriced(p) {
		// Whatever order they settle in, the calls in flight and this
		// one together consume the same units past the quota.
		return sat(s.Spend + Mul(pastQuota(*p.Quota, s.Used, sat(sat(s.Used+s.Reserved)+units)), p.Price))
	}
	return sat(sat(s.Spend+s.ReservedSpend) + cost)
}

// heldSpend is what the holds of s will cost together, settled in any
// order, on top of the settled usage.
func heldSpend(p Product, s State) Units {
	return Mul(pastQuota(*p.Quota, s.Used, sat(s.Used+s.Reserved)), p.Price)
}

// Fit returns the largest quantity not above units that Decide allows:
// what may still be charged for a call whose backend reported more units
// than were reserved, without crossing a hard limit.
func Fit(p Product, s State, units Units) Units {
	return fit(func(u Units) bool { return Decide(p, s, u).Allowed }, units)
}

// FitCharge is Fit for DecideCharge.
func FitCharge(p Product, s State, units Units) Units {
	return fit(func(u Units) bool { return DecideCharge(p, s, u).Allowed }, units)
}

func fit(allowed func(Units) bool, units Units) Units {
	if allowed(units) {
		return units
	}
	lo, hi := Units(0), units // allowed(lo) holds or lo == 0; allowed(hi) fails
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if allowed(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// Hold adds a reservation of d to the state.
func (s *State) Hold(p Product, d Decision) {
	s.Reserved += d.Units
	s.ReservedSpend += d.Cost
	if p.BillingModel == Prepaid {
		s.CreditsHeld += d.Cost
	}
	s.reprice(p)
}

// Unhold removes a reservation previously added with Hold.
func (s *State) Unhold(p Product, d Decision) {
	s.Reserved = max(0, s.Reserved-d.Units)
	s.ReservedSpend = max(0, s.ReservedSpend-d.Cost)
	if p.BillingModel == Prepaid {
		s.CreditsHeld = max(0, s.CreditsHeld-d.Cost)
	}
	s.reprice(p)
	if s.Reserved == 0 {
		// Nothing held, so no spend held either. Holds taken under two
		// products (a reload or a plan change between them) are priced by
		// different rules, one by its own cost, one together with every
		// hold (reprice); released, they left spend held that no call
		// held, and the spending cap refused early until a restart.
		s.ReservedSpend = 0
	}
}

// Charge settles consumption of d into the state. Reports and job
// completions are charged even past a limit: the work was already done.
func (s *State) Charge(p Product, d Decision) {
	s.Used = sat(s.Used + d.Units)
	s.Spend = sat(s.Spend + d.Cost)
	if p.BillingModel == Prepaid {
		// Saturate: reports are charged past the balance, and a huge one
		// (cost saturated at MaxInt64) wrapped an overdrawn balance round
		// to a large positive one.
		if c := s.Credits - d.Cost; c > s.Credits && d.Cost > 0 {
			s.Credits = math.MinInt64
		} else {
			s.Credits = c
		}
	}
	s.reprice(p)
}

// reprice sets the spend held to what the holds will cost together, where
// that depends on the order they settle in (see orderPriced), so that
// the spend held and remainingSpendingCap are never an under-count.
func (s *State) reprice(p Product) {
	if orderPriced(p) {
		s.ReservedSpend = heldSpend(p, *s)
	}
}

func sat(u Units) Units {
	if u < 0 { // overflowed
		return math.MaxInt64
	}
	return u
}

// Breakdown is the usage summary returned by reports and estimates. The
// pointer fields appear only where they apply to the product. IsOverage means
// the period's usage is past the included quota; IsOverLimit means a hard
// limit (blocked quota, prepaid balance, spending cap) has been crossed:
// recorded-after-the-fact usage (reports, completions) and credits taken back
// can do it, and so then can a served call charged its hold past the limit
// they took (store.ChargeFloor), never a call on its own.
type Breakdown struct {
	UnitsUsed               Units  `json:"unitsUsed"`
	UnitsRemaining          *Units `json:"unitsRemaining,omitempty"`
	TotalUnitsUsedThisCycle Units  `json:"totalUnitsUsedThisCycle"`
	IsOverLimit             bool   `json:"isOverLimit"`
	IsOverage               bool   `json:"isOverage"`
	IsOverageAllowed        bool   `json:"isOverageAllowed"`
	RemainingCredits        *Units `json:"remainingCredits,omitempty"`
	RemainingSpendingCap    *Units `json:"remainingSpendingCap,omitempty"`
}

// Summarize describes state s after a call of units (already included in s
// when charged is true, or hypothetically added when it is false, as for an
// estimate).
func Summarize(p Product, s State, units Units, charged bool) Breakdown {
	if !charged {
		// Priced as its settlement would be: against the settled usage.
		// Decide prices the units behind the holds, and Charge's reprice
		// then priced the holds past them again, counting the overage of
		// the calls in flight twice in remainingSpendingCap.
		d := DecideCharge(p, s, units)
		s.Charge(p, d)
	}
	b := Breakdown{
		UnitsUsed:               units,
		TotalUnitsUsedThisCycle: s.Used,
		IsOverageAllowed:        p.OverageAllowed(),
	}
	if p.Quota != nil {
		left := s.QuotaLeft(*p.Quota)
		b.UnitsRemaining = &left
		b.IsOverage = s.Used > *p.Quota
		b.IsOverLimit = b.IsOverage && !p.OverageAllowed()
	}
	if p.BillingModel == Prepaid {
		c := s.CreditsFree()
		b.RemainingCredits = &c
		b.IsOverLimit = b.IsOverLimit || s.Credits < 0
	}
	if p.SpendingCap != nil {
		c := s.SpendingCapLeft(*p.SpendingCap)
		b.RemainingSpendingCap = &c
		b.IsOverLimit = b.IsOverLimit || s.Spend > *p.SpendingCap
	}
	return b
}

// Ceiling is the most a call holding d (its reservation, included in s)
// can be charged when it settles, as far as s knows: what DecideCharge
// allows once its own hold is released, and true; false when no hard limit
// can bind (no quota with overage blocked, not prepaid, no spending cap,
// or limits that never price what the call uses), when the call may be
// charged any quantity. The gateway cuts a measured stream there
// (docs/wire-contract.md): what it delivers past it would go uncharged.
// Other calls settling change what is left, so it is the ceiling at the
// time of s, not a promise.
func Ceiling(p Product, s State, d Decision) (Units, bool) {
	blocked := p.Quota != nil && !p.OverageAllowed()
	if !blocked && p.BillingModel != Prepaid && p.SpendingCap == nil {
		return 0, false
	}
	s.Unhold(p, d)
	c := FitCharge(p, s, MaxUnits)
	if c >= MaxUnits {
		return 0, false // the limits price nothing the call uses
	}
	return max(c, d.Units), true
}
