package pgstore

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// appendRecord writes what json.Marshal writes, byte for byte (the ledger
// entry inside by store.AppendLedgerEntryJSON, compared on its own in
// internal/store/jsonenc_test.go).
func TestRecordEncodingMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		rec := shipRecord{Call: storetest.RandString(r), User: storetest.RandString(r), Service: storetest.RandString(r), Period: r.Int64N(1<<40) - 1<<39,
			Product: storetest.RandProduct(r), Free: r.IntN(2) == 0, Units: storetest.RandUnits(r), Entry: storetest.RandEntry(r), Holder: storetest.RandString(r),
			Consume: Vec{storetest.RandUnits(r), storetest.RandUnits(r), storetest.RandUnits(r)}, Covered: r.IntN(2) == 0, Sequence: r.Int64N(1<<40) * int64(r.IntN(2)),
			Held: storetest.RandUnits(r) * billing.Units(r.IntN(2))}
		if r.IntN(3) == 0 {
			rec.Period = 0
		}
		if r.IntN(2) == 0 {
			cu := storetest.RandString(r)
			rec.Currency = &cu
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
	}
}

// A record whose entry holds a time RFC 3339 cannot hold fails, as
// json.Marshal fails.
func TestRecordEncodingRefusesWhatJSONRefuses(t *testing.T) {
	rec := shipRecord{Call: "c", Entry: store.LedgerEntry{Time: time.Now(), OccurredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}
	if _, err := json.Marshal(rec); err == nil {
		t.Fatal("json.Marshal accepted the year 10000")
	}
	if _, err := appendRecord(nil, &rec); err == nil {
		t.Fatal("appendRecord accepted the year 10000")
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
