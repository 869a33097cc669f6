package store

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/billing"
)

// Hand-written JSON encoders for the records written on every call. Each
// writes the very bytes encoding/json writes for the same value
// (jsonenc_test.go compares them over random values), so what they write
// and what json.Marshal wrote before read back alike, and json.Unmarshal
// stays the one decoder.

// AppendLedgerEntryJSON appends json.Marshal(e).
func AppendLedgerEntryJSON(b []byte, e *LedgerEntry) ([]byte, error) {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"id":`...)
	b = AppendJSONString(b, e.ID)
	b = append(b, `,"time":`...)
	b, err := AppendJSONTime(b, e.Time)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"userId":`...)
	b = AppendJSONString(b, e.UserID)
	b = append(b, `,"serviceId":`...)
	b = AppendJSONString(b, e.ServiceID)
	return appendLedgerEntryDetail(b, e)
}

// AppendLedgerEntryDetailJSON appends what AppendLedgerEntryJSON writes of
// e after its seq, id, time, userId and serviceId, as an object of its
// own: json.Marshal(e) without those five, which json.Unmarshal reads
// back with the five zero. A store that keeps them in columns of their own
// keeps this beside them (the PostgreSQL ledger's entry column). Like
// AppendLedgerEntryJSON it refuses an entry whose time RFC 3339 cannot
// hold.
func AppendLedgerEntryDetailJSON(b []byte, e *LedgerEntry) ([]byte, error) {
	var tb [64]byte
	if _, err := e.Time.AppendText(tb[:0]); err != nil {
		return nil, err // what AppendJSONTime refuses, written nowhere
	}
	n := len(b)
	b, err := appendLedgerEntryDetail(b, e)
	if err != nil {
		return nil, err
	}
	b[n] = '{' // every field is written with a comma before it: the first opens the object
	return b, nil
}

// appendLedgerEntryDetail appends the fields of e after its serviceId,
// each with a comma before it, and closes the object.
func appendLedgerEntryDetail(b []byte, e *LedgerEntry) ([]byte, error) {
	var err error
	if e.EndpointID != "" {
		b = append(b, `,"endpointId":`...)
		b = AppendJSONString(b, e.EndpointID)
	}
	if e.ProductID != "" {
		b = append(b, `,"productId":`...)
		b = AppendJSONString(b, e.ProductID)
	}
	if e.RequestID != "" {
		b = append(b, `,"requestId":`...)
		b = AppendJSONString(b, e.RequestID)
	}
	if !e.OccurredAt.IsZero() {
		b = append(b, `,"occurredAt":`...)
		if b, err = AppendJSONTime(b, e.OccurredAt); err != nil {
			return nil, err
		}
	}
	b = append(b, `,"units":`...)
	b = AppendUnitsJSON(b, e.Units)
	if e.Overage != 0 {
		b = append(b, `,"overage":`...)
		b = AppendUnitsJSON(b, e.Overage)
	}
	if e.Cost != 0 {
		b = append(b, `,"cost":`...)
		b = AppendUnitsJSON(b, e.Cost)
	}
	b = append(b, `,"source":`...)
	b = AppendJSONString(b, e.Source)
	if e.IdempotencyKey != "" {
		b = append(b, `,"idempotencyKey":`...)
		b = AppendJSONString(b, e.IdempotencyKey)
	}
	if e.UnitsClaimed != 0 {
		b = append(b, `,"unitsClaimed":`...)
		b = AppendUnitsJSON(b, e.UnitsClaimed)
	}
	return append(b, '}'), nil
}

// AppendProductJSON appends json.Marshal(p): a product is written with
// every record that holds units (a job's hold, a PostgreSQL node's
// settlement record).
func AppendProductJSON(b []byte, p *billing.Product) []byte {
	b = append(b, `{"id":`...)
	b = AppendJSONString(b, p.ID)
	b = append(b, `,"billing_model":`...)
	b = AppendJSONString(b, p.BillingModel)
	b = append(b, `,"measurement_type":`...)
	b = AppendJSONString(b, p.MeasurementType)
	if p.UnitLabel != "" {
		b = append(b, `,"unit_label":`...)
		b = AppendJSONString(b, p.UnitLabel)
	}
	if p.Quota != nil {
		b = append(b, `,"quota":`...)
		b = AppendUnitsJSON(b, *p.Quota)
	}
	if p.Period != "" {
		b = append(b, `,"period":`...)
		b = AppendJSONString(b, p.Period)
	}
	if p.CalendarPeriods {
		b = append(b, `,"calendar_periods":true`...)
	}
	if p.Overage != "" {
		b = append(b, `,"overage":`...)
		b = AppendJSONString(b, p.Overage)
	}
	if p.Price != 0 {
		b = append(b, `,"price":`...)
		b = AppendUnitsJSON(b, p.Price)
	}
	if p.SpendingCap != nil {
		b = append(b, `,"spending_cap":`...)
		b = AppendUnitsJSON(b, *p.SpendingCap)
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

// AppendUnitsJSON appends u as billing.Units.MarshalJSON writes it.
func AppendUnitsJSON(b []byte, u billing.Units) []byte {
	if u >= 0 && u%billing.Scale == 0 {
		return strconv.AppendInt(b, int64(u/billing.Scale), 10) // whole units: no fraction, no allocation
	}
	return append(b, u.String()...)
}

// AppendJSONTime appends t as time.Time.MarshalJSON writes it, with its
// error for a time RFC 3339 cannot hold.
func AppendJSONTime(b []byte, t time.Time) ([]byte, error) {
	// AppendText writes what MarshalJSON quotes, and refuses what it
	// refuses, without a buffer of its own.
	b, err := t.AppendText(append(b, '"'))
	if err != nil {
		return nil, err
	}
	return append(b, '"'), nil
}

// The first and last instants RFC 3339 (and so a JSON time) can write:
// years 0000 to 9999, in UTC.
var (
	minRFC3339 = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)
	maxRFC3339 = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
)

// ClampRFC3339 is t moved into the years RFC 3339 can write, 0000 to 9999
// (UTC), t itself when it lies there. A ledger entry's OccurredAt is shown
// through it: an older version kept a report's body timestamp as given,
// and "0000-01-01T00:00:00+01:00" became year -1, which no JSON time can
// write, so every usage export holding the row failed, from then on, and
// the store could not be migrated to PostgreSQL. Such a row (only one an
// older version recorded: a body timestamp before 1970 is now refused) is
// shown at 0000-01-01T00:00:00Z, everything else in it as stored.
func ClampRFC3339(t time.Time) time.Time {
	switch {
	case t.Before(minRFC3339):
		return minRFC3339
	case t.After(maxRFC3339):
		return maxRFC3339
	}
	return t
}

const jsonHex = "0123456789abcdef"

// AppendJSONString appends s as encoding/json writes a string: quoted,
// with <, > and & escaped for HTML, invalid UTF-8 replaced by U+FFFD, and
// U+2028 and U+2029 escaped.
func AppendJSONString(b []byte, s string) []byte {
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
