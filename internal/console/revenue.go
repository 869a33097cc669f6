package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// The Revenue page (docs/console.md, "Revenue"; docs/payments.md, "Money
// in the console"): money received per currency and month (paid
// invoices and top-ups, net of refunds and disputes, from the payments
// records), the metered usage the gateway counted and Stripe has not
// invoiced yet, apart; prepaid balances as what is owed to callers (a
// liability, in credits, never revenue), negative balances as what
// callers owe; subscriptions past due or suspended for non-payment.
// Money is summed per currency only, exactly, in minor units.

// maxRevenueRecords bounds the payment records one page reads per kind
// (a variable for the tests of a listing cut short).
var maxRevenueRecords = 100000

// monthLayout is how the page's range is written: 2026-11.
const monthLayout = "2006-01"

// revenueRange is the page's months, From's first day to To's last.
type revenueRange struct {
	FromText, ToText string
	From, To         time.Time // To is the start of the month after the last
}

// readRevenueRange reads ?from=2026-09&to=2026-11 (months, UTC, both
// included); either alone is that one month; none is this month.
func readRevenueRange(v url.Values, now time.Time) (revenueRange, error) {
	r := revenueRange{FromText: v.Get("from"), ToText: v.Get("to")}
	this := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).Format(monthLayout)
	switch {
	case r.FromText == "" && r.ToText == "":
		r.FromText, r.ToText = this, this
	case r.FromText == "":
		r.FromText = r.ToText
	case r.ToText == "":
		r.ToText = r.FromText
	}
	from, err := time.Parse(monthLayout, r.FromText)
	if err != nil {
		return r, apierror.Invalid("from", "The first month must be written as 2026-09.")
	}
	to, err := time.Parse(monthLayout, r.ToText)
	if err != nil {
		return r, apierror.Invalid("to", "The last month must be written as 2026-11.")
	}
	if to.Before(from) {
		return r, apierror.Invalid("to", "The last month must not be before the first.")
	}
	if to.Sub(from) > 5*366*24*time.Hour {
		return r, apierror.Invalid("to", "Choose at most five years.")
	}
	r.From, r.To = from, to.AddDate(0, 1, 0)
	return r, nil
}

// months are the first days of the range's months, oldest first.
func (r revenueRange) months() []time.Time {
	var out []time.Time
	for m := r.From; m.Before(r.To); m = m.AddDate(0, 1, 0) {
		out = append(out, m)
	}
	return out
}

// minor is an amount in a currency's minor units, as Stripe gives it.
type minor = int64

// revenueCell is one currency's figures of one month (or of the range).
type revenueCell struct {
	Currency string
	Invoices minor         // paid invoices, less what was refunded or lost in disputes, by PaidAt
	TopUps   minor         // top-ups paid, less what was refunded or lost in disputes, by PaidAt
	Refunds  minor         // what refunds and disputes took back of those invoices and top-ups
	Usage    billing.Units // priced usage not yet invoiced, the gateway's count
	Count    int           // invoices and top-ups
}

// Received is what was paid: invoices and top-ups net.
func (c revenueCell) Received() minor { return c.Invoices + c.TopUps }

// Money writes an amount of minor units of the cell's currency.
// Money is n of the cell's currency's minor units, as Stripe counts them.
func (c revenueCell) Money(n minor) string { return payments.MinorMoney(n, c.Currency).String() }

// UsageText writes the usage not yet invoiced with its currency.
func (c revenueCell) UsageText() string { return formatCost(c.Usage, c.Currency) }

// revenueMonth is a month's cells, one per currency.
type revenueMonth struct {
	Month string // "November 2026"
	Cells []revenueCell
}

// balanceRow is a prepaid balance: owed to the caller (positive) or by
// the caller (negative).
type balanceRow struct {
	UserID, ServiceID, ProductID string
	Credits                      billing.Units
}

// serviceLiability is the credits a service owes its callers.
type serviceLiability struct {
	ServiceID string
	Credits   billing.Units // the positive balances, summed
	Callers   int
}

