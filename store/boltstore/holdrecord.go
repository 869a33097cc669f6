package boltstore

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

// appendJSONString appends s, valid UTF-8, as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// encodeLedger writes a ledger row as json.Marshal writes toLedgerRecord(e)
// (what every reader of the ledger decodes), without reflection: every
// metered call and report appends one inside the commit loop.
func encodeLedger(e store.LedgerEntry) ([]byte, error) {
	for _, s := range []string{e.ID, e.UserID, e.ServiceID, e.EndpointID, e.ProductID, e.RequestID, e.Source, e.IdempotencyKey} {
		if !utf8.ValidString(s) {
			return json.Marshal(toLedgerRecord(e))
		}
	}
	b := make([]byte, 0, 256+len(e.UserID)+len(e.ServiceID)+len(e.EndpointID)+len(e.ProductID)+len(e.RequestID)+
		len(e.IdempotencyKey))
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"id":`...)
	b = appendJSONString(b, e.ID)
	b = append(b, `,"time":`...)
	var err error
	if b, err = appendJSONTime(b, e.Time); err != nil {
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
		if b, err = appendJSONTime(b, e.OccurredAt); err != nil {
			return nil, err
		}
	}
	b = append(b, `,"units":`...)
	b = append(b, e.Units.String()...)
	if e.Overage != 0 {
		b = append(b, `,"overage":`...)
		b = append(b, e.Overage.String()...)
	}
	if e.Cost != 0 {
		b = append(b, `,"cost":`...)
		b = append(b, e.Cost.String()...)
	}
	b = append(b, `,"source":`...)
	b = appendJSONString(b, e.Source)
	if e.IdempotencyKey != "" {
		b = append(b, `,"idempotencyKey":`...)
		b = appendJSONString(b, e.IdempotencyKey)
	}
	if e.UnitsClaimed != 0 {
		b = append(b, `,"unitsClaimed":`...)
		b = append(b, e.UnitsClaimed.String()...)
	}
	return append(b, '}'), nil
}

// appendJSONTime appends t as time.Time's MarshalJSON does.
func appendJSONTime(b []byte, t time.Time) ([]byte, error) {
	raw, err := t.MarshalJSON()
	return append(b, raw...), err
}

// encodeCounter writes a counter as json.Marshal writes it.
func encodeCounter(c counter) []byte {
	b := make([]byte, 0, 96)
	b = append(b, `{"used":`...)
	b = append(b, billing.Units(c.Used).String()...)
	for _, f := range []struct {
		name string
		v    amount
	}{{`,"reserved":`, c.Reserved}, {`,"spend":`, c.Spend}, {`,"reservedSpend":`, c.ReservedSpend}} {
		if f.v != 0 {
			b = append(b, f.name...)
			b = append(b, billing.Units(f.v).String()...)
		}
	}
	return append(b, '}')
}
