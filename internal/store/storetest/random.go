package storetest

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// Random values for the tests that compare the store's hand-written
// encoders with encoding/json (internal/store/jsonenc_test.go, the
// PostgreSQL store's settlement-log records).

// RandString draws strings that exercise every branch of the escaping:
// plain ASCII, quotes and backslashes, control bytes, HTML characters,
// multi-byte runes, U+2028/U+2029, and invalid UTF-8.
func RandString(r *rand.Rand) string {
	if r.IntN(4) == 0 {
		return ""
	}
	pieces := []string{"a", "Z", "0", "-", "_", ".", ":", "/", " ", `"`, `\`, "\n", "\r", "\t", "\b", "\f", "\x00", "\x01", "\x1f",
		"\x7f", "<", ">", "&", "é", "日本", "🙂", "\u2028", "\u2029", "\xff", "\xc3", "\xe2\x80", "led_", "user-1", "svc"}
	var b []byte
	for range r.IntN(12) {
		b = append(b, pieces[r.IntN(len(pieces))]...)
	}
	return string(b)
}

// RandUnits draws quantities: zero, whole, fractional, negative and the
// extremes of the type.
func RandUnits(r *rand.Rand) billing.Units {
	switch r.IntN(6) {
	case 0:
		return 0
	case 1:
		return billing.Whole(r.Int64N(1000))
	case 2:
		return billing.Units(r.Int64N(1 << 40))
	case 3:
		return -billing.Units(r.Int64N(1 << 40))
	case 4:
		return billing.Units(math.MaxInt64 - r.Int64N(3))
	default:
		return billing.Units(math.MinInt64 + r.Int64N(3))
	}
}

// RandProduct draws products, nil a quarter of the time, with every
// optional field set or left out.
func RandProduct(r *rand.Rand) *billing.Product {
	if r.IntN(4) == 0 {
		return nil
	}
	p := &billing.Product{ID: RandString(r), BillingModel: RandString(r), MeasurementType: RandString(r), UnitLabel: RandString(r),
		Period: RandString(r), CalendarPeriods: r.IntN(2) == 0, Overage: RandString(r), Price: RandUnits(r)}
	if r.IntN(2) == 0 {
		q := RandUnits(r)
		p.Quota = &q
	}
	if r.IntN(2) == 0 {
		c := RandUnits(r)
		p.SpendingCap = &c
	}
	if r.IntN(2) == 0 {
		p.RateLimit = &billing.RateLimit{Requests: int(r.Int64N(1<<40)) - 1<<39, WindowSeconds: r.IntN(3) * r.IntN(100000), Burst: r.IntN(2) * r.IntN(1000)}
	}
	return p
}

// RandTime draws times: zero, UTC, at odd offsets, whole microseconds.
func RandTime(r *rand.Rand) time.Time {
	if r.IntN(5) == 0 {
		return time.Time{}
	}
	t := time.Unix(r.Int64N(4102444800), r.Int64N(1e9))
	switch r.IntN(3) {
	case 0:
		return t.UTC()
	case 1:
		return t.In(time.FixedZone("", int(r.Int64N(50000))-25000))
	default:
		return t.UTC().Truncate(time.Microsecond)
	}
}

// RandEntry draws a ledger entry of random fields.
func RandEntry(r *rand.Rand) store.LedgerEntry {
	return store.LedgerEntry{Seq: r.Uint64() >> r.IntN(64), ID: RandString(r), Time: RandTime(r), UserID: RandString(r),
		ServiceID: RandString(r), EndpointID: RandString(r), ProductID: RandString(r), RequestID: RandString(r),
		OccurredAt: RandTime(r), Units: RandUnits(r), Overage: RandUnits(r), Cost: RandUnits(r), Source: RandString(r),
		IdempotencyKey: RandString(r), UnitsClaimed: RandUnits(r)}
}
