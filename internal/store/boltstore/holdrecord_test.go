package boltstore

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// Ledger rows and counters written by hand read back, with any JSON
// decoder, exactly as json.Marshal's.
func TestEncodeLedgerAndCounterMatchJSON(t *testing.T) {
	same := func(got, want []byte) {
		t.Helper()
		var a, b any
		if err := json.Unmarshal(got, &a); err != nil {
			t.Fatalf("not JSON: %s: %v", got, err)
		}
		json.Unmarshal(want, &b)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("by hand:\n%s\njson.Marshal:\n%s", got, want)
		}
	}
	entries := []store.LedgerEntry{
		{Seq: 1, ID: "led_1", Time: t0, UserID: "u1", ServiceID: "svc", Units: whole(1), Source: store.SourceGateway},
		{Seq: 1 << 62, ID: "led_x", Time: t0.Add(123456789), UserID: "u \"q\" \\ \x01", ServiceID: "sv<c>&",
			EndpointID: "ep", ProductID: "p", RequestID: "r-1", OccurredAt: t0.Add(-time.Hour).In(time.FixedZone("x", 3600)),
			Units: 1, Overage: 2_500_000, Cost: -7, Source: store.SourceReport, IdempotencyKey: "idem é", UnitsClaimed: whole(9)},
		{ID: "bad\xff", Time: t0, UserID: "u", ServiceID: "s", Source: "completion"},
	}
	for _, e := range entries {
		got, err := encodeLedger(e)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(toLedgerRecord(e))
		same(got, want)
		var rec ledgerRecord
		if err := json.Unmarshal(got, &rec); err != nil {
			t.Fatal(err)
		}
		if back := rec.entry(); !back.Time.Equal(e.Time) || back.Units != e.Units || back.Cost != e.Cost ||
			back.UnitsClaimed != e.UnitsClaimed || back.OccurredAt.IsZero() != e.OccurredAt.IsZero() {
			t.Errorf("round trip: %+v, want %+v", back, e)
		}
	}
	usd, none := "USD", ""
	for _, c := range []counter{{}, {Used: 5}, {Used: -3, Reserved: 1_000_001, Spend: 7, ReservedSpend: -1},
		{Used: amount(math.MaxInt64), Reserved: amount(math.MinInt64)}, {Used: 2, Spend: 3, Unit: &none},
		{Spend: 3_500_000, Unit: &usd, Other: map[string]amount{"credits": 2_000_000, "": 1, "EUR\"\u00e9": 5}}} {
		want, _ := json.Marshal(c)
		same(encodeCounter(c), want)
		var back counter
		if err := json.Unmarshal(encodeCounter(c), &back); err != nil || !reflect.DeepEqual(back, c) {
			t.Errorf("counter round trip: %+v, %v; want %+v", back, err, c)
		}
	}
}

// BenchmarkLedgerRow is the encoding of a metered call's ledger row in the
// commit loop; BenchmarkLedgerRowReflect is json.Marshal's, for scale.
func BenchmarkLedgerRow(b *testing.B) {
	e := store.LedgerEntry{Seq: 123456, ID: "led_123456", Time: t0, UserID: "user-1", ServiceID: "svc",
		EndpointID: "instant", ProductID: "bench", RequestID: "0b6f8c1e-5d0a-4c1b-9f5e-2a7d9c3e4f10",
		Units: whole(1), Source: store.SourceGateway}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encodeLedger(e); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLedgerRowReflect(b *testing.B) {
	e := store.LedgerEntry{Seq: 123456, ID: "led_123456", Time: t0, UserID: "user-1", ServiceID: "svc",
		EndpointID: "instant", ProductID: "bench", RequestID: "0b6f8c1e-5d0a-4c1b-9f5e-2a7d9c3e4f10",
		Units: whole(1), Source: store.SourceGateway}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(toLedgerRecord(e)); err != nil {
			b.Fatal(err)
		}
	}
}

