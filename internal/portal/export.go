package portal

import (
	"bytes"
	"encoding/csv"
	"errors"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The caller's own usage as CSV (GET /usage.csv?from=&to=, days in UTC,
// both included): one line per ledger row of the signed-in user, read
// with the user's filter and checked row by row, never anyone else's.

// Bounds of one export.
const (
	maxExportDays = 366
	maxExportRows = 100_000
)

var errExportBound = errors.New("export bound reached")

// exportHeader names the CSV's columns.
var exportHeader = []string{"time", "service", "endpoint", "product", "request_id", "units", "unit", "overage", "cost", "cost_unit", "source"}

// exportRange reads from and to (YYYY-MM-DD) of the form, by default the
// usage section's days; to is exclusive in the result.
func exportRange(q *request) (from, to time.Time, problem string) {
	from, to = usageStart(q.now), q.now.UTC().Truncate(24*time.Hour)
	v := q.r.URL.Query()
	if s := v.Get("from"); s != "" {
		t, err := time.Parse(time.DateOnly, s)
		if err != nil {
			return from, to, "The first day must be a date like 2026-12-01."
		}
		from = t
	}
	if s := v.Get("to"); s != "" {
		t, err := time.Parse(time.DateOnly, s)
		if err != nil {
			return from, to, "The last day must be a date like 2026-12-31."
		}
		to = t
	}
	if to.Before(from) {
		return from, to, "The last day is before the first."
	}
	if to.Sub(from) >= maxExportDays*24*time.Hour {
		return from, to, "Export at most 366 days at once."
	}
	return from, to.AddDate(0, 0, 1), ""
}

// exportUsage answers the caller's ledger rows as CSV.
func (h *Handler) exportUsage(q *request) {
	_, sess, _, ok := h.signedIn(q)
	if !ok {
		return
	}
	from, to, problem := exportRange(q)
	if problem != "" {
		// The same form again, the days typed kept, under what is wrong.
		v := q.r.URL.Query()
		h.render(q, http.StatusBadRequest, "exportrefused", page{Title: "Export refused", Base: q.base, CSRF: sess.CSRF,
			UserID: sess.UserID, Error: problem, Export: &exportForm{From: v.Get("from"), To: v.Get("to")}})
		return
	}
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	_ = w.Write(exportHeader)
	products := map[[2]string]*billing.Product{}
	productOf := func(e store.LedgerEntry) *billing.Product {
		k := [2]string{e.ServiceID, e.ProductID}
		p, seen := products[k]
		if !seen {
			if svc, ok := h.rt.Catalog.Service(e.ServiceID); ok {
				p, _ = svc.Product(e.ProductID)
			}
			products[k] = p
		}
		return p
	}
	rows := 0
	err := h.rt.Store().ScanLedger(q.r.Context(), store.LedgerFilter{UserID: sess.UserID, From: from, To: to}, func(e store.LedgerEntry) error {
		if e.UserID != sess.UserID {
			return nil
		}
		if rows++; rows > maxExportRows {
			return errExportBound
		}
		p := productOf(e)
		// A product since removed cannot tell credits from money: its
		// cost is "unknown", never called money (a PREPAID one's was
		// credits).
		costUnit := "unknown"
		switch {
		case p == nil:
		case p.BillingModel == billing.Prepaid:
			costUnit = "credits"
		case currencyOf(p) != "":
			costUnit = currencyOf(p)
		default:
			costUnit = "money"
		}
		return w.Write([]string{
			e.Time.UTC().Format(time.RFC3339Nano), cell(e.ServiceID), cell(e.EndpointID), cell(e.ProductID), cell(e.RequestID),
			e.Units.String(), unitNoun(p, 0), e.Overage.String(), e.Cost.String(), costUnit, cell(e.Source),
		})
	})
	if errors.Is(err, errExportBound) {
		h.message(q, http.StatusRequestEntityTooLarge, "Export too large",
			"More than 100,000 calls in these days; export fewer days at a time.")
		return
	}
	if err != nil {
		h.logger.Error("portal usage export", zap.String("user_id", sess.UserID), zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "Your usage could not be read; try again.")
		return
	}
	w.Flush()
	hdr := q.w.Header()
	hdr.Set("Content-Type", "text/csv; charset=utf-8")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Content-Disposition", `attachment; filename="usage-`+from.Format(time.DateOnly)+`-to-`+to.AddDate(0, 0, -1).Format(time.DateOnly)+`.csv"`)
	q.w.WriteHeader(http.StatusOK)
	if q.r.Method != http.MethodHead {
		_, _ = q.w.Write(buf.Bytes())
	}
}

// cell keeps a spreadsheet from reading a text cell as a formula.
func cell(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}