// pastDueRow is a subscription whose payment failed.
type pastDueRow struct {
	payments.SubscriptionRecord
	Level string // amber while in the grace period, red once suspended
	Words string
}

// notGrantedRow is a top-up paid that the gateway ignored (a pack not in
// the config at that moment, a currency the Price does not have, a user
// without a subscription) and has not granted since: the operator was
// paid, and refunds it or grants its credits by hand.
type notGrantedRow struct {
	payments.IgnoredTopUp
	Paid string // what was paid, with its currency; "" when not recorded
	Back string // what refunds and a lost dispute gave back of it, with its currency; "" for nothing
}

// revenueData is what the Revenue page and the overview's summary show.
type revenueData struct {
	Range        revenueRange
	Quick        []quickRange
	Configured   bool // a payments block is in the config
	NoStore      bool // the store keeps no payment records
	Months       []revenueMonth
	Totals       []revenueCell
	Unpriced     []measured // usage cost of products whose currency is unknown
	Liabilities  []serviceLiability
	Owed         []balanceRow // negative balances
	PastDue      []pastDueRow
	NotGranted   []notGrantedRow // top-ups paid that the gateway did not grant, open
	Resolved     []notGrantedRow // those an operator marked resolved (notgranted.go)
	Done         string          // what a mark did (resolveNotices), from a fixed code
	Partial      bool
	InvoicedNote bool
}

// revenueFigures reads the range's money. Without a payments block the
// usage is all "not invoiced" and the rest is empty.
func (h *Handler) revenueFigures(ctx context.Context, rg revenueRange, now time.Time) (revenueData, error) {
	a, err := h.revenueStart(ctx, rg, now)
	if err != nil {
		return revenueData{}, err
	}
	n := 0
	errStop := errors.New("stop")
	err = store.ScanUsage(ctx, h.rt.Store(), store.LedgerFilter{From: rg.From, To: rg.To}, func(r store.Rollup) error {
		if n++; n > maxOverviewRow {
			a.d.Partial = true
			return errStop
		}
		a.addUsage(r)
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return revenueData{}, err
	}
	return a.finish(ctx)
}

// revenueAcc gathers a range's figures: the payment records first
// (revenueStart), then the usage's hourly sums one by one (addUsage: the
// overview feeds it from its own scan of the month, read once), then the
// totals and the balances (finish).
type revenueAcc struct {
	h     *Handler
	d     revenueData
	cells map[string]*revenueCell // month|currency
	// invoicedTo is, per user and service, the end of the last period a
	// Stripe invoice covers: usage before it is in an invoice.
	invoicedTo map[string]time.Time
	unpriced   map[string]billing.Units
	// edges are the hourly sums whose hour holds the end of the last
	// invoiced period (periods start at the subscription's start, such as
	// 23:03:39): part of the hour is invoiced, the rest not. finish
	// splits them by the raw ledger rows of that hour.
	edges map[edgeKey]map[rollupKey]bool
}

// edgeKey is a user's service and the hour its last invoiced period ends
// in, with that end.
type edgeKey struct {
	UserID, ServiceID string
	Hour, End         time.Time
}

// rollupKey names an hourly sum within its user, service and hour.
type rollupKey struct{ EndpointID, ProductID string }

func (a *revenueAcc) cell(month time.Time, cur string) *revenueCell {
	k := month.Format(monthLayout) + "|" + cur
	if a.cells[k] == nil {
		a.cells[k] = &revenueCell{Currency: cur}
	}
	return a.cells[k]
}

// monthOf is the first day of t's month, false when t is not in the range.
func (a *revenueAcc) monthOf(t time.Time) (time.Time, bool) {
	t = t.UTC()
	if t.Before(a.d.Range.From) || !t.Before(a.d.Range.To) {
		return time.Time{}, false
	}
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC), true
}

