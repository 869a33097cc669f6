package portal

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/platform"
	"github.com/platformgw/gateway/store"
)

// page is what every template gets.
type page struct {
	Title  string
	Base   string
	CSRF   string
	UserID string
	Notice string
	Error  string
	Text   string
	Job    *store.Job
	*dashboard
}

// dashboard is a caller's own figures.
type dashboard struct {
	KeyID         string
	AllowKeys     bool
	NewKey        string
	NewKeyID      string
	Subscriptions []subscriptionView
	Recent        []store.LedgerEntry
	RecentSince   time.Time
	Cut           []store.LedgerEntry
	Jobs          []store.Job
	FailedJobs    []store.Job
	Keys          []keyRow
	Partial       bool
}

type dashboardExtras struct {
	Notice, Error    string
	NewKey, NewKeyID string
}

// subscriptionView is one subscription's current period and its chart.
type subscriptionView struct {
	platform.PeriodSummary
	Chart *chart
	// Earlier are the periods before this one, newest first, back to the
	// subscription's start (at most earlierPeriods).
	Earlier []platform.PeriodSummary
}

type keyRow struct {
	store.KeyRecord
	Status  string
	Current bool
}

// Bounds of what one dashboard reads.
const (
	recentDays      = 7
	recentRows      = 25
	maxJobsShown    = 50
	maxJobPages     = 20
	maxSubPages     = 10
	maxLedgerScan   = 1_000_000
	earlierPeriods  = 3
	subscriptionCap = 1000
)

// errScanBound stops a ledger scan after maxLedgerScan entries; the page
// then shows what was read and says it was cut.
var errScanBound = errors.New("scan bound reached")

func (h *Handler) dashboard(q *request, sess session, sessionKey store.KeyRecord, x dashboardExtras) {
	h.dashboardStatus(q, http.StatusOK, sess, sessionKey, x)
}

func (h *Handler) dashboardStatus(q *request, status int, sess session, sessionKey store.KeyRecord, x dashboardExtras) {
	d, err := h.load(q, sess, sessionKey)
	if err != nil {
		h.logger.Error("portal dashboard", zap.String("user_id", sess.UserID), zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "Your figures could not be read; try again.")
		return
	}
	d.NewKey, d.NewKeyID = x.NewKey, x.NewKeyID
	h.render(q, status, "dashboard", page{
		Title: "Your usage", Base: q.base, CSRF: sess.CSRF, UserID: sess.UserID,
		Notice: x.Notice, Error: x.Error, dashboard: d,
	})
}

