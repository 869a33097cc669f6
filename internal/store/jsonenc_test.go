package store_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// AppendLedgerEntryJSON writes what json.Marshal writes, byte for byte,
// after whatever the buffer already holds; so does AppendJSONString for
// every string (escapes, HTML characters, U+2028/2029, invalid UTF-8).
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
}
