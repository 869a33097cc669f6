package console

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// groupings are what the usage charts split their bars by, each read from
// a rollup's own fields (or a raw row's, as a rollup of one); the form
// offers every key of this map. "outcome" splits the chart of calls,
// read from the call outcome rollups (outcomeCharts), since the ledger
// knows only charged calls; the ledger's charts it leaves whole.
var groupings = map[string]func(store.Rollup) string{
	"":         func(store.Rollup) string { return "all" },
	"endpoint": func(r store.Rollup) string { return r.ServiceID + " / " + r.EndpointID },
	"user":     func(r store.Rollup) string { return r.UserID },
	"outcome":  func(store.Rollup) string { return "all" },
}

// groupNames are the groupings in the order the form lists them.
var groupNames = []string{"", "endpoint", "user", "outcome"}

// maxSeries is how many groups a chart draws on their own; the rest are
// one "other" series.
const maxSeries = 5

// Chart geometry, in the SVG's coordinates: the plot, and the margins for
// the value axis on the left and the time labels under it.
const (
	chartW, chartH = 720, 220
	plotLeft       = 64
	plotTop        = 22
	plotBottom     = 24
	maxBars        = 240
)

// usageCharts are the explorer's charts over one set of time buckets: one
// chart per unit of measure (requests, tokens, words each on a scale of
// their own) and one per what cost is counted in (money, credits).
type usageCharts struct {
	starts  []time.Time
	step    time.Duration
	group   func(store.Rollup) string
	by      string // what the series are, for the caption ("endpoint")
	byKey   map[string]*chartAcc
	TooMany bool
}

// chartAcc gathers one chart's values: per series, per bucket.
type chartAcc struct {
	kind, measure string // kind is "units" or "cost"
	values        map[string][]billing.Units
}

func newUsageCharts(f usageFilter, now time.Time) *usageCharts {
	step := 24 * time.Hour
	if f.Bucket == "hour" {
		step = time.Hour
	}
	if f.ledger.From.IsZero() {
		return nil // an open start: no extent to draw
	}
	c := newCharts(f.ledger.From, f.end(now), step, groupings[f.Group])
	c.by = f.Group
	return c
}

// newCharts are charts of the buckets of step from from's to to.
func newCharts(from, to time.Time, step time.Duration, group func(store.Rollup) string) *usageCharts {
	c := &usageCharts{step: step, group: group, byKey: map[string]*chartAcc{}}
	for t := from.Truncate(step); t.Before(to); t = t.Add(step) {
		if len(c.starts) == maxBars {
			c.TooMany = true
			break
		}
		c.starts = append(c.starts, t)
	}
	return c
}

// add counts a rollup (or a raw row as a rollup of one) at t, its units
// under unit and its cost under kind.
func (c *usageCharts) add(t time.Time, r store.Rollup, unit, kind string) {
	if c == nil {
		return
	}
	g := c.group(r)
	c.put(t, g, "units", unit, r.Units)
	c.put(t, g, "cost", kind, r.Cost)
}

// addCalls counts calls at t under the series group of the chart of
// calls (the call outcomes').
func (c *usageCharts) addCalls(t time.Time, group string, calls int64) {
	if c == nil {
		return
	}
	c.put(t, group, "calls", "calls", billing.Units(calls)*billing.Scale)
}

// put adds v to the bucket t falls in of series g of the chart of kindOf
// and measure.
func (c *usageCharts) put(t time.Time, g, kindOf, measure string, v billing.Units) {
	if len(c.starts) == 0 || v == 0 {
		return
	}
	i, _ := slices.BinarySearchFunc(c.starts, t, func(s, t time.Time) int {
		if s.After(t) {
			return 1
		}
		return -1
	})
	if i == 0 {
		return
	}
	key := kindOf + "\x00" + measure
	a := c.byKey[key]
	if a == nil {
		a = &chartAcc{kind: kindOf, measure: measure, values: map[string][]billing.Units{}}
		c.byKey[key] = a
	}
	if a.values[g] == nil {
		a.values[g] = make([]billing.Units, len(c.starts))
	}
	a.values[g][i-1] = billing.SatAdd(a.values[g][i-1], v)
}

