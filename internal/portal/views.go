package portal

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
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
	// Provider is the identity provider's name on the sign-in button
	// (oidc), or the one a refused sign-in came from.
	Provider string
	Job      *store.Job
	// JobCost is the job's cost in words.
	JobCost string
	// Revoke is the confirmation page before a key is revoked.
	Revoke *revokeView
	// Plans is a service's plans page (selfservice.go).
	Plans *plansView
	// Billing is the caller's invoices (payments.go).
	Billing *billingView
	// Payments: the portal takes payments (the Billing link shows).
	Payments bool
	// Export is a refused CSV export's days as typed, shown again in
	// its form (export.go).
	Export *exportForm
	*dashboard
}

// exportForm is the usage export's form as the caller filled it in.
type exportForm struct{ From, To string }

// dashboard is a caller's own figures.
type dashboard struct {
	KeyID     string
	AllowKeys bool
	// KeyExpires is when the key signed in with expires (zero: never),
	// which a key made with it never outlives; KeysFollow is whether a
	// key made with it is revoked with it (minted_keys follow_parent).
	KeyExpires time.Time
	KeysFollow bool
	// Label is the create-key form's label, kept after a refusal; Once
	// is the form's one-time value (once.go).
	Label         string
	Once          string
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
	// Banner lists the subscriptions whose calls are refused now, with
	// the fix.
	Banner []callsRefused
	// Usage is usage by endpoint and day, one table and chart per unit.
	Usage usageView
	// Outcomes is what became of the caller's calls (outcomes.go).
	Outcomes outcomesView
	// NewKeyCurl is a call with the key just created, shown with it.
	NewKeyCurl string
	cat        *catalog.Catalog
}

// CostText is a ledger row's cost with its currency (or in credits), as
// its product prices it.
func (d *dashboard) CostText(e store.LedgerEntry) string {
	return costText(productOf(d.cat, e.ServiceID, e.ProductID), e.Cost)
}

// productOf is a product of the running catalog, nil when it is gone.
func productOf(cat *catalog.Catalog, serviceID, productID string) *billing.Product {
	if cat == nil {
		return nil
	}
	svc, ok := cat.Service(serviceID)
	if !ok {
		return nil
	}
	p, _ := svc.Product(productID)
	return p
}

type dashboardExtras struct {
	Notice, Error    string
	NewKey, NewKeyID string
	// Label is the label of a key refused, put back in the form.
	Label string
}

// subscriptionView is one subscription's current period and its chart.
type subscriptionView struct {
	ops.PeriodSummary
	// Product is the subscription's product in the running catalog, nil
	// when it is gone; Pricing and StatusWords say it in words.
	Product     *billing.Product
	Pricing     string
	StatusWords string
	// ServiceName is the service's display name (its id without one);
	// PlanName the plan's display name, as the plans page and the
	// storefront show it (empty without one: the card names the product
	// by its id);
	// PlanPrice what the plan costs a period, with its currency
	// ("29.00 USD a month"), empty when it costs nothing a period.
	ServiceName, PlanName, PlanPrice string
	Standing                         standing
	// Curl are calls to the service's endpoints to copy.
	Curl  []curlLine
	Chart *chart
	// Earlier are the periods before this one, newest first, back to the
	// subscription's start (at most earlierPeriods).
	Earlier []ops.PeriodSummary
}

type keyRow struct {
	store.KeyRecord
	Status  string
	Current bool
	// LastUsed is when the key last authenticated a request on this
	// node since it started; Used is false when it did not (keys.go).
	LastUsed time.Time
	Used     bool
}

