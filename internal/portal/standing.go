package portal

import (
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/subscription"
)

// A subscription's standing: how far along its quota and spending cap
// are (the bars), and whether the gateway refuses its calls now and what
// the caller can do about it (the banner). Whether a call would be
// refused is asked of billing.Decide, the rule the gateway applies, with
// the period's figures the summary read.

// Levels of a bar: under 80%, from 80%, from 100%.
const (
	levelOK   = "ok"
	levelWarn = "warn"
	levelOver = "over"
)

// warnPercent is where a bar turns amber.
const warnPercent = 80

// gauge is one bar: a quota or a spending cap and how much of it is used
// (held units count: they are promised to calls in flight).
type gauge struct {
	Name    string  // "Quota", "Spending cap"
	Percent int     // used of the limit, rounded down; may pass 100
	Width   float64 // the bar's filled share, 0 to 100
	Level   string  // levelOK, levelWarn, levelOver
	Used    string  // "133 requests", "5.00 EUR"
	Limit   string
	// Note is what the level means for calls: "quota used up until 26
	// Dec 2026 17:46 UTC"; empty under 100%.
	Note string
}

func newGauge(name string, used, limit billing.Units, usedText, limitText string) gauge {
	g := gauge{Name: name, Used: usedText, Limit: limitText}
	switch {
	case limit <= 0 && used > 0:
		g.Percent = 100
	case limit > 0:
		g.Percent = percentOf(used, limit)
	}
	g.Width = float64(min(max(g.Percent, 0), 100))
	switch {
	case g.Percent >= 100 || limit <= 0:
		g.Level = levelOver
	case g.Percent >= warnPercent:
		g.Level = levelWarn
	default:
		g.Level = levelOK
	}
	return g
}

// percentOf is used·100/limit rounded toward zero, exactly: through
// float64, 29 of 100 read 28% (0.29·100 is 28.999…). The product is
// taken in 128 bits, as used·100 passes int64 from about 9.2e16
// micro-units. limit is above zero; a share past int's range reads as
// its largest.
func percentOf(used, limit billing.Units) int {
	neg := used < 0
	u := uint64(used)
	if neg {
		u = -u
	}
	hi, lo := bits.Mul64(u, 100)
	if hi >= uint64(limit) {
		if neg {
			return math.MinInt
		}
		return math.MaxInt
	}
	q, _ := bits.Div64(hi, lo, uint64(limit))
	q = min(q, math.MaxInt)
	if neg {
		return -int(q)
	}
	return int(q)
}

// callsRefused is why the gateway refuses a subscription's calls now, and the
// fix in plain words.
type callsRefused struct {
	ServiceID string
	// ServiceName is how the dashboard names the service (its display
	// name, else its id).
	ServiceName string
	// Ask is the part of Fix that sends a caller whose quota is used up
	// or cap reached to their provider; PlansURL, when set, is the plans
	// page where they may take a larger plan themselves instead (views.go).
	Ask, PlansURL string
	// AddCredits: the fix is to add credits, which a caller buys in packs
	// on the plans page where the plan sells them (views.go).
	AddCredits bool
	Reason     string // "quota used up until 26 Dec 2026 17:46 UTC"
	Fix        string // "wait for the next period, or ask for a larger plan"
}

// standing is a subscription's bars and, when its calls are refused
// now, why.
type standing struct {
	Gauges  []gauge
	Refused *callsRefused
	// RateLimit is the product's rate limit per key, "10/min"; empty when
	// none.
	RateLimit string
}

