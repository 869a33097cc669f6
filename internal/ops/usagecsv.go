package ops

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

// The usage exports' CSV rows, the admin API's and the console's alike.

// usageColumns are the CSV columns, named like the JSON fields.
var usageColumns = []string{
	"time", "id", "userId", "serviceId", "endpointId", "productId", "requestId",
	"source", "units", "overage", "cost", "unitsClaimed", "occurredAt", "idempotencyKey", "unitsUncharged",
	"costUnit",
}

// UsageCSVColumns are the columns of a usage CSV export.
func UsageCSVColumns() []string { return slices.Clone(usageColumns) }

// UsageCSVRow is a ledger entry as a row of a usage CSV export, text
// fields defused against formula injection; costUnit is what its cost is
// counted in (CostUnit).
func UsageCSVRow(e store.LedgerEntry, costUnit string) []string {
	return []string{
		csvTime(e.Time),
		csvText(e.ID),
		csvText(e.UserID),
		csvText(e.ServiceID),
		csvText(e.EndpointID),
		csvText(e.ProductID),
		csvText(e.RequestID),
		csvText(e.Source),
		e.Units.String(),
		e.Overage.String(),
		e.Cost.String(),
		e.UnitsClaimed.String(),
		csvTime(occurredAt(e)),
		csvText(e.IdempotencyKey),
		e.Uncharged().String(),
		costUnit,
	}
}

// CostUnit is what the cost of a ledger row of serviceID's productID is
// counted in, by the running catalog: "credits" for a PREPAID product, the
// currency of the product's listing (an ISO 4217 code) for the others, and
// empty when the catalog cannot say (the product is gone, or its listing
// names no currency). A usage export carries it beside every cost, so
// credits are never read as money or money without its currency.
func CostUnit(cat *catalog.Catalog, serviceID, productID string) string {
	if cat == nil {
		return ""
	}
	svc, ok := cat.Service(serviceID)
	if !ok {
		return ""
	}
	p, ok := svc.Product(productID)
	if !ok {
		return ""
	}
	return p.CostUnit()
}

// rollupColumns are the CSV columns of a rollup export.
var rollupColumns = []string{"hour", "userId", "serviceId", "endpointId", "productId", "calls", "units", "overage", "cost", "capped", "costUnit"}

// RollupCSVColumns are the columns of an hourly rollup CSV export.
func RollupCSVColumns() []string { return slices.Clone(rollupColumns) }

// RollupRow is an hourly rollup as exported: with what its cost is
// counted in (CostUnit), as a row of the usage export is.
type RollupRow struct {
	store.Rollup
	CostUnit string `json:"costUnit,omitempty"`
}

// RollupCSVRow is a rollup as a row of a CSV export.
func RollupCSVRow(r RollupRow) []string {
	return []string{csvTime(r.Hour), csvText(r.UserID), csvText(r.ServiceID), csvText(r.EndpointID), csvText(r.ProductID),
		strconv.FormatInt(r.Calls, 10), r.Units.String(), r.Overage.String(), r.Cost.String(), strconv.FormatInt(r.Capped, 10), r.CostUnit}
}

func csvTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// csvText defuses CSV formula injection: a spreadsheet runs a cell that
// starts with = + - @ (or a tab or carriage return that hides one) as a
// formula, and text fields such as user ids and idempotency keys come from
// outside. Such a value is prefixed with a single quote, which spreadsheets
// show as text, as OWASP recommends. Numbers are written by us and left
// alone.
func csvText(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}
