package console

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/alerts"
	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// Bounds on what one page reads, so a huge store never makes a page slow
// without end; a page that hit one says so.
const (
	maxListed      = 10000  // subscriptions or keys gathered for a listing
	maxOverviewRow = 200000 // hourly sums (store.ScanUsage) the overview adds up
	pageRows       = 200    // rows of a table page
)

// allSubscriptions pages through every subscription (of userID when set).
func (h *Handler) allSubscriptions(ctx context.Context, userID string) ([]store.Subscription, bool, error) {
	var out []store.Subscription
	cursor := ""
	for {
		page, next, err := h.rt.Store().ListSubscriptions(ctx, userID, cursor, 1000)
		if err != nil {
			return nil, false, err
		}
		out = append(out, page...)
		if next == "" {
			return out, false, nil
		}
		if len(out) >= maxListed {
			return out, true, nil
		}
		cursor = next
	}
}

// ranked is a service's or a user's usage: its calls, and its units and
// cost by what they measure (Sums), never one "units" across measures.
type ranked struct {
	Name  string
	Calls int64
	Sums
}

// overview: calls/s, error shares and added latency of the last minute,
// what needs attention, calls over time, errors by code and latency over
// a range (?range=24h, 7d or 30d, from the call outcome rollups), usage
// today and this month, top services and users of the month.
func (h *Handler) overview(q *req) error {
	now := h.rt.Now().UTC()
	r := overviewRanges[0]
	if param := q.r.URL.Query().Get("range"); param != "" {
		i := slices.IndexFunc(overviewRanges, func(r overviewRange) bool { return r.Param == param })
		if i < 0 {
			return apierror.Invalid("range", "Choose a range from the links: 24h, 7d or 30d.")
		}
		r = overviewRanges[i]
	}
	today := now.Truncate(24 * time.Hour)
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	var d struct {
		Calls                 engine.CallStats
		Attention             []concern
		AttentionPartial      bool
		Today, Month          ranked
		Services, Users       []ranked
		Partial               bool
		MonthStart, TodayDate string
		Range                 overviewRange
		Ranges                []rangeLink
		Outcomes              callFigures
		Revenue               revenueData
	}
	if h.rt.Calls != nil {
		d.Calls = h.rt.Calls.Recent()
	}
	var err error
	if d.Attention, d.AttentionPartial, err = h.attention(q.r.Context(), now); err != nil {
		return err
	}
	d.Range = r
	for _, o := range overviewRanges {
		d.Ranges = append(d.Ranges, rangeLink{Name: o.Name, Link: h.link(map[string][]string{"range": {o.Param}}), Current: o.Param == r.Param})
	}
	if d.Outcomes, err = h.callFigures(q.r.Context(), r, now); err != nil {
		return err
	}
	d.MonthStart, d.TodayDate = month.Format("January 2006"), today.Format(time.DateOnly)
	// The month's money (revenue.go) from the same scan of the month.
	this := month.Format(monthLayout)
	money, err := h.revenueStart(q.r.Context(), revenueRange{FromText: this, ToText: this, From: month, To: month.AddDate(0, 1, 0)}, now)
	if err != nil {
		return err
	}
	svcs, users := map[string]*ranked{}, map[string]*ranked{}
	n := 0
	errStop := errors.New("stop")
	// The month's hourly sums (store.ScanUsage): the rollups, where the
	// store keeps them, so a month of millions of rows is a few thousand
	// sums; the month and the day both start on the hour.
	err = store.ScanUsage(q.r.Context(), h.rt.Store(), store.LedgerFilter{From: month}, func(r store.Rollup) error {
		if n++; n > maxOverviewRow {
			d.Partial = true
			return errStop
		}
		unit, kind := h.measureOf(r.ServiceID, r.ProductID)
		add := func(x *ranked) {
			x.Calls += r.Calls
			x.add(unit, r.Units, kind, r.Cost)
		}
		get := func(m map[string]*ranked, k string) *ranked {
			if m[k] == nil {
				m[k] = &ranked{Name: k}
			}
			return m[k]
		}
		add(get(svcs, r.ServiceID))
		add(get(users, r.UserID))
		add(&d.Month)
		money.addUsage(r)
		if !r.Hour.Before(today) {
			add(&d.Today)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	d.Services, d.Users = topN(svcs, 5), topN(users, 5)
	money.d.Partial = money.d.Partial || d.Partial
	if d.Revenue, err = money.finish(q.r.Context()); err != nil {
		return err
	}
	h.renderRefresh(q, http.StatusOK, "overview", "Overview", d, h.RefreshSeconds)
	return nil
}

// rangeLink is a link to the overview over one of its ranges.
type rangeLink struct {
	Name, Link string
	Current    bool
}

// topN are the n with the most calls: calls are the one figure every
// measure shares.
func topN(m map[string]*ranked, n int) []ranked {
	out := make([]ranked, 0, len(m))
	for _, r := range m {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b ranked) int {
		if c := cmp.Compare(b.Calls, a.Calls); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out[:min(n, len(out))]
}

type serviceRow struct {
	*catalog.Service
	Subscribers []store.Subscription
}

// PlanName is the name callers see for product id on the storefront and
// the plans page, when its listing gives it one other than the id.
func (r serviceRow) PlanName(id string) string {
	if l, ok := r.Listing(id); ok && l.DisplayName != id {
		return l.DisplayName
	}
	return ""
}

// CallUnits is what one call of e costs in units: its cost, or, where
// no product of the service counts calls (PER_REQUEST), what a call holds
// while it runs, the product charging what it uses ("1 held").
func (r serviceRow) CallUnits(e *catalog.Endpoint) string {
	n := e.UnitCost().String()
	for _, p := range r.Products {
		if p.MeasurementType == billing.PerRequest {
			return n
		}
	}
	return n + " held"
}

// PriceText is what p costs, with its currency or in credits: its
// listing's period price ("29.00 USD a month"), its price per unit, both
// ("29.00 USD a month + 0.0008 USD per request"), or "—" for neither.
func (r serviceRow) PriceText(p *billing.Product) string {
	var parts []string
	if l, ok := r.Listing(p.ID); ok {
		if m, ok := l.PeriodPriceMoney(); ok && m.Amount > 0 {
			parts = append(parts, m.String()+" a "+cmp.Or(p.Period, "month"))
		}
	}
	if p.Price > 0 {
		unit := formatCost(p.Price, kindFor(r.ID, p.ID, p))
		if len(parts) > 0 && p.UnitLabel != "" {
			unit += " per " + p.UnitLabel
		}
		parts = append(parts, unit)
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, " + ")
}

// services: the catalog as configured, with who is subscribed.
func (h *Handler) services(q *req) error {
	subs, partial, err := h.allSubscriptions(q.r.Context(), "")
	if err != nil {
		return err
	}
	var rows []serviceRow
	for _, s := range h.rt.Catalog.Services() {
		row := serviceRow{Service: s}
		for _, sub := range subs {
			if sub.ServiceID == s.ID {
				row.Subscribers = append(row.Subscribers, sub)
			}
		}
		rows = append(rows, row)
	}
	h.render(q, http.StatusOK, "services", "Services and products", map[string]any{"Services": rows, "Partial": partial})
	return nil
}

// alertStatuses are the delivery states an alert listing filters on.
var alertStatuses = []string{"PENDING", "DELIVERED", "FAILED"}

// alertRow is an alert with what its value and limit measure.
type alertRow struct {
	store.Alert
	Of string // a unit label, "credits", or a cost kind (kindFor)
}

// ValueText and LimitText write the alert's figures with their measure.
func (a alertRow) ValueText() string { return measuredText(a.Value, a.Of) }
func (a alertRow) LimitText() string { return measuredText(a.Limit, a.Of) }

func measuredText(v billing.Units, of string) string {
	if of == kindCredits || isCurrency(of) || strings.HasPrefix(of, "of ") {
		return formatCost(v, of)
	}
	return v.String() + " " + of
}

// alertMeasure is what an alert's threshold counts (its Threshold reads
// "quota 80%", "credits_below 10", "spending_cap 90%"): the product's units, its
// credits, or its spend in the product's currency. The currency, credits
// or unit the alert recorded when it fired come first: they are what its figures
// were counted in, even once the product is gone or its listing changed.
func (h *Handler) alertMeasure(a store.Alert) string {
	switch {
	case a.Currency != "":
		return a.Currency
	case a.Unit == alerts.UnitCredits:
		return kindCredits
	case a.Unit != "":
		return a.Unit // a quota's unit
	}
	unit, kind := h.measureOf(a.ServiceID, a.ProductID)
	switch {
	case strings.HasPrefix(a.Threshold, alerts.MetricCreditsBelow):
		return kindCredits
	case strings.HasPrefix(a.Threshold, alerts.MetricSpendingCap):
		return kind
	}
	return unit
}

// alerts lists the usage alerts that fired (docs/alerts.md), newest first,
// through the code of the admin API's GET /platform/alerts: the same
// filters, the same validation and errors.
func (h *Handler) alerts(q *req) error {
	v := q.r.URL.Query()
	aq := ops.AlertQuery{
		UserID:    v.Get("userId"),
		ServiceID: v.Get("serviceId"),
		Status:    v.Get("status"),
		Cursor:    v.Get("cursor"),
		Limit:     pageRows,
	}
	page, err := h.ops.ListAlerts(q.r.Context(), aq)
	if err != nil {
		return err
	}
	next := url.Values{}
	for _, k := range []string{"userId", "serviceId", "status"} {
		if x := v.Get(k); x != "" {
			next.Set(k, x)
		}
	}
	if page.NextCursor != "" {
		next.Set("cursor", page.NextCursor)
	}
	rows := make([]alertRow, len(page.Alerts))
	for i, a := range page.Alerts {
		rows[i] = alertRow{Alert: a, Of: h.alertMeasure(a)}
	}
	h.render(q, http.StatusOK, "alerts", "Alerts", map[string]any{
		"Alerts": rows, "Next": page.NextCursor, "NextQuery": next,
		"Filter": aq, "Statuses": alertStatuses,
	})
	return nil
}
