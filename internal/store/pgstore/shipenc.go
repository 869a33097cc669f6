package pgstore

import (
	"strconv"

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
		b = store.AppendProductJSON(b, r.Product)
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
	if r.Held != 0 {
		b = append(b, `,"hd":`...)
		b = store.AppendUnitsJSON(b, r.Held)
	}
	if r.Currency != nil {
		b = append(b, `,"cu":`...)
		b = store.AppendJSONString(b, *r.Currency)
	}
	return append(b, '}'), nil
}
