package pgstore

import (
	"strconv"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The settlement log's records are written for every call, and
// encoding/json's reflection was the largest part of what a PostgreSQL
// node spent on a call beyond a bbolt node. appendRecord writes the very
// bytes json.Marshal writes for a shipRecord (shipenc_test.go compares
// them over random values), with the store's encoders of the ledger entry
// and its fields (internal/store/jsonenc.go), so records in a log written
// by an earlier version and by this one read back alike, and
// json.Unmarshal stays the one decoder.

// appendRecord appends json.Marshal(r).
func appendRecord(b []byte, r *shipRecord) ([]byte, error) {
	b = append(b, `{"c":`...)
	b = store.AppendJSONString(b, r.Call)
	if r.User != "" {
		b = append(b, `,"u":`...)
		b = store.AppendJSONString(b, r.User)
	}
	if r.Service != "" {
		b = append(b, `,"s":`...)
		b = store.AppendJSONString(b, r.Service)
	}
	if r.Period != 0 {
		b = append(b, `,"p":`...)
		b = strconv.AppendInt(b, r.Period, 10)
	}
	if r.Product != nil {
		b = append(b, `,"pr":`...)
		b = appendProduct(b, r.Product)
	}
	if r.Free {
		b = append(b, `,"f":true`...)
	}
	b = append(b, `,"n":`...)
	b = store.AppendUnitsJSON(b, r.Units)
	b = append(b, `,"e":`...)
	b, err := store.AppendLedgerEntryJSON(b, &r.Entry)
	if err != nil {
		return nil, err
	}
	if r.Holder != "" {
		b = append(b, `,"h":`...)
		b = store.AppendJSONString(b, r.Holder)
	}
	// omitempty leaves a struct in: Consume is always written.
	b = append(b, `,"cv":{"Units":`...)
	b = store.AppendUnitsJSON(b, r.Consume.Units)
	b = append(b, `,"Spend":`...)
	b = store.AppendUnitsJSON(b, r.Consume.Spend)
	b = append(b, `,"Credits":`...)
	b = store.AppendUnitsJSON(b, r.Consume.Credits)
	b = append(b, '}')
	if r.Covered {
		b = append(b, `,"cov":true`...)
	}
	if r.Sequence != 0 {
		b = append(b, `,"q":`...)
		b = strconv.AppendInt(b, r.Sequence, 10)
	}
	return append(b, '}'), nil
}

// appendProduct appends json.Marshal(p).
func appendProduct(b []byte, p *billing.Product) []byte {
	b = append(b, `{"id":`...)
	b = store.AppendJSONString(b, p.ID)
	b = append(b, `,"billing_model":`...)
	b = store.AppendJSONString(b, p.BillingModel)
	b = append(b, `,"measurement_type":`...)
	b = store.AppendJSONString(b, p.MeasurementType)
	if p.UnitLabel != "" {
		b = append(b, `,"unit_label":`...)
		b = store.AppendJSONString(b, p.UnitLabel)
	}
	if p.Quota != nil {
		b = append(b, `,"quota":`...)
		b = store.AppendUnitsJSON(b, *p.Quota)
	}
	if p.Period != "" {
		b = append(b, `,"period":`...)
		b = store.AppendJSONString(b, p.Period)
	}
	if p.CalendarPeriods {
		b = append(b, `,"calendar_periods":true`...)
	}
	if p.Overage != "" {
		b = append(b, `,"overage":`...)
		b = store.AppendJSONString(b, p.Overage)
	}
	if p.Price != 0 {
		b = append(b, `,"price":`...)
		b = store.AppendUnitsJSON(b, p.Price)
	}
	if p.SpendingCap != nil {
		b = append(b, `,"spending_cap":`...)
		b = store.AppendUnitsJSON(b, *p.SpendingCap)
	}
	if rl := p.RateLimit; rl != nil {
		b = append(b, `,"rate_limit":{"requests":`...)
		b = strconv.AppendInt(b, int64(rl.Requests), 10)
		if rl.WindowSeconds != 0 {
			b = append(b, `,"window_seconds":`...)
			b = strconv.AppendInt(b, int64(rl.WindowSeconds), 10)
		}
		if rl.Burst != 0 {
			b = append(b, `,"burst":`...)
			b = strconv.AppendInt(b, int64(rl.Burst), 10)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}
