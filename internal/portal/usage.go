package portal

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

// Usage by endpoint and day over the last usageDays days, from the
// caller's hourly ledger sums: a table, and a chart with axes per unit
// of measure. Requests, tokens and words are never added together: each
// unit has its own chart, its own scale and its own rows.

// usageDays is how many UTC days the usage section covers, today
// included.
const usageDays = 30

// usageStart is the first day of the usage section at now.
func usageStart(now time.Time) time.Time {
	d := now.UTC().Truncate(24 * time.Hour)
	return d.AddDate(0, 0, -(usageDays - 1))
}

// usageRow is one endpoint's usage on one day, in one unit.
type usageRow struct {
	Day        time.Time
	ServiceID  string
	EndpointID string
	Calls      int64
	Units      billing.Units
	Unit       string // plural noun of the unit: "requests"
}

// usageUnit is one unit of measure's rows and chart.
type usageUnit struct {
	Unit  string // "requests"
	Total billing.Units
	Rows  []usageRow // newest day first
	Chart axisChart
}

// usageView is the usage section.
type usageView struct {
	From, To time.Time // the first and the last day
	Units    []usageUnit
}

// unitOf is the unit of measure a rollup's units are in: its product's
// unit, plural, as the catalog says it now; "units" when the product is
// gone.
func unitOf(cat *catalog.Catalog, r store.Rollup) string {
	if cat != nil {
		if svc, ok := cat.Service(r.ServiceID); ok {
			if p, ok := svc.Product(r.ProductID); ok {
				return unitNoun(p, 0)
			}
		}
	}
	return "units"
}

// buildUsage sums the rollups (a user's, since usageStart(now)) per day,
// endpoint and unit.
func buildUsage(cat *catalog.Catalog, rollups []store.Rollup, now time.Time) usageView {
	from := usageStart(now)
	v := usageView{From: from, To: from.AddDate(0, 0, usageDays-1)}
	type key struct {
		unit, svc, ep string
		day           time.Time
	}
	rows := map[key]*usageRow{}
	perUnit := map[string]*usageUnit{}
	for _, r := range rollups {
		if r.Hour.Before(from) {
			continue
		}
		unit := unitOf(cat, r)
		day := r.Hour.UTC().Truncate(24 * time.Hour)
		k := key{unit, r.ServiceID, r.EndpointID, day}
		row := rows[k]
		if row == nil {
			row = &usageRow{Day: day, ServiceID: r.ServiceID, EndpointID: r.EndpointID, Unit: unit}
			rows[k] = row
		}
		row.Calls += r.Calls
		row.Units = billing.SatAdd(row.Units, r.Units)
		u := perUnit[unit]
		if u == nil {
			u = &usageUnit{Unit: unit}
			perUnit[unit] = u
		}
	}
	for _, row := range rows {
		u := perUnit[row.Unit]
		u.Rows = append(u.Rows, *row)
		u.Total = billing.SatAdd(u.Total, row.Units)
	}
	for _, u := range perUnit {
		slices.SortFunc(u.Rows, func(a, b usageRow) int {
			if c := b.Day.Compare(a.Day); c != 0 {
				return c
			}
			if c := strings.Compare(a.ServiceID, b.ServiceID); c != 0 {
				return c
			}
			return strings.Compare(a.EndpointID, b.EndpointID)
		})
		// Summed in billing.Units, exact as the table's total is; float
		// only for the bars' geometry and the axis's round ticks.
		sums := make([]billing.Units, usageDays)
		for _, row := range u.Rows {
			i := int(row.Day.Sub(from) / (24 * time.Hour))
			if i >= 0 && i < usageDays {
				sums[i] = billing.SatAdd(sums[i], row.Units)
			}
		}
		u.Chart = newAxisChart(from, sums, u.Unit)
		v.Units = append(v.Units, *u)
	}
	slices.SortFunc(v.Units, func(a, b usageUnit) int { return strings.Compare(a.Unit, b.Unit) })
	return v
}

