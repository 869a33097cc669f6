package pgstore

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// randString draws strings that exercise every branch of the escaping:
// plain ASCII, quotes and backslashes, control bytes, HTML characters,
// multi-byte runes, U+2028/U+2029, and invalid UTF-8.
func randString(r *rand.Rand) string {
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

func randUnits(r *rand.Rand) billing.Units {
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

func randTime(r *rand.Rand) time.Time {
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

func randEntry(r *rand.Rand) store.LedgerEntry {
	return store.LedgerEntry{Seq: r.Uint64() >> r.IntN(64), ID: randString(r), Time: randTime(r), UserID: randString(r),
		ServiceID: randString(r), EndpointID: randString(r), ProductID: randString(r), RequestID: randString(r),
		OccurredAt: randTime(r), Units: randUnits(r), Overage: randUnits(r), Cost: randUnits(r), Source: randString(r),
		IdempotencyKey: randString(r), UnitsClaimed: randUnits(r)}
}

func randProduct(r *rand.Rand) *billing.Product {
	if r.IntN(4) == 0 {
		return nil
	}
	p := &billing.Product{ID: randString(r), BillingModel: randString(r), MeasurementType: randString(r), UnitLabel: randString(r),
		Period: randString(r), CalendarPeriods: r.IntN(2) == 0, Overage: randString(r), Price: randUnits(r)}
	if r.IntN(2) == 0 {
		q := randUnits(r)
		p.Quota = &q
	}
	if r.IntN(2) == 0 {
		c := randUnits(r)
		p.SpendingCap = &c
	}
	if r.IntN(2) == 0 {
		p.RateLimit = &billing.RateLimit{Requests: int(r.Int64N(1<<40)) - 1<<39, WindowSeconds: r.IntN(3) * r.IntN(100000), Burst: r.IntN(2) * r.IntN(1000)}
	}
	return p
}

// The hand-written encoders write what json.Marshal writes, byte for byte.
func TestRecordEncodingMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		rec := shipRecord{Call: randString(r), User: randString(r), Service: randString(r), Period: r.Int64N(1<<40) - 1<<39,
			Product: randProduct(r), Free: r.IntN(2) == 0, Units: randUnits(r), Entry: randEntry(r), Holder: randString(r),
			Consume: Vec{randUnits(r), randUnits(r), randUnits(r)}, Covered: r.IntN(2) == 0, Sequence: r.Int64N(1<<40) * int64(r.IntN(2))}
		if r.IntN(3) == 0 {
			rec.Period = 0
		}
		want, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendRecord([]byte("prefix"), &rec)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[len("prefix"):], want) || string(got[:len("prefix")]) != "prefix" {
			t.Fatalf("record %d:\n got %s\nwant %s", i, got, want)
		}
		wantE, _ := json.Marshal(rec.Entry)
		gotE, err := appendEntry(nil, &rec.Entry)
		if err != nil || !bytes.Equal(gotE, wantE) {
			t.Fatalf("entry %d: %v\n got %s\nwant %s", i, err, gotE, wantE)
		}
	}
}

// A time RFC 3339 cannot hold fails both ways, as json.Marshal does.
func TestRecordEncodingRefusesWhatJSONRefuses(t *testing.T) {
	for _, tm := range []time.Time{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 25*3600))} {
		e := store.LedgerEntry{Time: tm}
		if _, err := json.Marshal(e); err == nil {
			t.Fatalf("json.Marshal accepted %v", tm)
		}
		if _, err := appendEntry(nil, &e); err == nil {
			t.Fatalf("appendEntry accepted %v", tm)
		}
		rec := shipRecord{Call: "c", Entry: store.LedgerEntry{Time: time.Now(), OccurredAt: tm}}
		if _, err := appendRecord(nil, &rec); err == nil {
			t.Fatalf("appendRecord accepted occurredAt %v", tm)
		}
	}
}

func BenchmarkRecordEncoding(b *testing.B) {
	q := billing.Whole(1000)
	p := billing.Product{ID: "bench", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request",
		Quota: &q, Period: "month", Overage: "block", RateLimit: &billing.RateLimit{Requests: 100, Burst: 100}}
	rec := shipRecord{Call: "0193a5c2-7d1e-7c3f-9a55-3b8f0c2d1e4f", User: "bench-user", Service: "bench", Period: 1764547200,
		Product: &p, Units: billing.Whole(1), Holder: "pg-a:17", Consume: Vec{Units: billing.Whole(1)}, Covered: true, Sequence: 123456,
		Entry: store.LedgerEntry{Time: time.Now().UTC(), UserID: "bench-user", ServiceID: "bench", EndpointID: "instant",
			ProductID: "bench", RequestID: "0193a5c2-7d1e-7c3f-9a55-3b8f0c2d1e4f", Units: billing.Whole(1), Source: "gateway"}}
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("appendRecord", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = appendRecord(buf[:0], &rec); err != nil {
				b.Fatal(err)
			}
		}
	})
}
