package console

import (
	"math"
	"math/bits"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
)

// Levels of a limit, as the pages colour them: amber from 80%
// (warnNum/warnDen) of a quota or a spending cap, red at or past it.
const (
	levelOK    = "ok"
	levelAmber = "amber"
	levelRed   = "red"
)

// limit is one quota or spending cap of a subscription as a bar: how full
// it is, its level, and what that means for the next call, in words.
type limit struct {
	What        string // "quota" or "spending cap"
	Used, Max   billing.Units
	Unit        string // the product's unit label for a quota; its cost kind (kindFor) for a cap
	Percent     int    // of Max, may pass 100
	Fill        int    // the bar's width in its 0-100 viewBox
	Level       string
	Consequence string // what the gateway does now, "" while under the limit
}

func newLimit(what string, used, capacity billing.Units, unit string) limit {
	l := limit{What: what, Used: used, Max: capacity, Unit: unit, Level: levelOK}
	if capacity <= 0 {
		l.Percent, l.Fill, l.Level = 100, 100, levelRed
		return l
	}
	l.Percent = percentOf(used, capacity)
	l.Fill = min(100, max(0, l.Percent))
	switch {
	case used >= capacity:
		l.Level = levelRed
	case used > 0 && !lessThanShare(used, capacity, warnNum, warnDen):
		l.Level = levelAmber
	}
	return l
}

// The amber level starts at warnNum/warnDen (80%) of a limit, compared
// exactly.
const warnNum, warnDen = 4, 5

// percentOf is used·100/capacity rounded toward zero, exactly: the
// product is taken in 128 bits, since used·100 passes int64 from about
// 9.2e16 micro-units (92 GB of a PER_BYTE quota, 92 billion tokens).
// capacity is above zero; a share past int's range reads as its largest.
func percentOf(used, capacity billing.Units) int {
	neg := used < 0
	u := uint64(used)
	if neg {
		u = -u
	}
	hi, lo := bits.Mul64(u, 100)
	if hi >= uint64(capacity) {
		if neg {
			return math.MinInt
		}
		return math.MaxInt
	}
	q, _ := bits.Div64(hi, lo, uint64(capacity))
	if q > math.MaxInt {
		q = math.MaxInt
	}
	if neg {
		return -int(q)
	}
	return int(q)
}

// lessThanShare reports whether used < capacity·num/den, exactly (both
// sides in 128 bits); used and capacity are above zero.
func lessThanShare(used, capacity billing.Units, num, den uint64) bool {
	lh, ll := bits.Mul64(uint64(used), den)
	rh, rl := bits.Mul64(uint64(capacity), num)
	return lh < rh || lh == rh && ll < rl
}

// limits are the bars of a subscription's period: its quota and its
// spending cap, each with the words a person needs ("refused until
// 2026-12-01"), never a full green bar with "0 left". overage tells
// whether the product bills calls past its quota instead of refusing them;
// costKind what its spend is counted in (kindFor).
func limits(ps ops.PeriodSummary, overage bool, costKind string) []limit {
	var out []limit
	until := "refused until " + periodEnd(ps.PeriodEnd)
	if ps.Quota != nil {
		l := newLimit("quota", ps.UnitsUsed, *ps.Quota, ps.UnitLabel)
		if l.Level == levelRed {
			l.Consequence = until
			if overage {
				l.Consequence = "further calls billed as overage"
			}
		}
		out = append(out, l)
	}
	if ps.SpendingCap != nil {
		l := newLimit("spending cap", ps.Spend, *ps.SpendingCap, costKind)
		if l.Level == levelRed {
			l.Consequence = until
		}
		out = append(out, l)
	}
	return out
}

// Num writes an amount of the limit: a cap's money with its currency's
// minor digits (the bar names the currency once, after the cap).
func (l limit) Num(v billing.Units) string {
	if l.What == "spending cap" {
		return costNumber(v, l.Unit)
	}
	return v.Grouped()
}

// UnitText is the measure after the limit's Max: a quota's unit label,
// plural unless the quota is one ("10,000 requests"); a cap's cost kind
// as is.
func (l limit) UnitText() string {
	if l.What == "spending cap" || l.Max == billing.Whole(1) || strings.HasSuffix(l.Unit, "s") {
		return l.Unit
	}
	return l.Unit + "s"
}

// periodEnd is when a limit reached stops refusing calls: the period's
// end, to the minute.
func periodEnd(t time.Time) string {
	if t.IsZero() {
		return "the period ends"
	}
	// A period ends at the time of day its subscription started, so the
	// day alone does not say when calls are let through again: the
	// minute does, rounded up so the time named is never early.
	if r := t.UTC().Truncate(time.Minute); r.Before(t) {
		t = r.Add(time.Minute)
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

// overageAllowed reads the product's overage rule from the running
// catalog; a product no longer in it allows nothing.
func (h *Handler) overageAllowed(serviceID, productID string) bool {
	svc, ok := h.rt.Catalog.Service(serviceID)
	if !ok {
		return false
	}
	p, ok := svc.Product(productID)
	return ok && p.OverageAllowed()
}