// largerPlanOffered reports whether the caller may take, on the plans
// page, a plan of svc that costs more or holds more than current's (the
// banner then sends them there rather than to their provider).
func largerPlanOffered(svc *catalog.Service, current string) bool {
	if !svc.Public {
		return false
	}
	for _, p := range svc.Products {
		if p.ID != current && svc.SelfServiceOffer(p.ID) != catalog.NotOffered && svc.Pricier(p.ID, current) {
			return true
		}
	}
	return false
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
	d.NewKey, d.NewKeyID, d.Label = x.NewKey, x.NewKeyID, x.Label
	if d.AllowKeys {
		d.Once = forms.Mint(sess.UserID)
	}
	if d.NewKey != "" {
		base, prefix := h.gatewayBase(q)
		for _, v := range d.Subscriptions {
			if svc, ok := h.rt.Catalog.Service(v.ServiceID); ok {
				if lines := curlLines(base, prefix, svc, d.NewKey); len(lines) > 0 {
					d.NewKeyCurl = lines[0].Line
					break
				}
			}
		}
	}
	h.render(q, status, "dashboard", page{
		Title: "Your usage", Base: q.base, CSRF: sess.CSRF, UserID: sess.UserID,
		Notice: x.Notice, Error: x.Error, dashboard: d,
	})
}

