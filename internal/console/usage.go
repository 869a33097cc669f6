package console

import (
	"encoding/csv"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// usageFilter is the usage explorer's selection; the table, the chart and
// the export all read the ledger through it.
type usageFilter struct {
	User, Service, Endpoint, Source string
	FromText, ToText                string
	Bucket                          string // day or hour
	Group                           string // a key of groupings
	ledger                          store.LedgerFilter
}

var sources = []string{store.SourceGateway, store.SourceReport, store.SourceCompletion}

// Form layouts of the time bounds: a date, or a date and time as an
// <input type="datetime-local"> sends it, both UTC.
const minuteLayout = "2006-01-02T15:04"

func parseBound(s string, upper bool) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(minuteLayout, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return d, err
	}
	if upper {
		d = d.AddDate(0, 0, 1)
	}
	return d, nil
}

// readFilter validates the query; an empty range is the last 7 days.
func (h *Handler) readFilter(q url.Values) (usageFilter, error) {
	f := usageFilter{User: q.Get("user"), Service: q.Get("service"), Endpoint: q.Get("endpoint"),
		Source: q.Get("source"), FromText: q.Get("from"), ToText: q.Get("to"), Bucket: q.Get("bucket"), Group: q.Get("group")}
	if f.User != "" && !ops.ValidUserID(f.User) {
		return f, apierror.Invalid("user", "The user is not a user id: "+userIDWords)
	}
	if f.Service != "" && !catalog.ValidID(f.Service) {
		return f, apierror.Invalid("service", "Choose a service from the list.")
	}
	if f.Endpoint != "" && !catalog.ValidID(f.Endpoint) {
		return f, apierror.Invalid("endpoint", "The endpoint is not an endpoint id (letters, digits, - and _).")
	}
	if _, ok := groupings[f.Group]; !ok {
		return f, apierror.Invalid("group", "Choose how to group the charts from the list.")
	}
	if f.Source != "" && !slices.Contains(sources, f.Source) {
		return f, apierror.Invalid("source", "Choose a source from the list.")
	}
	if f.FromText == "" && f.ToText == "" {
		f.FromText = h.rt.Now().UTC().AddDate(0, 0, -6).Format(time.DateOnly)
	}
	var err error
	if f.ledger.From, err = parseBound(f.FromText, false); err != nil {
		return f, apierror.Invalid("from", "The start must be a date such as 2026-11-01, or a date and time such as 2026-11-01T09:30 (UTC).")
	}
	if f.ledger.To, err = parseBound(f.ToText, true); err != nil {
		return f, apierror.Invalid("to", "The end must be a date such as 2026-11-30, or a date and time such as 2026-11-30T18:00 (UTC).")
	}
	if !f.ledger.From.IsZero() && !f.ledger.To.IsZero() && !f.ledger.From.Before(f.ledger.To) {
		return f, apierror.Invalid("to", "The end must be after the start.")
	}
	if f.Bucket == "" {
		f.Bucket = "day"
		if !f.ledger.From.IsZero() && f.end(h.rt.Now()).Sub(f.ledger.From) <= 48*time.Hour {
			f.Bucket = "hour"
		}
	}
	if f.Bucket != "day" && f.Bucket != "hour" {
		return f, apierror.Invalid("bucket", "Choose per day or per hour.")
	}
	f.ledger.UserID, f.ledger.ServiceID = f.User, f.Service
	return f, nil
}

func (f usageFilter) end(now time.Time) time.Time {
	if f.ledger.To.IsZero() {
		return now.UTC()
	}
	return f.ledger.To
}

// match applies what the store's filter does not.
func (f usageFilter) match(e store.LedgerEntry) bool {
	return (f.Endpoint == "" || e.EndpointID == f.Endpoint) && (f.Source == "" || e.Source == f.Source)
}

// query is the filter as a URL query, for the export links and paging.
func (f usageFilter) query() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"user": f.User, "service": f.Service, "endpoint": f.Endpoint,
		"source": f.Source, "from": f.FromText, "to": f.ToText, "bucket": f.Bucket, "group": f.Group} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// totals are the selection's figures.
type totals struct {
	Calls int64
	// Capped counts the entries a hard limit cut short (the backend
	// stated more units than could be charged).
	Capped int64
	Sums
}

// quickRange is a link to a common range of the explorer.
type quickRange struct {
	Name, Link string
	Current    bool
}