// load reads the caller's own subscriptions, usage, calls, jobs and keys;
// every read is filtered by the session's user id.
func (h *Handler) load(q *request, sess session, sessionKey store.KeyRecord) (*dashboard, error) {
	ctx := q.r.Context()
	st := h.app.DataStore()
	d := &dashboard{KeyID: sessionKey.ID, AllowKeys: h.AllowKeyManagement}

	var subs []store.Subscription
	cursor := ""
	for range maxSubPages {
		pageSubs, next, err := st.ListSubscriptions(ctx, sess.UserID, cursor, subscriptionCap)
		if err != nil {
			return nil, fmt.Errorf("list subscriptions: %w", err)
		}
		subs = append(subs, pageSubs...)
		if next == "" {
			break
		}
		cursor = next
	}
	from := q.now.Add(-recentDays * 24 * time.Hour)
	d.RecentSince = from
	for _, sub := range subs {
		if sub.UserID != sess.UserID {
			continue
		}
		ps, err := h.app.Summarize(ctx, sub, q.now)
		if err != nil {
			return nil, fmt.Errorf("summarize %s: %w", sub.ServiceID, err)
		}
		v := subscriptionView{PeriodSummary: ps}
		if !ps.PeriodStart.IsZero() {
			// The whole period, the days still to come left empty.
			v.Chart = newChart(ps.PeriodStart, ps.PeriodEnd.Add(-time.Nanosecond))
			if ps.PeriodStart.Before(from) {
				from = ps.PeriodStart
			}
		}
		// The periods before, read by the same code at an earlier time.
		for at := ps.PeriodStart; !at.IsZero() && len(v.Earlier) < earlierPeriods; {
			at = at.Add(-time.Nanosecond)
			if at.Before(sub.StartedAt) {
				break
			}
			prev, err := h.app.Summarize(ctx, sub, at)
			if err != nil {
				return nil, fmt.Errorf("summarize %s at %s: %w", sub.ServiceID, at, err)
			}
			v.Earlier = append(v.Earlier, prev)
			at = prev.PeriodStart
		}
		d.Subscriptions = append(d.Subscriptions, v)
	}

	// One pass over the caller's ledger since the earliest period start (or
	// a week): the charts' buckets, and the most recent rows in a ring.
	ring := make([]store.LedgerEntry, 0, recentRows)
	next, scanned := 0, 0
	err := st.ScanLedger(ctx, store.LedgerFilter{UserID: sess.UserID, From: from}, func(e store.LedgerEntry) error {
		if e.UserID != sess.UserID {
			return nil
		}
		if scanned++; scanned > maxLedgerScan {
			return errScanBound
		}
		for i := range d.Subscriptions {
			s := &d.Subscriptions[i]
			if s.Chart != nil && s.ServiceID == e.ServiceID {
				s.Chart.add(e.Time, e.Units)
			}
		}
		if e.Time.Before(d.RecentSince) {
			return nil
		}
		if e.UnitsClaimed > e.Units {
			d.Cut = append(d.Cut, e)
			if len(d.Cut) > recentRows {
				d.Cut = d.Cut[1:]
			}
		}
		if len(ring) < recentRows {
			ring = append(ring, e)
		} else {
			ring[next] = e
			next = (next + 1) % recentRows
		}
		return nil
	})
	if errors.Is(err, errScanBound) {
		d.Partial = true
	} else if err != nil {
		return nil, fmt.Errorf("scan ledger: %w", err)
	}
	ring = append(ring[next:], ring[:next]...)
	slices.Reverse(ring)
	d.Recent = ring
	slices.Reverse(d.Cut)
	for i := range d.Subscriptions {
		if c := d.Subscriptions[i].Chart; c != nil {
			c.layout(d.Subscriptions[i].UnitLabel)
		}
	}

	cursor = ""
	for range maxJobPages {
		jobs, nextCursor, err := st.ListJobs(ctx, store.JobFilter{UserID: sess.UserID}, cursor, maxJobsShown)
		if err != nil {
			return nil, fmt.Errorf("list jobs: %w", err)
		}
		for _, j := range jobs {
			if j.UserID == sess.UserID {
				d.Jobs = append(d.Jobs, j)
			}
		}
		if nextCursor == "" {
			break
		}
		cursor = nextCursor
	}
	slices.SortFunc(d.Jobs, func(a, b store.Job) int { return b.CreatedAt.Compare(a.CreatedAt) })
	if len(d.Jobs) > maxJobsShown {
		d.Jobs = d.Jobs[:maxJobsShown]
	}
	for _, j := range d.Jobs {
		if j.Status == store.JobFailed {
			d.FailedJobs = append(d.FailedJobs, j)
		}
	}

	keys, err := st.ListKeys(ctx, sess.UserID)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	slices.SortFunc(keys, func(a, b store.KeyRecord) int {
		if c := b.Created.Compare(a.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	for _, k := range keys {
		if k.UserID != sess.UserID {
			continue
		}
		d.Keys = append(d.Keys, keyRow{KeyRecord: k, Status: platform.KeyStatus(k, q.now), Current: k.ID == d.KeyID})
	}
	return d, nil
}

// chart is a bar chart of units per day (or per group of days in a long
// period) over a billing period, laid out for an inline SVG.
type chart struct {
	start   time.Time
	step    time.Duration
	sums    []billing.Units
	Bars    []bar
	Max     billing.Units
	Total   billing.Units
	Unit    string
	Caption string
	First   string
	Last    string
}

type bar struct {
	X, Y, W, H float64
	Label      string
	Value      billing.Units
}

// Chart geometry, in SVG user units.
const (
	chartWidth  = 600
	chartHeight = 160
	maxBars     = 62
)

func newChart(start, end time.Time) *chart {
	days := int(end.Sub(start).Hours()/24) + 1
	per := 1
	if days > maxBars {
		per = (days + maxBars - 1) / maxBars
	}
	n := (days + per - 1) / per
	return &chart{start: start, step: time.Duration(per) * 24 * time.Hour, sums: make([]billing.Units, max(n, 1))}
}

func (c *chart) add(t time.Time, u billing.Units) {
	if t.Before(c.start) {
		return
	}
	i := int(t.Sub(c.start) / c.step)
	if i < len(c.sums) {
		c.sums[i] += u
	}
}

func (c *chart) layout(unit string) {
	c.Unit = unit
	for _, s := range c.sums {
		c.Max = max(c.Max, s)
		c.Total += s
	}
	w := float64(chartWidth) / float64(len(c.sums))
	for i, s := range c.sums {
		from := c.start.Add(time.Duration(i) * c.step)
		label := from.Format("2006-01-02")
		if c.step > 24*time.Hour {
			label += " to " + from.Add(c.step-24*time.Hour).Format("2006-01-02")
		}
		b := bar{X: float64(i)*w + 1, W: max(w-2, 1), Label: label, Value: s}
		if c.Max > 0 {
			b.H = float64(s) / float64(c.Max) * (chartHeight - 20)
		}
		b.Y = chartHeight - b.H
		c.Bars = append(c.Bars, b)
	}
	c.First = c.Bars[0].Label
	c.Last = c.Bars[len(c.Bars)-1].Label
	per := "day"
	if c.step > 24*time.Hour {
		per = fmt.Sprintf("%d days", int(c.step.Hours()/24))
	}
	c.Caption = fmt.Sprintf("Units used per %s this period, %s to %s: %s in all, at most %s in one %s", per, c.First, c.Last, c.Total, c.Max, per)
}

var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04 UTC")
	},
	"day": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02")
	},
	"px": func(f float64) string { return fmt.Sprintf("%.1f", f) },
	"deref": func(u *billing.Units) billing.Units {
		if u == nil {
			return 0
		}
		return *u
	},
	"percent": func(part billing.Units, whole *billing.Units) string {
		if whole == nil || *whole <= 0 {
			return ""
		}
		return fmt.Sprintf("%.0f%%", float64(part)/float64(*whole)*100)
	},
	"add": func(a, b billing.Units) billing.Units { return a + b },
	"pct": func(p float64) string { return fmt.Sprintf("%.0f%%", p) },
}