// A job record written by hand is byte for byte json.Marshal's (the store
// file's format; the crash tests decode it with their own decoder), on
// the fast path and on every fallback.
func TestEncodeJobMatchesJSON(t *testing.T) {
	base := store.Job{ID: "0123456789abcdef0123456789abcdef", UserID: "u1", KeyID: "key_1", ServiceID: "svc",
		EndpointID: "ep", ProductID: "p", Status: store.JobPending, CreatedAt: t0, UpdatedAt: t0.Add(time.Second),
		ExpiresAt: t0.Add(24 * time.Hour), ReservationID: "42"}
	jobs := []store.Job{base, {}}
	for _, f := range []func(*store.Job){
		func(j *store.Job) { j.Free, j.KeyID, j.ProductID, j.ReservationID = true, "", "", "" },
		func(j *store.Job) {
			j.Status, j.Stage, j.PercentageComplete, j.CompletedAt = store.JobCompleted, "done", 100, t0.Add(123456789)
			j.Result, j.ResultSize, j.ResultTruncated, j.ResultURL, j.ContentType = `{"a":[1,2]}`, 11, true, "https://x/y?a=b", "application/json"
			j.Units, j.Cost, j.CompletionDigest = whole(3), 2_500_000, "sha256:abc"
		},
		func(j *store.Job) { j.PercentageComplete = 33.333333333333336 },
		func(j *store.Job) { j.PercentageComplete = 1e-7 },
		func(j *store.Job) { j.PercentageComplete = -2.5e21 },
		func(j *store.Job) { j.ErrorMessage = "backend <said> \"no\" & \\ \n\t\x01 é \u2028 \xff" },
		func(j *store.Job) { j.Result = "<html>" },
		func(j *store.Job) { j.CreatedAt = t0.In(time.FixedZone("x", 3600)) },
		func(j *store.Job) { j.ExpiresAt = time.Date(10001, 1, 1, 0, 0, 0, 0, time.UTC) },
		func(j *store.Job) { j.UpdatedAt = time.Time{} },
		func(j *store.Job) { j.Units, j.Cost = -1, -whole(2) },
		func(j *store.Job) { j.Terms = &store.JobTerms{EndpointCost: whole(1)} },
		func(j *store.Job) { j.Terms = &store.JobTerms{EndpointCost: 2_500_000} },
		func(j *store.Job) {
			q, c := whole(100), billing.Units(1_500_000)
			j.Terms = &store.JobTerms{EndpointCost: 0, Product: &billing.Product{ID: "p", BillingModel: billing.Subscription,
				MeasurementType: billing.PerToken, UnitLabel: "token \"t\"", Quota: &q, Period: "week", CalendarPeriods: true,
				Overage: "allow", Price: 1234, SpendingCap: &c,
				RateLimit: &billing.RateLimit{Requests: 5, WindowSeconds: 2, Burst: 7}, Currency: "EUR"}}
		},
		func(j *store.Job) {
			j.Terms = &store.JobTerms{EndpointCost: whole(5), Product: &billing.Product{ID: "pre", BillingModel: billing.Prepaid,
				MeasurementType: billing.PerRequest, Price: whole(1)}}
		},
	} {
		j := base
		f(&j)
		jobs = append(jobs, j)
	}
	for i, j := range jobs {
		want, werr := json.Marshal(toJobRecord(j))
		got, err := encodeJob(j)
		if (err != nil) != (werr != nil) {
			t.Fatalf("job %d: error %v, json.Marshal's %v", i, err, werr)
		}
		if string(got) != string(want) {
			t.Errorf("job %d by hand:\n%s\njson.Marshal:\n%s", i, got, want)
		}
	}
}

func BenchmarkEncodeJob(b *testing.B) {
	j := store.Job{ID: "0123456789abcdef0123456789abcdef", UserID: "u1", KeyID: "key_1", ServiceID: "svc",
		EndpointID: "ep", ProductID: "p", Status: store.JobPending, CreatedAt: t0, UpdatedAt: t0, ExpiresAt: t0.Add(time.Hour), ReservationID: "42"}
	b.Run("byhand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			encodeJob(j)
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			json.Marshal(toJobRecord(j))
		}
	})
}

// A job hold's record written by hand is json.Marshal's, byte for byte,
// over random users, products (every optional field in and out) and
// decisions: what json.Unmarshal read before, it reads now.
func TestMarshalHoldMatchesJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 20000 {
		rec := reservation{UserID: storetest.RandString(r), ServiceID: storetest.RandString(r), PeriodKey: r.Int64() - math.MaxInt64/2,
			JobID: storetest.RandString(r),
			Decision: decisionRecord{Decision: billing.Decision{Allowed: r.IntN(2) == 0, Code: storetest.RandString(r), Reason: storetest.RandString(r)},
				Units: amount(storetest.RandUnits(r)), Overage: amount(storetest.RandUnits(r)), Cost: amount(storetest.RandUnits(r))}}
		if p := storetest.RandProduct(r); p != nil {
			rec.Product = *p
		}
		want, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := marshalHold(rec)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("record %d:\n got %s\nwant %s", i, got, want)
		}
	}
}
