package console

import (
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
)

// Levels of a limit, as the pages colour them: amber from warnAt of a
// quota or a spending cap, red at or past it.
const (
	levelOK    = "ok"
	levelAmber = "amber"
	levelRed   = "red"
	warnAt     = 0.8
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
	l.Percent = int(int64(used) * 100 / int64(capacity))
	l.Fill = min(100, max(0, l.Percent))
	switch {
	case used >= capacity:
		l.Level = levelRed
	case float64(used) >= warnAt*float64(capacity):
		l.Level = levelAmber
	}
	return l
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
	return v.String()
}

func periodEnd(t time.Time) string {
	if t.IsZero() {
		return "the period ends"
	}
	return t.UTC().Format(time.DateOnly)
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