// addUsage counts an hourly sum's priced usage that no invoice covers:
// in its currency, or apart when its currency is not known. Credits spent
// are not money (the money came in as a top-up).
func (a *revenueAcc) addUsage(r store.Rollup) {
	if r.Cost == 0 {
		return
	}
	_, kind := a.h.measureOf(r.ServiceID, r.ProductID)
	if kind == kindCredits {
		return
	}
	end := a.invoicedTo[r.UserID+"\x00"+r.ServiceID]
	if !end.Before(r.Hour.Add(time.Hour)) {
		return // the whole hour is invoiced
	}
	if r.Hour.Before(end) {
		// The invoiced period ends within this hour: its rows from the
		// end on are counted by finish (splitEdges), the others not.
		k := edgeKey{r.UserID, r.ServiceID, r.Hour, end}
		if a.edges[k] == nil {
			a.edges[k] = map[rollupKey]bool{}
		}
		a.edges[k][rollupKey{r.EndpointID, r.ProductID}] = true
		return
	}
	a.countUsage(r, kind)
}

// countUsage counts priced usage no invoice covers, of cost kind kind.
func (a *revenueAcc) countUsage(r store.Rollup, kind string) {
	if !isCurrency(kind) {
		a.unpriced[kind] = billing.SatAdd(a.unpriced[kind], r.Cost)
		return
	}
	if m, ok := a.monthOf(r.Hour); ok {
		c := a.cell(m, kind)
		c.Usage = billing.SatAdd(c.Usage, r.Cost)
	}
}