// axisChart is a bar chart of one unit per day with a y axis (0, the
// middle and the top of a round scale) and an x axis (the first, middle
// and last day), laid out for an inline SVG of axisWidth × axisHeight.
type axisChart struct {
	Bars    []axisBar
	YTicks  []axisTick
	XTicks  []axisTick
	Caption string
	// Geometry for the template.
	Left, Right, Top, Bottom float64
}

type axisBar struct {
	X, Y, W, H float64
	Label      string
}

type axisTick struct {
	X, Y  float64
	Label string
	// Anchor is the x tick's text-anchor: "middle" under its bar, "end"
	// for the last day's, which ends at the plot's right edge so the
	// chart does not cut it off.
	Anchor string
}

const (
	axisWidth  = 600
	axisHeight = 200
	axisLeft   = 56 // room for the y labels
	axisBottom = 24 // room for the x labels
	axisTop    = 10
	axisRight  = 8
)

// niceScale is the top of a round scale at or above top: 1, 2 or 5 times
// a power of ten.
func niceScale(top float64) float64 {
	if top <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(top)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= top {
			return m * p
		}
	}
	return 10 * p
}

// axisNumber writes a tick's value short: 1,500, 2.5k, 3M.
func axisNumber(f float64) string {
	switch {
	case f >= 1e6:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.1f", f/1e6), "0"), ".") + "M"
	case f >= 1e4:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.1f", f/1e3), "0"), ".") + "k"
	}
	// Exact to a millionth, as usage is: "%.2f" wrote a tick of 0.004 as
	// "0." (its zeros trimmed).
	return decimal(billing.Units(math.Round(f*float64(billing.Scale))), 0)
}

// newAxisChart lays out the days' sums; the caption's figures ("in all",
// "at most") are exact sums of units, as the table's total, and only the
// bars and the ticks go through float64.
func newAxisChart(from time.Time, sums []billing.Units, unit string) axisChart {
	c := axisChart{Left: axisLeft, Right: axisWidth - axisRight, Top: axisTop, Bottom: axisHeight - axisBottom}
	var top, total billing.Units
	for _, s := range sums {
		top = max(top, s)
		total = billing.SatAdd(total, s)
	}
	scale := niceScale(unitsFloat(top))
	plotH := c.Bottom - c.Top
	w := (c.Right - c.Left) / float64(len(sums))
	for i, s := range sums {
		day := from.AddDate(0, 0, i)
		h := unitsFloat(s) / scale * plotH
		c.Bars = append(c.Bars, axisBar{
			X: c.Left + float64(i)*w + 1, W: max(w-2, 1), Y: c.Bottom - h, H: h,
			Label: fmt.Sprintf("%s: %s %s", dateWords(day), dayNumber(s), unit),
		})
	}
	for _, f := range []float64{0, 0.5, 1} {
		c.YTicks = append(c.YTicks, axisTick{X: c.Left - 6, Y: c.Bottom - f*plotH, Label: axisNumber(f * scale)})
	}
	for k, i := range []int{0, len(sums) / 2, len(sums) - 1} {
		t := axisTick{X: c.Left + (float64(i)+0.5)*w, Y: axisHeight - 6, Label: from.AddDate(0, 0, i).Format("2 Jan"), Anchor: "middle"}
		if k == 2 {
			t.X, t.Anchor = c.Right, "end"
		}
		c.XTicks = append(c.XTicks, t)
	}
	c.Caption = fmt.Sprintf("%s per day, %s to %s: %s in all, at most %s in one day",
		strings.ToUpper(unit[:1])+unit[1:], dateWords(from), dateWords(from.AddDate(0, 0, len(sums)-1)), decimal(total, 0), decimal(top, 0))
	return c
}

// unitsFloat is a sum of units as a float64, for geometry only.
func unitsFloat(u billing.Units) float64 { return float64(u) / float64(billing.Scale) }

// dayNumber writes a day's sum on its bar: short from ten thousand on
// (2.5k, 3M, as the ticks), else exact.
func dayNumber(u billing.Units) string {
	if u >= billing.Whole(10000) {
		return axisNumber(unitsFloat(u))
	}
	return decimal(u, 0)
}