// quickRanges are the last 24 hours (per hour), 7 and 30 days and this
// calendar month (per day), each keeping the rest of the selection.
func (h *Handler) quickRanges(f usageFilter, now time.Time) []quickRange {
	now = now.UTC()
	today := now.Truncate(24 * time.Hour)
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	var out []quickRange
	for _, r := range []struct{ name, from, bucket string }{
		{"Last 24 hours", now.Truncate(time.Hour).Add(-23 * time.Hour).Format(minuteLayout), "hour"},
		{"Last 7 days", today.AddDate(0, 0, -6).Format(time.DateOnly), "day"},
		{"Last 30 days", today.AddDate(0, 0, -29).Format(time.DateOnly), "day"},
		{"This month", month.Format(time.DateOnly), "day"},
	} {
		g := f
		g.FromText, g.ToText, g.Bucket = r.from, "", r.bucket
		out = append(out, quickRange{Name: r.name, Link: h.link(g.query(), "usage"),
			Current: f.FromText == r.from && f.ToText == "" && f.Bucket == r.bucket})
	}
	return out
}

// usage: the explorer. The table shows the newest pageRows entries of the
// selection; the chart and totals cover all of it; the export streams all
// of it.
func (h *Handler) usage(q *req) error {
	f, err := h.readFilter(q.r.URL.Query())
	if err != nil {
		return h.badFilter(q, f, err)
	}
	now := h.rt.Now()
	c := newUsageCharts(f, now)
	var rows []store.LedgerEntry
	var total totals
	count := func(at time.Time, r store.Rollup) {
		unit, kind := h.measureOf(r.ServiceID, r.ProductID)
		total.Calls += r.Calls
		total.Capped += r.Capped
		total.add(unit, r.Units, kind, r.Cost)
		c.add(at, r, unit, kind)
	}
	if f.Source == "" {
		// The totals and the charts from the hourly sums (store.ScanUsage:
		// the rollups, and raw rows only for the partial hours at the
		// edges); the table from the newest rows alone.
		var first time.Time
		err = store.ScanUsage(q.r.Context(), h.rt.Store(), f.ledger, func(r store.Rollup) error {
			if f.Endpoint != "" && r.EndpointID != f.Endpoint {
				return nil
			}
			if first.IsZero() {
				first = r.Hour
			}
			at := r.Hour
			if at.Before(f.ledger.From) {
				at = f.ledger.From // a partial first hour: its rows are in the range
			}
			count(at, r)
			return nil
		})
		if err == nil && total.Calls > 0 {
			rows, err = h.newestRows(q, f, first, now)
		}
	} else {
		// Rollups do not keep the source: every row of the selection.
		err = h.rt.Store().ScanLedger(q.r.Context(), f.ledger, func(e store.LedgerEntry) error {
			if !f.match(e) {
				return nil
			}
			r := store.Rollup{UserID: e.UserID, ServiceID: e.ServiceID, EndpointID: e.EndpointID, ProductID: e.ProductID,
				Calls: 1, Units: e.Units, Cost: e.Cost}
			if e.Uncharged() > 0 {
				r.Capped = 1
			}
			count(e.Time, r)
			if len(rows) == pageRows {
				rows = slices.Delete(rows, 0, 1)
			}
			rows = append(rows, e)
			return nil
		})
		slices.Reverse(rows)
	}
	if err == nil && f.Group == "outcome" {
		err = h.addOutcomeChart(q.r.Context(), c, f)
	}
	if err != nil {
		return err
	}
	qv := f.query()
	csvQ, jsonQ := url.Values{}, url.Values{}
	for k, v := range qv {
		csvQ[k], jsonQ[k] = v, v
	}
	csvQ.Set("format", "csv")
	jsonQ.Set("format", "json")
	shown := make([]ledgerRow, len(rows))
	for i, e := range rows {
		shown[i] = ledgerRow{LedgerEntry: e, CostKind: h.costKindOf(e.ServiceID, e.ProductID)}
	}
	h.render(q, http.StatusOK, "usage", "Usage explorer", map[string]any{
		"F": f, "Rows": shown, "Total": total, "Charts": c.views(), "TooMany": c != nil && c.TooMany,
		"Truncated": total.Calls > int64(len(rows)), "Quick": h.quickRanges(f, now), "Groups": groupNames,
		"Services": h.serviceIDs(), "Sources": sources,
		"CSV": h.link(csvQ, "usage", "export"), "JSON": h.link(jsonQ, "usage", "export"),
	})
	return nil
}

// ledgerRow is a row of the explorer's table: an entry and what its
// cost is counted in (kindFor), so a cost is never a bare number.
type ledgerRow struct {
	store.LedgerEntry
	CostKind string
}

