package store_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// AppendLedgerEntryJSON writes what json.Marshal writes, byte for byte,
// after whatever the buffer already holds, and AppendLedgerEntryDetailJSON
// the same without seq, id, time, userId and serviceId; so does
// AppendJSONString for every string (escapes, HTML characters,
// U+2028/2029, invalid UTF-8).
func TestLedgerEntryJSONMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 20000 {
		e := storetest.RandEntry(r)
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := store.AppendLedgerEntryJSON([]byte("prefix"), &e)
		if err != nil {
			t.Fatal(err)
		}
		if string(got[:len("prefix")]) != "prefix" || !bytes.Equal(got[len("prefix"):], want) {
			t.Fatalf("entry %d:\n got %s\nwant %s", i, got, want)
		}
		// The detail is the rest after serviceId, as an object of its own,
		// and reads back as e with those five zero.
		head, err := json.Marshal(struct {
			Seq       uint64    `json:"seq"`
			ID        string    `json:"id"`
			Time      time.Time `json:"time"`
			UserID    string    `json:"userId"`
			ServiceID string    `json:"serviceId"`
		}{e.Seq, e.ID, e.Time, e.UserID, e.ServiceID})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(want, head[:len(head)-1]) || want[len(head)-1] != ',' {
			t.Fatalf("entry %d: %s does not begin with %s", i, want, head)
		}
		wantDetail := append([]byte("prefix{"), want[len(head):]...)
		detail, err := store.AppendLedgerEntryDetailJSON([]byte("prefix"), &e)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(detail, wantDetail) {
			t.Fatalf("entry %d detail:\n got %s\nwant %s", i, detail, wantDetail)
		}
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(detail[len("prefix"):], &keys); err != nil {
			t.Fatalf("entry %d detail %s: %v", i, detail, err)
		}
		for _, k := range []string{"seq", "id", "time", "userId", "serviceId"} {
			if _, ok := keys[k]; ok {
				t.Fatalf("entry %d detail %s holds %s", i, detail, k)
			}
		}
		s := storetest.RandString(r)
		wantS, _ := json.Marshal(s)
		if gotS := store.AppendJSONString(nil, s); !bytes.Equal(gotS, wantS) {
			t.Fatalf("string %q: got %s, want %s", s, gotS, wantS)
		}
	}
}

// A time RFC 3339 cannot hold fails, as json.Marshal fails.
func TestLedgerEntryJSONRefusesWhatJSONRefuses(t *testing.T) {
	for _, tm := range []time.Time{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 25*3600))} {
		for _, e := range []store.LedgerEntry{{Time: tm}, {Time: time.Now(), OccurredAt: tm}} {
			if _, err := json.Marshal(e); err == nil {
				t.Fatalf("json.Marshal accepted %v", tm)
			}
			if _, err := store.AppendLedgerEntryJSON(nil, &e); err == nil {
				t.Fatalf("AppendLedgerEntryJSON accepted %v", tm)
			}
			// The detail leaves the time out, and refuses it all the same.
			if b, err := store.AppendLedgerEntryDetailJSON(nil, &e); err == nil {
				t.Fatalf("AppendLedgerEntryDetailJSON accepted %v: %s", tm, b)
			}
		}
	}
}

// Encoding an entry into a buffer that has room allocates nothing: the
// settlement paths encode one per call.
func TestLedgerEntryJSONAllocates(t *testing.T) {
	e := store.LedgerEntry{Seq: 7, ID: "led_7", Time: time.Date(2026, 11, 26, 1, 2, 3, 456789000, time.UTC), UserID: "user-42",
		ServiceID: "weather", EndpointID: "forecast", ProductID: "pro", RequestID: "0193a8f2-7c1e-7b3a-9f00-000000000001",
		OccurredAt: time.Date(2026, 11, 26, 1, 2, 0, 0, time.UTC), Units: 3_000_000, Source: "gateway"}
	buf := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := store.AppendLedgerEntryJSON(buf, &e); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("AppendLedgerEntryJSON: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := store.AppendLedgerEntryDetailJSON(buf, &e); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("AppendLedgerEntryDetailJSON: %v allocations, want 0", n)
	}
}

// AppendProductJSON names every field of billing.Product that
// encoding/json writes: a field added to the product without its line
// there would be dropped from every stored hold and settlement record.
func TestProductJSONKnowsEveryField(t *testing.T) {
	known := map[string]bool{"id": true, "billing_model": true, "measurement_type": true, "unit_label": true, "quota": true,
		"period": true, "calendar_periods": true, "overage": true, "price": true, "spending_cap": true, "rate_limit": true}
	typ := reflect.TypeFor[billing.Product]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if !known[name] {
			t.Errorf("billing.Product.%s (json %q) is not written by store.AppendProductJSON", f.Name, name)
		}
		delete(known, name)
	}
	for name := range known {
		t.Errorf("store.AppendProductJSON writes %q, which billing.Product no longer has", name)
	}
	rl := reflect.TypeFor[billing.RateLimit]()
	if rl.NumField() != 3 {
		t.Errorf("billing.RateLimit has %d fields; store.AppendProductJSON writes 3", rl.NumField())
	}
	r := rand.New(rand.NewPCG(7, 8))
	for range 5000 {
		p := storetest.RandProduct(r)
		if p == nil {
			continue
		}
		want, _ := json.Marshal(p)
		if got := store.AppendProductJSON([]byte("x"), p); !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Fatalf("AppendProductJSON:\n got %s\nwant %s", got[1:], want)
		}
	}
}