// chartView is one chart as the template draws it, with the table of its
// figures under it.
type chartView struct {
	ID, Title string
	Kind      string // calls, units or cost: the bars' class
	Measure   string
	By        string // what the series are
	// BucketName names a bar's time: Hour or Day.
	BucketName string
	Series     []seriesView
	Bars       []barView
	Ticks      []tickView
	Rows       []rowView
	Total      billing.Units
	Width      int
	Height     int
	PlotLeft   int
	PlotRight  int
	PlotTop    int
	AxisY      int
	LabelY     int
}

type seriesView struct {
	Name, Class string
	Total       billing.Units
}

// Num writes a figure of the chart alone: a cost's money with its
// currency's minor digits (the heading names the currency).
func (v chartView) Num(x billing.Units) string {
	if v.Kind == "cost" {
		return costNumber(x, v.Measure)
	}
	return x.String()
}

// Amount writes a figure of the chart with its measure: "12.00 EUR",
// "5 credits", "300 token".
func (v chartView) Amount(x billing.Units) string {
	if v.Kind == "cost" {
		return formatCost(x, v.Measure)
	}
	return x.String() + " " + v.Measure
}

type barView struct {
	Label     string
	X, W      int
	Segs      []segView
	Title     string
	ShowLabel bool
	LabelX    int
	// WideOnly marks every other time label where there are more than
	// three: a phone, where the chart shrinks and its words grow in its
	// own units, hides these (console.css) so the rest never overlap,
	// the first one (beside the value axis's 0) among them.
	WideOnly bool
}

type segView struct {
	Y, H  int
	Class string
}

type tickView struct {
	Y     int
	Label string
}

type rowView struct {
	Label  string
	Values []billing.Units
	Total  billing.Units
}

// kindOrder is the order of the charts' kinds: calls, then units, then
// cost.
var kindOrder = map[string]int{"calls": 0, "units": 1, "cost": 2}

// views lays the charts out: calls first, then units, each measure in
// name order, then cost.
func (c *usageCharts) views() []chartView {
	if c == nil {
		return nil
	}
	accs := make([]*chartAcc, 0, len(c.byKey))
	for _, a := range c.byKey {
		accs = append(accs, a)
	}
	slices.SortFunc(accs, func(a, b *chartAcc) int {
		if a.kind != b.kind {
			return cmp.Compare(kindOrder[a.kind], kindOrder[b.kind])
		}
		return strings.Compare(a.measure, b.measure)
	})
	out := make([]chartView, 0, len(accs))
	for i, a := range accs {
		out = append(out, c.view(a, i))
	}
	return out
}