// badFilter shows the explorer again with what was typed and what is
// wrong with it, and nothing read.
func (h *Handler) badFilter(q *req, f usageFilter, err error) error {
	var ae *apierror.Error
	if !errors.As(err, &ae) {
		return err
	}
	def, _ := h.readFilter(url.Values{})
	h.render(q, apierror.Status(ae.Code), "usage", "Usage explorer", map[string]any{
		"F": f, "Error": humanMessage(ae), "Quick": h.quickRanges(def, h.rt.Now()), "Groups": groupNames,
		"Services": h.serviceIDs(), "Sources": sources,
	})
	return nil
}

func (h *Handler) serviceIDs() []string {
	var ids []string
	for _, s := range h.rt.Catalog.Services() {
		ids = append(ids, s.ID)
	}
	return ids
}

// export streams the selection as CSV or a JSON array, entry by entry,
// flushing as it goes, so a large export starts at once and shows its
// progress in the browser's download.
func (h *Handler) export(q *req) error {
	qs := q.r.URL.Query()
	format := qs.Get("format")
	qs.Del("format")
	f, err := h.readFilter(qs)
	if err != nil {
		return err
	}
	if format != "csv" && format != "json" {
		return apierror.Invalid("format", "format must be csv or json")
	}
	w := q.w
	rc := http.NewResponseController(w)
	var cw *csv.Writer
	started := false
	start := func() error {
		started = true
		name := "usage." + format
		if format == "csv" {
			w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
		w.WriteHeader(http.StatusOK)
		if format == "csv" {
			cw = csv.NewWriter(w)
			return cw.Write(ops.UsageCSVColumns())
		}
		_, err := w.Write([]byte("["))
		return err
	}
	n := 0
	err = h.rt.Store().ScanLedger(q.r.Context(), f.ledger, func(e store.LedgerEntry) error {
		if !f.match(e) {
			return nil
		}
		if !started {
			if err := start(); err != nil {
				return err
			}
		}
		if format == "csv" {
			if err := cw.Write(ops.UsageCSVRow(e, ops.CostUnit(h.rt.Catalog, e.ServiceID, e.ProductID))); err != nil {
				return err
			}
		} else {
			b, err := ops.UsageJSON(e, ops.CostUnit(h.rt.Catalog, e.ServiceID, e.ProductID))
			if err != nil {
				return err
			}
			sep := ",\n"
			if n == 0 {
				sep = "\n"
			}
			if _, err := fmt.Fprintf(w, "%s%s", sep, b); err != nil {
				return err
			}
		}
		if n++; n%1000 == 0 {
			if cw != nil {
				cw.Flush()
			}
			_ = rc.Flush()
		}
		return nil
	})
	if err == nil && !started {
		err = start()
	}
	if err == nil {
		if cw != nil {
			cw.Flush()
			err = cw.Error()
		} else {
			_, err = w.Write([]byte("\n]\n"))
		}
	}
	if err == nil {
		return nil
	}
	if !started {
		return err
	}
	if !errors.Is(q.r.Context().Err(), err) && q.r.Context().Err() == nil {
		h.logger.Error("usage export failed midway", zap.Int("entries_sent", n), zap.Error(err))
	}
	// Cut the connection so the download is seen as broken, not short.
	panic(http.ErrAbortHandler)
}

// newestRows reads the newest pageRows rows of the selection, newest
// first, in windows going back from its end (an hour, then twice as long
// each time) down to first, the hour of its oldest rows: a page never
// reads the whole range's rows.
func (h *Handler) newestRows(q *req, f usageFilter, first, now time.Time) ([]store.LedgerEntry, error) {
	var rows []store.LedgerEntry
	to := f.ledger.To // zero: open, for rows stamped after now
	end := to
	if end.IsZero() {
		end = now.UTC()
	}
	for span := time.Hour; ; span *= 2 {
		from := end.Add(-span)
		if !from.After(first) {
			from = first
		}
		if from.Before(f.ledger.From) {
			from = f.ledger.From
		}
		var win []store.LedgerEntry
		lf := f.ledger
		lf.From, lf.To = from, to
		err := h.rt.Store().ScanLedger(q.r.Context(), lf, func(e store.LedgerEntry) error {
			if !f.match(e) {
				return nil
			}
			if len(win) == pageRows {
				win = slices.Delete(win, 0, 1)
			}
			win = append(win, e)
			return nil
		})
		if err != nil {
			return nil, err
		}
		for i := len(win) - 1; i >= 0 && len(rows) < pageRows; i-- {
			rows = append(rows, win[i])
		}
		if len(rows) >= pageRows || !from.After(first) || from.Equal(f.ledger.From) {
			return rows, nil
		}
		to, end = from, from
	}
}
