package platform

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// TestUsageExportOfOldTimes: a ledger row an older version kept with an
// occurredAt before year 0 (a report's body timestamp
// "0000-01-01T00:00:00+01:00" was kept as year -1, before such
// timestamps were refused: TestUsageTimestampBefore1970) is exported by
// the admin API, in JSON, NDJSON and CSV, with its occurredAt at
// 0000-01-01T00:00:00Z, the earliest time RFC 3339 writes, and the rest
// of it as stored. The JSON export answered 500 for every selection
// holding the row, and `caddy platform store migrate` could not move the
// file to PostgreSQL; the row now moves, its occurredAt clamped, and the
// PostgreSQL store exports it alike.
func TestUsageExportOfOldTimes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "platform.db")
	bolt, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	now := time.Now().UTC().Truncate(time.Second)
	quota := billing.Whole(10)
	p := billing.Product{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &quota}
	if _, err := bolt.PutSubscription(ctx, store.Subscription{UserID: "alice", ServiceID: "svc", ProductID: "basic",
		Status: "ACTIVE", StartedAt: now.Add(-time.Hour), UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	// As the report handler recorded it: occurredAt is the body's time.
	old := time.Date(0, 1, 1, 0, 0, 0, 0, time.FixedZone("", 3600)).UTC() // year -1
	if _, err := bolt.Record(ctx, store.Account{UserID: "alice", ServiceID: "svc", Product: p},
		store.LedgerEntry{Time: now, UserID: "alice", ServiceID: "svc", ProductID: "basic", RequestID: "r-old",
			OccurredAt: old, Units: billing.Whole(1), Source: store.SourceReport},
		func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
		t.Fatal(err)
	}
	const shown = "0000-01-01T00:00:00Z"
	exports := func(name string, st store.Store) {
		t.Helper()
		app, api := appOver(st), &adminAPI{logger: zap.NewNop()}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := api.exportUsage(app, w, r, nil); err != nil {
				api.writeError(w, r, err)
			}
		}))
		defer srv.Close()
		for _, tc := range []struct{ format, want string }{
			{"json", `"requestId":"r-old","occurredAt":"` + shown + `"`},
			{"ndjson", `"requestId":"r-old","occurredAt":"` + shown + `"`},
			{"csv", ",r-old,report,1,0,0,0," + shown + ","},
		} {
			r := ledgerGet(t, srv.URL+"?userId=alice&format="+tc.format, nil)
			if r.status != 200 || !strings.Contains(string(r.body), tc.want) {
				t.Errorf("%s, %s export: %d %s, want it to hold %s", name, tc.format, r.status, r.body, tc.want)
			}
		}
	}
	exports("bbolt", bolt)

	if err := bolt.Close(); err != nil {
		t.Fatal(err)
	}
	dsn := pgtest.DB(t)
	if out, err := cliRun(t, "store", "migrate", "--to", "postgres", "--dsn", dsn, path); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	pg, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "check"})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	var es []store.LedgerEntry
	if err := pg.ScanLedger(ctx, store.LedgerFilter{UserID: "alice"}, func(e store.LedgerEntry) error {
		es = append(es, e)
		return nil
	}); err != nil || len(es) != 1 || es[0].RequestID != "r-old" || es[0].Units != billing.Whole(1) ||
		es[0].OccurredAt.Format(time.RFC3339) != shown {
		t.Fatalf("migrated ledger: %+v %v", es, err)
	}
	exports("PostgreSQL", pg)
}
