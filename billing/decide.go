package billing

import "math"

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
		left := *p.Quota - s.Used - s.Reserved
		if left < 0 {
			left = 0
		}
		if units > left {
			overage = units - left
		}
	}
	priced := units
	if p.BillingModel == Subscription {
		priced = overage
	}
	return overage, Mul(priced, p.Price)
}

// Decide tells whether the subscription in state s may consume units now,
// without changing anything. The limits are hard: a quota with overage
// blocked, the prepaid balance, and the spending cap.
func Decide(p Product, s State, units Units) Decision {
	overage, cost := price(p, s, units)
	d := Decision{Allowed: true, Units: units, Overage: overage, Cost: cost}
	switch {
	case overage > 0 && !p.OverageAllowed():
		d.Allowed, d.Code, d.Reason = false, CodeQuotaExceeded, "quota for this period is used up"
	case p.BillingModel == Prepaid && cost > s.Credits-s.CreditsHeld:
		d.Allowed, d.Code, d.Reason = false, CodeInsufficientCredits, "not enough credits"
	// Compare cost with what is left under the cap rather than adding it to
	// the spend: Mul saturates at MaxInt64 for huge quantities, and
	// spend+cost then wrapped negative and let the call through.
	case p.SpendingCap != nil && cost > 0 && cost > *p.SpendingCap-sat(s.Spend+s.ReservedSpend):
		d.Allowed, d.Code, d.Reason = false, CodeQuotaExceeded, "spending cap for this period is reached"
	}
	return d
}

// Fit returns the largest quantity not above units that Decide allows:
// what may still be charged for a call whose backend reported more units
// than were reserved, without crossing a hard limit.
func Fit(p Product, s State, units Units) Units {
	if Decide(p, s, units).Allowed {
		return units
	}
	lo, hi := Units(0), units // Decide(lo) holds or lo == 0; Decide(hi) fails
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if Decide(p, s, mid).Allowed {
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
}

// Unhold removes a reservation previously added with Hold.
func (s *State) Unhold(p Product, d Decision) {
	s.Reserved = max(0, s.Reserved-d.Units)
	s.ReservedSpend = max(0, s.ReservedSpend-d.Cost)
	if p.BillingModel == Prepaid {
		s.CreditsHeld = max(0, s.CreditsHeld-d.Cost)
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
// limit (blocked quota, prepaid balance, spending cap) has been crossed, which
// only recorded-after-the-fact usage (reports, completions) can do.
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
		d := Decide(p, s, units)
		s.Charge(p, d)
	}
	b := Breakdown{
		UnitsUsed:               units,
		TotalUnitsUsedThisCycle: s.Used,
		IsOverageAllowed:        p.OverageAllowed(),
	}
	if p.Quota != nil {
		left := max(0, *p.Quota-s.Used-s.Reserved)
		b.UnitsRemaining = &left
		b.IsOverage = s.Used > *p.Quota
		b.IsOverLimit = b.IsOverage && !p.OverageAllowed()
	}
	if p.BillingModel == Prepaid {
		c := s.Credits - s.CreditsHeld
		b.RemainingCredits = &c
		b.IsOverLimit = b.IsOverLimit || s.Credits < 0
	}
	if p.SpendingCap != nil {
		c := max(0, *p.SpendingCap-s.Spend-s.ReservedSpend)
		b.RemainingSpendingCap = &c
		b.IsOverLimit = b.IsOverLimit || s.Spend > *p.SpendingCap
	}
	return b
}