// revenueStart reads the payment records of the range (none without a
// payments block).
func (h *Handler) revenueStart(ctx context.Context, rg revenueRange, now time.Time) (*revenueAcc, error) {
	a := &revenueAcc{h: h, d: revenueData{Range: rg, Configured: h.payments != nil},
		cells: map[string]*revenueCell{}, invoicedTo: map[string]time.Time{}, unpriced: map[string]billing.Units{},
		edges: map[edgeKey]map[rollupKey]bool{}}
	d, cell, monthOf, invoicedTo := &a.d, a.cell, a.monthOf, a.invoicedTo
	pay, hasPay := h.rt.Store().(store.Payments)
	if d.Configured && !hasPay {
		d.NoStore = true
	}
	if d.Configured && hasPay {
		partial, err := eachRecord(ctx, pay, payments.KindInvoice, func(b []byte) error {
			var inv payments.InvoiceRecord
			if err := json.Unmarshal(b, &inv); err != nil {
				return err
			}
			// The first invoice of a subscription (its period starts and
			// ends at the subscription's start) bills no metered usage:
			// the meter shipper stamps usage from before the start at the
			// start, in the first period (payments/meters.go).
			covers := inv.PeriodStart.IsZero() || inv.PeriodEnd.After(inv.PeriodStart)
			if inv.Status != "void" && covers && inv.PeriodEnd.After(invoicedTo[inv.UserID+"\x00"+inv.ServiceID]) {
				invoicedTo[inv.UserID+"\x00"+inv.ServiceID] = inv.PeriodEnd
			}
			if inv.Status != "paid" || inv.AmountPaid == 0 {
				return nil
			}
			if m, ok := monthOf(inv.PaidAt); ok {
				c := cell(m, strings.ToUpper(inv.Currency))
				back := min(inv.AmountPaid, inv.Refunded+inv.Disputed)
				c.Invoices += inv.AmountPaid - back
				c.Refunds += back
				c.Count++
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		d.Partial = d.Partial || partial
		granted := map[string]bool{} // the top-ups granted, by PaymentIntent
		partial, err = eachRecord(ctx, pay, payments.KindTopUp, func(b []byte) error {
			var tu payments.TopUpRecord
			if err := json.Unmarshal(b, &tu); err != nil {
				return err
			}
			granted[tu.ID] = true
			if m, ok := monthOf(tu.PaidAt); ok {
				c := cell(m, strings.ToUpper(tu.Currency))
				back := min(tu.Amount, tu.Refunded+tu.Disputed)
				c.TopUps += tu.Amount - back
				c.Refunds += back
				c.Count++
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		d.Partial = d.Partial || partial
		topUpsCut := partial
		// Top-ups paid and not granted: money received all the same,
		// counted with the top-ups and listed apart so the operator sees
		// which to refund or grant by hand. One granted since (its paid
		// event applied later) is a top-up like any other. When the
		// top-ups listing stopped at its limit, one not among those read
		// is looked up: not read is not "not granted", and listing a
		// granted one told the operator to grant its credits a second
		// time (it is then a top-up past the limit, not counted, as the
		// others are not).
		partial, err = eachRecord(ctx, pay, payments.KindTopUpIgnored, func(b []byte) error {
			var ig payments.IgnoredTopUp
			if err := json.Unmarshal(b, &ig); err != nil {
				return err
			}
			if !granted[ig.ID] && topUpsCut && !ig.Foreign {
				switch _, err := pay.GetPaymentRecord(ctx, payments.KindTopUp, ig.ID); {
				case err == nil:
					granted[ig.ID] = true
				case !errors.Is(err, store.ErrNotFound):
					return fmt.Errorf("read the top-up record of %s: %w", ig.ID, err)
				}
			}
			if granted[ig.ID] || ig.Foreign {
				return nil // a top-up now, or another gateway's money
			}
			m, ok := monthOf(cmp.Or(ig.PaidAt, ig.At))
			if !ok {
				return nil
			}
			row := notGrantedRow{IgnoredTopUp: ig}
			if ig.Amount > 0 && ig.Currency != "" {
				c := cell(m, strings.ToUpper(ig.Currency))
				back := min(ig.Amount, ig.Refunded+ig.Disputed)
				c.TopUps += ig.Amount - back
				c.Refunds += back
				c.Count++
				row.Paid = payments.MinorMoney(ig.Amount, ig.Currency).String()
				if back > 0 {
					row.Back = payments.MinorMoney(back, ig.Currency).String()
				}
			}
			// One marked resolved (refunded in Stripe, granted by hand)
			// is listed apart; its money is counted all the same.
			if ig.Resolved != nil {
				d.Resolved = append(d.Resolved, row)
			} else {
				d.NotGranted = append(d.NotGranted, row)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		d.Partial = d.Partial || partial
		for _, rows := range [][]notGrantedRow{d.NotGranted, d.Resolved} {
			slices.SortFunc(rows, func(a, b notGrantedRow) int {
				return cmp.Or(cmp.Or(a.PaidAt, a.At).Compare(cmp.Or(b.PaidAt, b.At)), strings.Compare(a.ID, b.ID))
			})
		}
		if d.PastDue, partial, err = h.pastDue(ctx, pay, now); err != nil {
			return nil, err
		}
		d.Partial = d.Partial || partial
		d.InvoicedNote = true
	}
	return a, nil
}

// finish adds up the months and the range per currency, and reads the
// prepaid balances.
func (a *revenueAcc) finish(ctx context.Context) (revenueData, error) {
	if err := a.splitEdges(ctx); err != nil {
		return revenueData{}, err
	}
	d, rg, cells, unpriced := a.d, a.d.Range, a.cells, a.unpriced
	for k, v := range unpriced {
		d.Unpriced = addTo(d.Unpriced, k, v)
	}
	totals := map[string]*revenueCell{}
	for _, m := range rg.months() {
		rm := revenueMonth{Month: m.Format("January 2006")}
		prefix := m.Format(monthLayout) + "|"
		for k, c := range cells {
			if !strings.HasPrefix(k, prefix) {
				continue
			}
			rm.Cells = append(rm.Cells, *c)
			t := totals[c.Currency]
			if t == nil {
				t = &revenueCell{Currency: c.Currency}
				totals[c.Currency] = t
			}
			t.Invoices += c.Invoices
			t.TopUps += c.TopUps
			t.Refunds += c.Refunds
			t.Usage = billing.SatAdd(t.Usage, c.Usage)
			t.Count += c.Count
		}
		slices.SortFunc(rm.Cells, func(a, b revenueCell) int { return strings.Compare(a.Currency, b.Currency) })
		d.Months = append(d.Months, rm)
	}
	for _, t := range totals {
		d.Totals = append(d.Totals, *t)
	}
	slices.SortFunc(d.Totals, func(a, b revenueCell) int { return strings.Compare(a.Currency, b.Currency) })
	var partial bool
	var err error
	if d.Liabilities, d.Owed, partial, err = a.h.balances(ctx); err != nil {
		return d, err
	}
	d.Partial = d.Partial || partial
	return d, nil
}

// splitEdges counts the part of each edge hour after the end of the
// invoiced period: the raw ledger rows of the user's service from that
// end to the end of the hour, summed (store.SumLedger, as ScanUsage reads
// the hours a range cuts), for the sums addUsage was given. The hourly
// rollup cannot tell a call at 23:01 from one at 23:59; taking the whole
// hour as invoiced dropped up to an hour of usage per subscription and
// invoice. Rows pruned since (ledger_retention) are not there to count:
// that part of such an hour reads as invoiced.
func (a *revenueAcc) splitEdges(ctx context.Context) error {
	keys := slices.SortedFunc(maps.Keys(a.edges), func(x, y edgeKey) int {
		return cmp.Or(cmp.Compare(x.UserID, y.UserID), cmp.Compare(x.ServiceID, y.ServiceID), x.Hour.Compare(y.Hour))
	})
	for _, k := range keys {
		seen := a.edges[k]
		err := store.SumLedger(ctx, a.h.rt.Store(), store.LedgerFilter{UserID: k.UserID, ServiceID: k.ServiceID, From: k.End, To: k.Hour.Add(time.Hour)},
			func(r store.Rollup) error {
				if r.Cost == 0 || r.UserID != k.UserID || r.ServiceID != k.ServiceID || !seen[rollupKey{r.EndpointID, r.ProductID}] {
					return nil
				}
				_, kind := a.h.measureOf(r.ServiceID, r.ProductID)
				if kind != kindCredits {
					a.countUsage(r, kind)
				}
				return nil
			})
		if err != nil {
			return fmt.Errorf("read the ledger of %s on %s from %s: %w", k.UserID, k.ServiceID, k.End.Format(time.RFC3339), err)
		}
	}
	clear(a.edges)
	return nil
}

// eachRecord calls fn with the body of every record of kind, up to
// maxRevenueRecords; true when it stopped there.
func eachRecord(ctx context.Context, pay store.Payments, kind string, fn func([]byte) error) (bool, error) {
	n := 0
	for r, err := range store.PaymentRecords(ctx, pay, kind, "") {
		if err != nil {
			return false, fmt.Errorf("list %s records: %w", kind, err)
		}
		if n == maxRevenueRecords {
			return true, nil
		}
		n++
		if err := fn(r.Body); err != nil {
			return false, fmt.Errorf("%s record %s: %w", kind, r.ID, err)
		}
	}
	return false, nil
}

// balances are the prepaid balances: per service, the positive ones
// summed (credits the gateway owes its callers: they are service's own
// credits, never added across services), and the negative ones listed
// (a refund or a lost dispute took back credits already spent).
func (h *Handler) balances(ctx context.Context) ([]serviceLiability, []balanceRow, bool, error) {
	subs, partial, err := h.allSubscriptions(ctx, "")
	if err != nil {
		return nil, nil, false, err
	}
	by := map[string]*serviceLiability{}
	var owed []balanceRow
	for _, s := range subs {
		switch {
		case s.Credits > 0:
			l := by[s.ServiceID]
			if l == nil {
				l = &serviceLiability{ServiceID: s.ServiceID}
				by[s.ServiceID] = l
			}
			l.Credits = billing.SatAdd(l.Credits, s.Credits)
			l.Callers++
		case s.Credits < 0:
			owed = append(owed, balanceRow{UserID: s.UserID, ServiceID: s.ServiceID, ProductID: s.ProductID, Credits: s.Credits})
		}
	}
	var out []serviceLiability
	for _, l := range by {
		out = append(out, *l)
	}
	slices.SortFunc(out, func(a, b serviceLiability) int { return strings.Compare(a.ServiceID, b.ServiceID) })
	slices.SortFunc(owed, func(a, b balanceRow) int {
		return cmp.Or(cmp.Compare(a.Credits, b.Credits), strings.Compare(a.UserID, b.UserID), strings.Compare(a.ServiceID, b.ServiceID))
	})
	return out, owed, partial, nil
}

// pastDue are the Stripe subscriptions whose payment failed: past due
// (amber while the grace period runs) or unpaid, or that the gateway
// suspended for it (red).
func (h *Handler) pastDue(ctx context.Context, pay store.Payments, now time.Time) ([]pastDueRow, bool, error) {
	grace := payments.DefaultPastDueGrace
	if h.payments != nil && h.payments.PastDueGrace > 0 {
		grace = time.Duration(h.payments.PastDueGrace)
	}
	var out []pastDueRow
	partial, err := eachRecord(ctx, pay, payments.KindSubscription, func(b []byte) error {
		var s payments.SubscriptionRecord
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		row := pastDueRow{SubscriptionRecord: s}
		switch {
		case s.Status == string(subscription.Suspended):
			row.Level, row.Words = levelRed, "suspended for non-payment: calls refused until an invoice is paid"
		case s.StripeStatus == "unpaid":
			row.Level, row.Words = levelRed, "unpaid: Stripe stopped retrying the card"
		case s.StripeStatus == "past_due":
			row.Level, row.Words = levelAmber, "past due: Stripe retries the card"
			if !s.PastDueSince.IsZero() {
				end := s.PastDueSince.Add(grace)
				row.Words += "; suspended from " + end.UTC().Format("2006-01-02 15:04 UTC") + " unless paid"
				if !now.Before(end) {
					row.Level = levelRed
					row.Words = "past due beyond the grace period (" + strings.TrimSuffix(strings.TrimSuffix(grace.String(), "0s"), "0m") + "): suspension due"
				}
			}
		default:
			return nil
		}
		out = append(out, row)
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	rank := map[string]int{levelRed: 0, levelAmber: 1}
	slices.SortStableFunc(out, func(a, b pastDueRow) int {
		return cmp.Or(cmp.Compare(rank[a.Level], rank[b.Level]), strings.Compare(a.UserID, b.UserID), strings.Compare(a.ServiceID, b.ServiceID))
	})
	return out, partial, nil
}

// revenueQuick are links to this month, last month, the last 3 and 12.
func (h *Handler) revenueQuick(rg revenueRange, now time.Time) []quickRange {
	this := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	var out []quickRange
	for _, q := range []struct {
		name     string
		from, to time.Time
	}{
		{"This month", this, this},
		{"Last month", this.AddDate(0, -1, 0), this.AddDate(0, -1, 0)},
		{"Last 3 months", this.AddDate(0, -2, 0), this},
		{"Last 12 months", this.AddDate(0, -11, 0), this},
	} {
		f, t := q.from.Format(monthLayout), q.to.Format(monthLayout)
		out = append(out, quickRange{Name: q.name, Link: h.link(url.Values{"from": {f}, "to": {t}}, "revenue"),
			Current: rg.FromText == f && rg.ToText == t})
	}
	return out
}

// revenue: the Revenue page.
func (h *Handler) revenue(q *req) error {
	now := h.rt.Now().UTC()
	rg, err := readRevenueRange(q.r.URL.Query(), now)
	if err != nil {
		return err
	}
	d, err := h.revenueFigures(q.r.Context(), rg, now)
	if err != nil {
		return err
	}
	d.Quick = h.revenueQuick(rg, now)
	d.Done = resolveNotices[q.r.URL.Query().Get("done")]
	h.render(q, http.StatusOK, "revenue", "Revenue", d)
	return nil
}