// load reads the caller's own subscriptions, usage, calls, jobs and keys;
// every read is filtered by the session's user id.
func (h *Handler) load(q *request, sess session, sessionKey store.KeyRecord) (*dashboard, error) {
	ctx := q.r.Context()
	st := h.rt.Store()
	d := &dashboard{KeyID: sessionKey.ID, AllowKeys: h.AllowKeyManagement, cat: h.rt.Catalog,
		KeyExpires: sessionKey.ExpiresAt, KeysFollow: h.MintedKeys != MintedIndependent}

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
	if u := usageStart(q.now); u.Before(from) {
		from = u
	}
	base, prefix := h.gatewayBase(q)
	for _, sub := range subs {
		if sub.UserID != sess.UserID {
			continue
		}
		ps, err := h.ops.Summarize(ctx, sub, q.now)
		if err != nil {
			return nil, fmt.Errorf("summarize %s: %w", sub.ServiceID, err)
		}
		v := subscriptionView{PeriodSummary: ps, StatusWords: endingWords(ps.Status, ps.EndsAt), ServiceName: sub.ServiceID}
		if svc, ok := h.rt.Catalog.Service(sub.ServiceID); ok {
			v.Product, _ = svc.Product(ps.ProductID)
			v.Curl = curlLines(base, prefix, svc, "$PLATFORM_KEY")
			v.ServiceName = svc.Name()
			if l, ok := svc.Listing(ps.ProductID); ok {
				v.PlanName = l.DisplayName
				if m, ok := l.PeriodPriceMoney(); ok && m.Amount > 0 && v.Product != nil {
					v.PlanPrice = m.String() + " a " + periodNoun(v.Product.Period)
				}
			}
		}
		v.Pricing = pricingWords(v.Product)
		v.Standing = standingOf(ps, v.Product)
		if r := v.Standing.Refused; r != nil {
			r.ServiceName = v.ServiceName
			if svc, ok := h.rt.Catalog.Service(sub.ServiceID); ok {
				switch {
				case r.Ask != "" && largerPlanOffered(svc, ps.ProductID):
					r.Fix = strings.TrimSuffix(r.Fix, r.Ask) + "take a larger plan on"
					r.PlansURL = q.base + "/plans/" + url.PathEscape(svc.ID)
				case r.AddCredits && h.prepaidWithPacks(svc, ps.ProductID):
					r.Fix = "add credits on"
					r.PlansURL = q.base + "/plans/" + url.PathEscape(svc.ID)
				}
			}
			d.Banner = append(d.Banner, *r)
		}
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
			prev, err := h.ops.Summarize(ctx, sub, at)
			if err != nil {
				return nil, fmt.Errorf("summarize %s at %s: %w", sub.ServiceID, at, err)
			}
			v.Earlier = append(v.Earlier, prev)
			at = prev.PeriodStart
		}
		d.Subscriptions = append(d.Subscriptions, v)
	}

	// The charts from the caller's hourly sums since the earliest period
	// start (or a week), store.ScanUsage: the rollups where the store
	// keeps them. An hour that a chart's day boundary cuts (a period that
	// does not start on the hour) is read from its raw rows, so each bar
	// is what the rows give. The newest rows and the rows a hard limit cut
	// short are read from the raw rows of the hours that have them.
	type serviceHour struct {
		service string
		hour    time.Time
	}
	var cutHours []serviceHour
	var capped []serviceHour
	seen := map[serviceHour]bool{}
	var first time.Time
	var rollups []store.Rollup // since outcomesFrom, for usage and outcomes
	outcomesFrom := usageStart(q.now)
	if d.RecentSince.Before(outcomesFrom) {
		outcomesFrom = d.RecentSince
	}
	scanned := 0
	err := store.ScanUsage(ctx, st, store.LedgerFilter{UserID: sess.UserID, From: from}, func(r store.Rollup) error {
		if r.UserID != sess.UserID {
			return nil
		}
		if scanned++; scanned > maxLedgerScan {
			return errScanBound
		}
		if first.IsZero() {
			first = r.Hour
		}
		if !r.Hour.Before(outcomesFrom) {
			rollups = append(rollups, r)
		}
		k := serviceHour{r.ServiceID, r.Hour}
		for i := range d.Subscriptions {
			c := d.Subscriptions[i].Chart
			if c == nil || d.Subscriptions[i].ServiceID != r.ServiceID {
				continue
			}
			if c.cuts(r.Hour) {
				if !seen[k] {
					seen[k] = true
					cutHours = append(cutHours, k)
				}
				continue
			}
			c.add(r.Hour, r.Units)
		}
		if r.Capped > 0 && !r.Hour.Add(time.Hour).Before(d.RecentSince) &&
			(len(capped) == 0 || capped[len(capped)-1] != k) {
			capped = append(capped, k)
		}
		return nil
	})
	if errors.Is(err, errScanBound) {
		d.Partial = true
	} else if err != nil {
		return nil, fmt.Errorf("scan usage: %w", err)
	}
	for _, k := range cutHours {
		err := st.ScanLedger(ctx, store.LedgerFilter{UserID: sess.UserID, ServiceID: k.service, From: k.hour, To: k.hour.Add(time.Hour)},
			func(e store.LedgerEntry) error {
				for i := range d.Subscriptions {
					if c := d.Subscriptions[i].Chart; c != nil && d.Subscriptions[i].ServiceID == e.ServiceID && !e.Time.Before(from) {
						c.add(e.Time, e.Units)
					}
				}
				return nil
			})
		if err != nil {
			return nil, fmt.Errorf("scan ledger: %w", err)
		}
	}
	for _, k := range capped {
		err := st.ScanLedger(ctx, store.LedgerFilter{UserID: sess.UserID, ServiceID: k.service, From: k.hour, To: k.hour.Add(time.Hour)},
			func(e store.LedgerEntry) error {
				if e.UnitsClaimed > e.Units && !e.Time.Before(d.RecentSince) {
					d.Cut = append(d.Cut, e)
				}
				return nil
			})
		if err != nil {
			return nil, fmt.Errorf("scan ledger: %w", err)
		}
	}
	slices.SortStableFunc(d.Cut, func(a, b store.LedgerEntry) int { return a.Time.Compare(b.Time) })
	if len(d.Cut) > recentRows {
		d.Cut = d.Cut[len(d.Cut)-recentRows:]
	}
	slices.Reverse(d.Cut)
	if !first.IsZero() {
		recent, err := newestRows(ctx, st, sess.UserID, d.RecentSince, q.now)
		if err != nil {
			return nil, fmt.Errorf("scan ledger: %w", err)
		}
		d.Recent = recent
	}
	for i := range d.Subscriptions {
		if c := d.Subscriptions[i].Chart; c != nil {
			c.layout(unitName(d.Subscriptions[i].UnitLabel, d.Subscriptions[i].MeasurementType, 0))
		}
	}
	d.Usage = buildUsage(h.rt.Catalog, rollups, q.now)
	src := outcomesFor(st, h.ops, rollups)
	counts, err := src.CallOutcomes(ctx, sess.UserID, d.RecentSince.Truncate(time.Hour), q.now.Add(time.Hour))
	if err != nil {
		return nil, fmt.Errorf("call outcomes: %w", err)
	}
	d.Outcomes = summarizeOutcomes(counts, d.RecentSince, q.now, src.RecordsRefusals())
	for i := range d.Subscriptions {
		v := &d.Subscriptions[i]
		if d.Outcomes.RateLimited[v.ServiceID] && v.Standing.RateLimit != "" && v.Standing.Refused == nil {
			d.Banner = append(d.Banner, callsRefused{ServiceID: v.ServiceID, ServiceName: v.ServiceName,
				Reason: "some of your calls were refused for going too fast", Fix: "slow down: " + v.Standing.RateLimit})
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
		d.Keys = append(d.Keys, h.keyRow(k, q.now, d.KeyID))
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

// cuts says whether a bucket boundary of c falls inside the hour starting
// at h (the hour's rows belong to two bars, or one bar and none).
func (c *chart) cuts(h time.Time) bool {
	m := h.Sub(c.start) % c.step
	if m < 0 {
		m += c.step
	}
	return m > c.step-time.Hour
}

func (c *chart) add(t time.Time, u billing.Units) {
	if t.Before(c.start) {
		return
	}
	i := int(t.Sub(c.start) / c.step)
	if i < len(c.sums) {
		c.sums[i] = billing.SatAdd(c.sums[i], u)
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
	c.Caption = fmt.Sprintf("%s used per %s this period, %s to %s: %s in all, at most %s in one %s",
		strings.ToUpper(unit[:1])+unit[1:], per, c.First, c.Last, decimal(c.Total, 0), decimal(c.Max, 0), per)
}

var funcs = template.FuncMap{
	"when": timeWords,
	"px":   func(f float64) string { return fmt.Sprintf("%.1f", f) },
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
	// Words for figures and enums (words.go).
	"price":    priceText,
	"qty":      quantityText,
	"credits":  creditsText,
	"number":   func(u billing.Units) string { return decimal(u, 0) },
	"date":     dateWords,
	"jobWords": jobWords,
	"keyWords": keyWords,
	"unitName": unitName,
	"prepaid":  func(p *billing.Product) bool { return p != nil && p.BillingModel == billing.Prepaid },
	"priced":   func(p *billing.Product) bool { return p != nil && p.Price > 0 },
	"isoDate":  func(t time.Time) string { return t.UTC().Format(time.DateOnly) },
}

// newestRows reads the caller's newest recentRows rows since since, newest
// first, in windows going back from now (an hour, then twice as long each
// time): never the whole week's rows.
func newestRows(ctx context.Context, st store.Store, userID string, since, now time.Time) ([]store.LedgerEntry, error) {
	var rows []store.LedgerEntry
	var to time.Time // open: rows stamped after now too
	end := now
	for span := time.Hour; ; span *= 2 {
		from := end.Add(-span)
		if from.Before(since) {
			from = since
		}
		var win []store.LedgerEntry
		err := st.ScanLedger(ctx, store.LedgerFilter{UserID: userID, From: from, To: to}, func(e store.LedgerEntry) error {
			if e.UserID != userID {
				return nil
			}
			if len(win) == recentRows {
				win = slices.Delete(win, 0, 1)
			}
			win = append(win, e)
			return nil
		})
		if err != nil {
			return nil, err
		}
		for i := len(win) - 1; i >= 0 && len(rows) < recentRows; i-- {
			rows = append(rows, win[i])
		}
		if len(rows) >= recentRows || !from.After(since) {
			return rows, nil
		}
		to, end = from, from
	}
}
