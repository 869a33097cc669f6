package pgstore

import (
	"encoding/json"

	"github.com/platformgw/gateway/internal/billing"
)

// A period's spend is kept per cost unit (billing.Product.CostUnit):
// row.spend is the spend in row.unit, row.other the spend in each other
// unit (the allowance's spend_unit and spend_other, schema version 8). A
// spending cap, its alerts and the summaries count only the spend in
// their product's unit; one sum counted credits spent under a PREPAID
// product against a USD cap after a change of product. Changes of unit
// within a period are rare, so the other units are kept as the JSON text
// the column holds (millionths, as the bigint columns: {"EUR": 2000000})
// and parsed only then.

// spendIn is the row's settled spend in cost unit u. A row whose unit is
// not known (written before schema version 8, or never charged) counts
// all of it in u.
func (r row) spendIn(u string) billing.Units {
	if !r.unitSet || r.unit == u {
		return r.spend
	}
	return otherSpend(r.other)[u]
}

// inUnit makes u the row's unit before a charge in it: the spend in the
// row's former unit moves to other, and what other held in u becomes
// spend. A row whose unit is not known takes u, keeping its spend.
func (r *row) inUnit(u string) {
	if !r.unitSet || r.unit == u {
		r.unit, r.unitSet = u, true
		return
	}
	m := otherSpend(r.other)
	if m == nil {
		m = map[string]billing.Units{}
	}
	if r.spend != 0 {
		m[r.unit] += r.spend
	}
	r.spend = m[u]
	delete(m, u)
	r.unit = u
	r.other = otherText(m)
}

// otherText is spend in other units as spend_other holds it: JSON of
// millionths ({"EUR": 2000000}), "" (NULL) when there is none.
func otherText(m map[string]billing.Units) string {
	if len(m) == 0 {
		return ""
	}
	raw := make(map[string]int64, len(m))
	for k, v := range m {
		raw[k] = int64(v)
	}
	b, _ := json.Marshal(raw) // a map of strings to integers always encodes
	return string(b)
}

func otherSpend(raw string) map[string]billing.Units {
	if raw == "" {
		return nil
	}
	var m map[string]int64
	if json.Unmarshal([]byte(raw), &m) != nil {
		return nil
	}
	out := make(map[string]billing.Units, len(m))
	for k, v := range m {
		out[k] = billing.Units(v)
	}
	return out
}

// unitArg is the row's unit as the column stores it: NULL when unknown.
func (r row) unitArg() any {
	if !r.unitSet {
		return nil
	}
	return r.unit
}

// otherArg is the row's other units as the column stores them.
func (r row) otherArg() any {
	if r.other == "" {
		return nil
	}
	return r.other
}

// spendTotalSQL is an allowance row's spend in every unit together: what
// its ledger rows' costs sum to (store check, the migration's totals).
const spendTotalSQL = `(spend + coalesce((SELECT sum(v::bigint) FROM jsonb_each_text(spend_other) AS o(k, v)), 0))`