func (c *usageCharts) view(a *chartAcc, n int) chartView {
	v := chartView{ID: "chart-" + strconv.Itoa(n), Kind: a.kind, Measure: a.measure,
		Width: chartW, Height: chartH, PlotLeft: plotLeft, PlotRight: chartW - 4, PlotTop: plotTop,
		AxisY: chartH - plotBottom, LabelY: chartH - 6}
	per := "day"
	v.BucketName, v.By = "Day", c.by
	if c.step < 24*time.Hour {
		per, v.BucketName = "hour", "Hour"
	}
	if a.kind == "calls" {
		v.By = "outcome"
	}
	switch a.kind {
	case "calls":
		v.Title = "calls per " + per
	case "units":
		v.Title = a.measure + " per " + per
	default:
		v.Title = "cost in " + a.measure + " per " + per
		if a.measure != kindCredits && !isCurrency(a.measure) {
			v.Title = "cost " + a.measure + " per " + per
		}
	}
	// The series: the largest maxSeries groups, the rest as "other".
	type tot struct {
		name string
		sum  billing.Units
	}
	var tots []tot
	for g, vals := range a.values {
		var s billing.Units
		for _, x := range vals {
			s = billing.SatAdd(s, x)
		}
		tots = append(tots, tot{g, s})
	}
	slices.SortFunc(tots, func(x, y tot) int {
		if c := cmp.Compare(y.sum, x.sum); c != 0 {
			return c
		}
		return strings.Compare(x.name, y.name)
	})
	cols := make([][]billing.Units, 0, maxSeries+1)
	for i, t := range tots {
		if i < maxSeries {
			v.Series = append(v.Series, seriesView{Name: t.name, Class: "s" + strconv.Itoa(i), Total: t.sum})
			cols = append(cols, a.values[t.name])
			continue
		}
		if i == maxSeries {
			v.Series = append(v.Series, seriesView{Name: "other", Class: "s5"})
			cols = append(cols, make([]billing.Units, len(c.starts)))
		}
		v.Series[maxSeries].Total = billing.SatAdd(v.Series[maxSeries].Total, t.sum)
		for j, x := range a.values[t.name] {
			cols[maxSeries][j] = billing.SatAdd(cols[maxSeries][j], x)
		}
	}
	// The value axis: a round maximum and four steps to it.
	var top billing.Units
	for j := range c.starts {
		var s billing.Units
		for _, col := range cols {
			s = billing.SatAdd(s, col[j])
		}
		top = max(top, s)
		v.Total = billing.SatAdd(v.Total, s)
	}
	niceTop := niceCeil(float64(top) / float64(billing.Scale))
	plotH := chartH - plotTop - plotBottom
	for k := 0; k <= 4; k++ {
		val := niceTop * float64(k) / 4
		v.Ticks = append(v.Ticks, tickView{Y: chartH - plotBottom - int(float64(plotH)*float64(k)/4), Label: fmtNum(val)})
	}
	slot := float64(chartW-plotLeft-4) / float64(len(c.starts))
	every := (len(c.starts) + 7) / 8 // at most 8 time labels
	labels := (len(c.starts) + every - 1) / every
	for j, start := range c.starts {
		label := start.Format("01-02")
		if c.step < 24*time.Hour {
			label = start.Format("01-02 15h")
		}
		b := barView{Label: label, X: plotLeft + int(float64(j)*slot) + 1, W: max(1, int(slot)-2),
			ShowLabel: j%every == 0, LabelX: plotLeft + int(float64(j)*slot+slot/2),
			WideOnly: labels > 3 && (j/every)%2 == 0}
		y := chartH - plotBottom
		row := rowView{Label: label}
		var parts []string
		for i, col := range cols {
			x := col[j]
			row.Values = append(row.Values, x)
			row.Total = billing.SatAdd(row.Total, x)
			if x == 0 {
				continue
			}
			h := int(math.Round(float64(plotH) * (float64(x) / float64(billing.Scale)) / niceTop))
			y -= h
			b.Segs = append(b.Segs, segView{Y: y, H: h, Class: v.Series[i].Class})
			parts = append(parts, v.Series[i].Name+" "+v.Num(x))
		}
		b.Title = label + ": " + v.Amount(row.Total)
		if len(cols) > 1 && len(parts) > 0 {
			b.Title += " (" + strings.Join(parts, ", ") + ")"
		}
		v.Bars = append(v.Bars, b)
		if row.Total != 0 {
			v.Rows = append(v.Rows, row)
		}
	}
	return v
}

// niceCeil rounds a maximum up to 1, 2 or 5 times a power of ten, so the
// axis reads in round steps; 1 for an empty chart.
func niceCeil(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

// fmtNum writes an axis value without trailing zeros (2.5, 100, 0.25).
func fmtNum(x float64) string {
	return strconv.FormatFloat(math.Round(x*1e6)/1e6, 'f', -1, 64)
}