// standingOf reads a subscription's standing from its period summary
// under product p (nil when the product is gone).
func standingOf(ps ops.PeriodSummary, p *billing.Product) standing {
	var s standing
	if p == nil || ps.ProductMissing {
		s.Refused = &callsRefused{ServiceID: ps.ServiceID, Reason: "the product you subscribed to is no longer offered",
			Fix: "ask your provider to move you to another product"}
		return s
	}
	s.RateLimit = rateWords(p.RateLimit)
	if ps.Quota != nil {
		used := ps.UnitsUsed + ps.UnitsHeld
		g := newGauge("Quota", used, *ps.Quota, quantityText(p, used), quantityText(p, *ps.Quota))
		if g.Percent >= 100 {
			g.Note, _ = limitHolds(ps, "quota used up")
			if p.OverageAllowed() {
				g.Note += "; further calls are billed as overage"
			}
		}
		s.Gauges = append(s.Gauges, g)
	}
	if ps.SpendingCap != nil {
		spent := ps.Spend + ps.SpendHeld
		g := newGauge("Spending cap", spent, *ps.SpendingCap, priceText(p, spent), priceText(p, *ps.SpendingCap))
		if g.Percent >= 100 {
			g.Note, _ = limitHolds(ps, "spending cap reached")
		}
		s.Gauges = append(s.Gauges, g)
	}
	s.Refused = refusedNow(ps, p)
	return s
}

// refusedNow says why the next call of one unit would be refused, or nil
// when it would be let through.
func refusedNow(ps ops.PeriodSummary, p *billing.Product) *callsRefused {
	r := &callsRefused{ServiceID: ps.ServiceID}
	if !subscription.GrantsAccess(ps.Status) {
		switch subscription.Status(strings.ToUpper(ps.Status)) {
		case subscription.Suspended:
			r.Reason, r.Fix = "your subscription is suspended", "ask your provider to lift the suspension"
		case subscription.Expired:
			r.Reason, r.Fix = "your subscription has expired", "renew it with your provider"
		case subscription.Cancelled:
			r.Reason, r.Fix = "your subscription is cancelled", "subscribe again to call it"
		default:
			r.Reason, r.Fix = fmt.Sprintf("your subscription is %s", subscriptionWords(ps.Status)), "ask your provider"
		}
		return r
	}
	st := billing.State{
		Used: ps.UnitsUsed, Reserved: ps.UnitsHeld, Spend: ps.Spend, ReservedSpend: ps.SpendHeld,
		Credits: ps.Credits, CreditsHeld: ps.CreditsHeld,
	}
	d := billing.Decide(*p, st, billing.Whole(1))
	if d.Allowed {
		return nil
	}
	switch {
	case d.Code == billing.CodeInsufficientCredits && st.Credits < 0:
		r.Reason, r.Fix = "your credit balance is below zero ("+creditsText(st.Credits)+")", "add credits"
		r.AddCredits = true
	case d.Code == billing.CodeInsufficientCredits && st.CreditsFree() <= 0:
		r.Reason, r.Fix = "you have 0 credits left", "add credits"
		r.AddCredits = true
	case d.Code == billing.CodeInsufficientCredits:
		r.Reason, r.Fix = "your credits ("+creditsText(st.CreditsFree())+") do not cover a call", "add credits"
		r.AddCredits = true
	case p.Quota != nil && !p.OverageAllowed() && st.QuotaLeft(*p.Quota) < billing.Whole(1):
		r.Ask = "ask your provider for a larger plan"
		r.Reason, r.Fix = limitFix(ps, "quota used up", r.Ask)
	default:
		r.Ask = "ask your provider to raise the cap"
		r.Reason, r.Fix = limitFix(ps, "spending cap reached", r.Ask)
	}
	return r
}

// limitHolds says how long a used-up quota or a reached cap (what)
// holds: to the period's end, when the next period starts afresh, or to
// the subscription's end when that comes first or with it (a trial
// ending, a cancellation, the rule of currentPlan.EndsFirst): then last
// is true, and there is no next period to wait for.
func limitHolds(ps ops.PeriodSummary, what string) (words string, last bool) {
	if !ps.EndsAt.IsZero() && !ps.EndsAt.After(ps.PeriodEnd) {
		return what + "; your subscription ends " + untilWords(ps.EndsAt), true
	}
	return what + " until " + untilWords(ps.PeriodEnd), false
}

// limitFix is the banner's reason and fix for a limit reached: waiting
// for the next period only when the subscription has one.
func limitFix(ps ops.PeriodSummary, what, ask string) (reason, fix string) {
	reason, last := limitHolds(ps, what)
	if last {
		return reason, ask
	}
	return reason, "wait for the next period, or " + ask
}
