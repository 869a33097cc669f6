package pgstore

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The settlement log's records and the ledger rows' entries are written
// for every call, and encoding/json's reflection was the largest part of
// what a PostgreSQL node spent on a call beyond a bbolt node. These
// encoders write the very bytes json.Marshal writes for shipRecord and
// store.LedgerEntry (shipenc_test.go compares them over random values),
// so records in a log written by an earlier version and by this one read
// back alike, and json.Unmarshal stays the one decoder.

// appendRecord appends json.Marshal(r).
func appendRecord(b []byte, r *shipRecord) ([]byte, error) {
	b = append(b, `{"c":`...)
	b = appendJSONString(b, r.Call)
	if r.User != "" {
		b = append(b, `,"u":`...)
		b = appendJSONString(b, r.User)
	}
	if r.Service != "" {
		b = append(b, `,"s":`...)
		b = appendJSONString(b, r.Service)
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
	b = appendUnits(b, r.Units)
	b = append(b, `,"e":`...)
	b, err := appendEntry(b, &r.Entry)
	if err != nil {
		return nil, err
	}
	if r.Holder != "" {
		b = append(b, `,"h":`...)
		b = appendJSONString(b, r.Holder)
	}
	// omitempty leaves a struct in: Consume is always written.
	b = append(b, `,"cv":{"Units":`...)
	b = appendUnits(b, r.Consume.Units)
	b = append(b, `,"Spend":`...)
	b = appendUnits(b, r.Consume.Spend)
	b = append(b, `,"Credits":`...)
	b = appendUnits(b, r.Consume.Credits)
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

// appendEntry appends json.Marshal(e).
func appendEntry(b []byte, e *store.LedgerEntry) ([]byte, error) {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"id":`...)
	b = appendJSONString(b, e.ID)
	b = append(b, `,"time":`...)
	b, err := appendTime(b, e.Time)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"userId":`...)
	b = appendJSONString(b, e.UserID)
	b = append(b, `,"serviceId":`...)
	b = appendJSONString(b, e.ServiceID)
	if e.EndpointID != "" {
		b = append(b, `,"endpointId":`...)
		b = appendJSONString(b, e.EndpointID)
	}
	if e.ProductID != "" {
		b = append(b, `,"productId":`...)
		b = appendJSONString(b, e.ProductID)
	}
	if e.RequestID != "" {
		b = append(b, `,"requestId":`...)
		b = appendJSONString(b, e.RequestID)
	}
	if !e.OccurredAt.IsZero() {
		b = append(b, `,"occurredAt":`...)
		if b, err = appendTime(b, e.OccurredAt); err != nil {
			return nil, err
		}
	}
	b = append(b, `,"units":`...)
	b = appendUnits(b, e.Units)
	if e.Overage != 0 {
		b = append(b, `,"overage":`...)
		b = appendUnits(b, e.Overage)
	}
	if e.Cost != 0 {
		b = append(b, `,"cost":`...)
		b = appendUnits(b, e.Cost)
	}
	b = append(b, `,"source":`...)
	b = appendJSONString(b, e.Source)
	if e.IdempotencyKey != "" {
		b = append(b, `,"idempotencyKey":`...)
		b = appendJSONString(b, e.IdempotencyKey)
	}
	if e.UnitsClaimed != 0 {
		b = append(b, `,"unitsClaimed":`...)
		b = appendUnits(b, e.UnitsClaimed)
	}
	return append(b, '}'), nil
}

// appendProduct appends json.Marshal(p).
func appendProduct(b []byte, p *billing.Product) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, p.ID)
	b = append(b, `,"billing_model":`...)
	b = appendJSONString(b, p.BillingModel)
	b = append(b, `,"measurement_type":`...)
	b = appendJSONString(b, p.MeasurementType)
	if p.UnitLabel != "" {
		b = append(b, `,"unit_label":`...)
		b = appendJSONString(b, p.UnitLabel)
	}
	if p.Quota != nil {
		b = append(b, `,"quota":`...)
		b = appendUnits(b, *p.Quota)
	}
	if p.Period != "" {
		b = append(b, `,"period":`...)
		b = appendJSONString(b, p.Period)
	}
	if p.CalendarPeriods {
		b = append(b, `,"calendar_periods":true`...)
	}
	if p.Overage != "" {
		b = append(b, `,"overage":`...)
		b = appendJSONString(b, p.Overage)
	}
	if p.Price != 0 {
		b = append(b, `,"price":`...)
		b = appendUnits(b, p.Price)
	}
	if p.SpendingCap != nil {
		b = append(b, `,"spending_cap":`...)
		b = appendUnits(b, *p.SpendingCap)
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

// appendUnits appends u as billing.Units.MarshalJSON writes it.
func appendUnits(b []byte, u billing.Units) []byte {
	if u >= 0 && u%billing.Scale == 0 {
		return strconv.AppendInt(b, int64(u/billing.Scale), 10) // whole units: no fraction, no allocation
	}
	return append(b, u.String()...)
}

// appendTime appends t as time.Time.MarshalJSON writes it, with its error
// for a time RFC 3339 cannot hold.
func appendTime(b []byte, t time.Time) ([]byte, error) {
	raw, err := t.MarshalJSON()
	if err != nil {
		return nil, err
	}
	return append(b, raw...), nil
}

const jsonHex = "0123456789abcdef"

// appendJSONString appends s as encoding/json writes a string: quoted,
// with <, > and & escaped for HTML, invalid UTF-8 replaced by U+FFFD, and
// U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', jsonHex[c>>4], jsonHex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', jsonHex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
