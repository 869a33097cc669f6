package console

import (
	"context"
	"encoding/csv"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestConsoleUsageExportOfOldTimes: a ledger row an older version kept
// with an occurredAt before year 0 (a report's body timestamp
// "0000-01-01T00:00:00+01:00" was kept as year -1, before such
// timestamps were refused) is exported with its occurredAt clamped to
// 0000-01-01T00:00:00Z, the earliest time RFC 3339 writes, in JSON and
// CSV alike, and the explorer shows it. The JSON export answered 500
// for every selection holding it, from then on.
func TestConsoleUsageExportOfOldTimes(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	ctx := context.Background()
	if _, err := e.ops.PutSubscription(ctx, "test", "alice", "weather", "basic", ""); err != nil {
		t.Fatal(err)
	}
	svc, _ := e.rt.Catalog.Service("weather")
	p, _ := svc.Product("basic")
	now := time.Now().UTC()
	// As the report handler recorded it: occurredAt is the body's time.
	old := time.Date(0, 1, 1, 0, 0, 0, 0, time.FixedZone("", 3600)).UTC() // year -1
	if _, err := e.rt.Store().Record(ctx, store.Account{UserID: "alice", ServiceID: "weather", Product: *p},
		store.LedgerEntry{Time: now, UserID: "alice", ServiceID: "weather", ProductID: "basic", RequestID: "r-old",
			OccurredAt: old, Source: store.SourceReport, Units: billing.Whole(1)},
		func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
		t.Fatal(err)
	}
	w := serve(h, httptest.NewRequest("GET", "/console/usage/export?format=json&user=alice", nil), "bob")
	b, _ := io.ReadAll(w.Body)
	if w.Code != 200 || !strings.Contains(string(b), `"requestId":"r-old","occurredAt":"0000-01-01T00:00:00Z"`) {
		t.Errorf("json export: %d %s", w.Code, b)
	}
	w = serve(h, httptest.NewRequest("GET", "/console/usage/export?format=csv&user=alice", nil), "bob")
	rows, err := csv.NewReader(w.Body).ReadAll()
	if w.Code != 200 || err != nil || len(rows) != 2 || rows[1][6] != "r-old" || rows[1][12] != "0000-01-01T00:00:00Z" {
		t.Errorf("csv export: %d %v %q", w.Code, err, rows)
	}
	if w := serve(h, httptest.NewRequest("GET", "/console/usage?user=alice", nil), "bob"); w.Code != 200 || !strings.Contains(w.Body.String(), "<strong>1</strong> entr") {
		t.Errorf("explorer: %d", w.Code)
	}
}
