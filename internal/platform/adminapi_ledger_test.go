package platform

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/ledger"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// segmentedStore is the bbolt store with its ledger in segments, as the
// store will be once the segmented ledger is plugged into it
// (docs/operations.md): the real bbolt store for everything else, a real
// ledger directory for the ledger.
type segmentedStore struct {
	*boltstore.Store
	l *ledger.Ledger
}

func (s segmentedStore) ScanLedger(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error {
	return s.l.Scan(ctx, f, fn)
}

func (s segmentedStore) ScanRollups(ctx context.Context, f store.RollupFilter, fn func(store.Rollup) error) error {
	return s.l.ScanRollups(ctx, f, fn)
}

// PruneLedger writes the entries before the files go, as the bbolt
// store's own ledger does.
func (s segmentedStore) PruneLedger(ctx context.Context, before time.Time, audit ...store.AuditEntry) (store.PruneResult, error) {
	return s.l.PruneWith(before, func(planned store.PruneResult) error {
		for _, e := range store.WithPruned(audit, planned) {
			if _, err := s.AppendAudit(ctx, e); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s segmentedStore) PruneRollups(_ context.Context, before time.Time) (int, error) {
	return s.l.PruneRollups(before)
}

var (
	_ store.RollupReader = segmentedStore{}
	_ store.LedgerPruner = segmentedStore{}
	_ store.RollupPruner = segmentedStore{}
)

// ledgerEnv is an App over a segmented store holding three days of calls
// (two users, 10 an hour each), each day a sealed segment, and the admin
// handlers in front of it.
func ledgerEnv(t *testing.T) (*App, *httptest.Server, []store.LedgerEntry) {
	t.Helper()
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var all []store.LedgerEntry
	seq := uint64(0)
	day0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	for d := range 3 {
		var es []store.LedgerEntry
		for h := range 24 {
			for i := range 20 {
				seq++
				user := []string{"alice", "bob"}[i%2]
				es = append(es, store.LedgerEntry{Seq: seq, ID: fmt.Sprint("led_", seq),
					Time:   day0.Add(time.Duration(d*24+h)*time.Hour + time.Duration(i)*time.Minute),
					UserID: user, ServiceID: "weather", EndpointID: "forecast", ProductID: "basic",
					RequestID: fmt.Sprintf("7f1c7f8e-1111-4222-8333-%012d", seq), Units: billing.Whole(2),
					Cost: billing.Whole(1), Source: store.SourceGateway})
			}
		}
		if err := l.Append(es, uint64(d+1)); err != nil {
			t.Fatal(err)
		}
		if err := l.Seal(); err != nil {
			t.Fatal(err)
		}
		all = append(all, es...)
	}
	app := appOver(segmentedStore{bolt, l})
	api := &adminAPI{logger: zap.NewNop()}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := api.exportUsage
		if r.URL.Path == "/prune" {
			h = api.pruneUsage
		}
		if err := h(app, w, r, nil); err != nil {
			api.writeError(w, r, err)
		}
	}))
	t.Cleanup(srv.Close)
	return app, srv, all
}

// get fetches without Go's transparent gzip, to see the body as sent.
func ledgerGet(t *testing.T, url string, header http.Header) admResponse {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return admResponse{status: resp.StatusCode, header: resp.Header, body: body}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not gzip: %v", err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gzip body: %v", err)
	}
	return out
}

func TestUsageExportGzip(t *testing.T) {
	_, srv, all := ledgerEnv(t)
	plain := ledgerGet(t, srv.URL+"?format=ndjson", nil)
	if plain.status != 200 || plain.header.Get("Content-Encoding") != "" || bytes.Count(plain.body, []byte("\n")) != len(all) {
		t.Fatalf("plain export: %d %v, %d lines", plain.status, plain.header, bytes.Count(plain.body, []byte("\n")))
	}
	for _, c := range []struct {
		query, accept string
		gz            bool
	}{
		{"&gzip=true", "", true},
		{"", "gzip", true},
		{"", "br, gzip;q=0.5", true},
		{"", "gzip;q=0", false},
		{"", "identity", false},
		{"&gzip=false", "gzip", false},
	} {
		r := ledgerGet(t, srv.URL+"?format=ndjson"+c.query, http.Header{"Accept-Encoding": {c.accept}})
		body := r.body
		if c.gz {
			if r.header.Get("Content-Encoding") != "gzip" {
				t.Fatalf("%q %q: not gzip: %v", c.query, c.accept, r.header)
			}
			body = gunzip(t, body)
			if len(r.body)*3 > len(body) {
				t.Errorf("gzip body %d bytes for %d", len(r.body), len(body))
			}
		} else if r.header.Get("Content-Encoding") != "" {
			t.Fatalf("%q %q: compressed: %v", c.query, c.accept, r.header)
		}
		if !bytes.Equal(body, plain.body) {
			t.Fatalf("%q %q: the body differs from the plain export", c.query, c.accept)
		}
	}
	admExpectError(t, ledgerGet(t, srv.URL+"?gzip=maybe", nil), 400, "invalid_request", "gzip")
	// Go's client asks for gzip by itself and unpacks it: the CLI gets
	// compressed exports for free.
	resp, err := http.Get(srv.URL + "?format=ndjson")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !resp.Uncompressed || !bytes.Equal(body, plain.body) {
		t.Errorf("Go's client: uncompressed %v, same body %v", resp.Uncompressed, bytes.Equal(body, plain.body))
	}
}

func TestUsageExportRollups(t *testing.T) {
	_, srv, all := ledgerEnv(t)
	r := ledgerGet(t, srv.URL+"?rollup=hour&userId=alice&from=2026-05-02&to=2026-05-02", nil)
	var rs []store.Rollup
	if err := json.Unmarshal(r.body, &rs); err != nil || r.status != 200 {
		t.Fatalf("rollups: %d %s (%v)", r.status, r.body, err)
	}
	if len(rs) != 24 {
		t.Fatalf("%d hourly rollups of alice on May 2, want 24", len(rs))
	}
	for i, x := range rs {
		want := time.Date(2026, 5, 2, i, 0, 0, 0, time.UTC)
		if !x.Hour.Equal(want) || x.UserID != "alice" || x.Calls != 10 || x.Units != billing.Whole(20) || x.Cost != billing.Whole(10) ||
			x.EndpointID != "forecast" || x.ProductID != "basic" {
			t.Fatalf("rollup %d: %+v", i, x)
		}
	}
	// The sums equal the rows'.
	r = ledgerGet(t, srv.URL+"?rollup=hour&format=csv", http.Header{"Accept-Encoding": {"gzip"}})
	rows, err := csv.NewReader(bytes.NewReader(gunzip(t, r.body))).ReadAll()
	if err != nil || len(rows) != 1+3*24*2 || strings.Join(rows[0], ",") != strings.Join(ops.RollupCSVColumns(), ",") {
		t.Fatalf("csv rollups: %d rows %v (%v)", len(rows), rows[:1], err)
	}
	calls := 0
	for _, row := range rows[1:] {
		var n int
		fmt.Sscan(row[5], &n)
		calls += n
	}
	if calls != len(all) || r.header.Get("Content-Disposition") != `attachment; filename="usage-hourly.csv"` {
		t.Fatalf("csv rollups sum to %d calls, the ledger has %d; %v", calls, len(all), r.header)
	}
	r = ledgerGet(t, srv.URL+"?rollup=hour&format=ndjson&userId=nobody", nil)
	if r.status != 200 || len(r.body) != 0 {
		t.Fatalf("no rollups: %d %q", r.status, r.body)
	}
	admExpectError(t, ledgerGet(t, srv.URL+"?rollup=day", nil), 400, "invalid_request", "rollup")
}

func TestUsagePrune(t *testing.T) {
	app, srv, all := ledgerEnv(t)
	post := func(q string) admResponse {
		resp, err := http.Post(srv.URL+"/prune"+q, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return admResponse{status: resp.StatusCode, header: resp.Header, body: body}
	}
	admExpectError(t, post(""), 400, "invalid_request", "before")
	admExpectError(t, post("?before=soon"), 400, "invalid_request", "before")
	admExpectError(t, post("?before=2999-01-01"), 400, "invalid_request", "before")
	admExpectError(t, post("?before=2026-05-02&extra=1"), 400, "invalid_request", "extra")
	r := post("?before=2026-05-02T00:00:00Z")
	var res store.PruneResult
	if err := json.Unmarshal(r.body, &res); err != nil || r.status != 200 || res.Segments != 1 || res.Rows != 480 || res.Bytes <= 0 {
		t.Fatalf("prune: %d %s", r.status, r.body)
	}
	var rows []store.LedgerEntry
	json.Unmarshal(ledgerGet(t, srv.URL, nil).body, &rows)
	if len(rows) != len(all)-480 || !rows[0].Time.Equal(all[480].Time) {
		t.Fatalf("after prune: %d rows", len(rows))
	}
	var rs []store.Rollup
	json.Unmarshal(ledgerGet(t, srv.URL+"?rollup=hour", nil).body, &rs)
	if len(rs) != 3*24*2 {
		t.Fatalf("after prune: %d rollups, want all %d", len(rs), 3*24*2)
	}

	// ledger_retention and rollup_retention, as maintenance applies them.
	app.LedgerRetention = caddy.Duration(24 * time.Hour)
	app.RollupRetention = caddy.Duration(48 * time.Hour)
	app.pruneLedger(context.Background(), time.Date(2026, 5, 4, 1, 0, 0, 0, time.UTC))
	rows = nil
	json.Unmarshal(ledgerGet(t, srv.URL, nil).body, &rows)
	rs = nil
	json.Unmarshal(ledgerGet(t, srv.URL+"?rollup=hour", nil).body, &rs)
	if len(rows) != 480 || len(rs) != 2*23*2+2 {
		t.Fatalf("after the retentions: %d rows, %d rollups", len(rows), len(rs))
	}
	// Each removal of billing data is audited, the retentions' too.
	entries, _, err := app.ops.AuditLog(context.Background(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Actor+" "+e.Action+" "+e.Detail)
	}
	if len(got) != 3 || !strings.HasPrefix(got[0], "rollup_retention rollups.prune hourly rollups before 2026-05-02T01:00:00Z: ") ||
		!strings.HasPrefix(got[1], "ledger_retention usage.prune raw ledger rows before 2026-05-03T01:00:00Z: ") ||
		!strings.Contains(got[2], " usage.prune raw ledger rows before ") {
		t.Fatalf("audit log after the prunes: %q", got)
	}
}

// plainStore is a store with only the methods of store.Store: one without
// rollups or pruning.
type plainStore struct{ store.Store }

// TestUsageLedgerNotSupported: a store without rollups or pruning says so.
func TestUsageLedgerNotSupported(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	app := appOver(plainStore{bolt})
	api := &adminAPI{logger: zap.NewNop()}
	for _, c := range []struct {
		method, target string
		h              adminHandler
	}{
		{"GET", "/platform/usage?rollup=hour", api.exportUsage},
		{"POST", "/platform/usage/prune?before=2026-01-01", api.pruneUsage},
	} {
		w := httptest.NewRecorder()
		if err := c.h(app, w, httptest.NewRequest(c.method, c.target, nil), nil); err != nil {
			t.Fatal(err)
		}
		admExpectError(t, admResponse{status: w.Code, header: w.Header(), body: w.Body.Bytes()}, 501, codeNotSupported, "")
	}
}

func TestCaddyfileLedgerRetention(t *testing.T) {
	var a App
	d := caddyfile.NewTestDispenser(`platform {
		ledger_retention 90d
		rollup_retention 730d
	}`)
	if err := a.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if time.Duration(a.LedgerRetention) != 90*24*time.Hour || time.Duration(a.RollupRetention) != 730*24*time.Hour {
		t.Fatalf("parsed %v %v", a.LedgerRetention, a.RollupRetention)
	}
	for _, bad := range []string{"ledger_retention", "ledger_retention soon", "rollup_retention -1h", "ledger_retention 1d\nledger_retention 2d"} {
		var a App
		if err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser("platform {\n" + bad + "\n}")); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestCLIUsagePruneAndRollup runs the commands against the real admin
// endpoint and its bbolt store, which keeps its ledger segmented.
func TestCLIUsagePruneAndRollup(t *testing.T) {
	admStart(t)
	if _, err := cliRun(t, "usage", "prune"); err == nil || !strings.Contains(err.Error(), "--before is required") {
		t.Errorf("prune without --before: %v", err)
	}
	if _, err := cliRun(t, "usage", "prune", "--before", "2026-01-01"); err != nil {
		t.Errorf("prune: %v", err)
	}
	if _, err := cliRun(t, "usage", "prune", "--before", "tomorrow"); err == nil || !strings.Contains(err.Error(), "(field before)") {
		t.Errorf("prune with a bad time: %v", err)
	}
	if _, err := cliRun(t, "usage", "--rollup", "hour"); err != nil {
		t.Errorf("usage --rollup hour: %v", err)
	}
}

func TestProgressWriter(t *testing.T) {
	var progress, out bytes.Buffer
	old := usageProgress
	usageProgress = &progress
	defer func() { usageProgress = old }()
	pw := newProgressWriter(&out)
	pw.Write([]byte("a\nb\n"))
	pw.report(true)
	if progress.Len() != 0 {
		t.Fatalf("a short export reported %q", progress.String())
	}
	pw.last = pw.last.Add(-progressEvery) // as if 2 s went by
	pw.start = pw.last
	pw.Write([]byte("c\n"))
	pw.report(true)
	if s := progress.String(); !strings.Contains(s, "exporting: 3 lines") || !strings.Contains(s, "exported: 3 lines") || out.String() != "a\nb\nc\n" {
		t.Fatalf("progress %q, out %q", s, out.String())
	}
}

// TestUsageLedgerPostgres: on the PostgreSQL store the rollup export, the
// prune route and ledger_retention/rollup_retention work, with whole
// monthly partitions: the month the cutoff falls in stays.
func TestUsageLedgerPostgres(t *testing.T) {
	pg, err := pgstore.Open(context.Background(), pgstore.Options{DSN: pgtest.DB(t), NodeID: "ledger-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	var all []store.LedgerEntry
	for m := range 3 {
		for h := range 10 {
			seq := uint64(len(all) + 1)
			all = append(all, store.LedgerEntry{Seq: seq, ID: fmt.Sprint("led_", seq),
				Time:   time.Date(2026, time.Month(1+m), 10, h, 30, 0, 0, time.UTC),
				UserID: []string{"alice", "bob"}[h%2], ServiceID: "weather", EndpointID: "forecast", ProductID: "basic",
				Units: billing.Whole(2), Cost: billing.Whole(1), Source: store.SourceGateway})
		}
	}
	if err := pg.ImportLedger(context.Background(), all); err != nil {
		t.Fatal(err)
	}
	app := appOver(pg)
	api := &adminAPI{logger: zap.NewNop()}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := api.exportUsage
		if r.URL.Path == "/prune" {
			h = api.pruneUsage
		}
		if err := h(app, w, r, nil); err != nil {
			api.writeError(w, r, err)
		}
	}))
	t.Cleanup(srv.Close)
	var rs []store.Rollup
	json.Unmarshal(ledgerGet(t, srv.URL+"?rollup=hour", nil).body, &rs)
	if len(rs) != 30 || rs[0].Calls != 1 || rs[0].Units != billing.Whole(2) {
		t.Fatalf("rollups: %+v", rs)
	}
	resp, err := http.Post(srv.URL+"/prune?before=2026-02-20", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var res store.PruneResult
	if err := json.Unmarshal(body, &res); err != nil || resp.StatusCode != 200 || res.Segments != 1 || res.Rows != 10 || res.Bytes <= 0 {
		t.Fatalf("prune: %d %s", resp.StatusCode, body)
	}
	var rows []store.LedgerEntry
	json.Unmarshal(ledgerGet(t, srv.URL, nil).body, &rows)
	if len(rows) != 20 || rows[0].Time.Month() != time.February {
		t.Fatalf("after the prune: %d rows (February straddles the cutoff and stays)", len(rows))
	}
	// ledger_retention and rollup_retention, as maintenance applies them.
	app.LedgerRetention = caddy.Duration(24 * time.Hour)
	app.RollupRetention = caddy.Duration(30 * 24 * time.Hour)
	app.pruneLedger(context.Background(), time.Date(2026, 4, 2, 0, 0, 0, 0, time.UTC))
	rows, rs = nil, nil
	json.Unmarshal(ledgerGet(t, srv.URL, nil).body, &rows)
	json.Unmarshal(ledgerGet(t, srv.URL+"?rollup=hour", nil).body, &rs)
	if len(rows) != 0 || len(rs) != 10 || rs[0].Hour.Month() != time.March {
		t.Fatalf("after the retentions: %d rows, %d rollups", len(rows), len(rs))
	}
}

// TestStoreBackupPostgres: on the PostgreSQL store the backup route
// answers 501 with the code every route a store cannot serve answers,
// not_supported. It said platform_not_configured, the code of a running
// config without a platform app (503), for a platform that is configured.
func TestStoreBackupPostgres(t *testing.T) {
	pg, err := pgstore.Open(context.Background(), pgstore.Options{DSN: pgtest.DB(t), NodeID: "backup-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	app := appOver(pg)
	app.held.Store(&heldStore{pg})
	w := httptest.NewRecorder()
	api := &storeAdminAPI{logger: zap.NewNop()}
	if err := api.backup(app, w, httptest.NewRequest(http.MethodGet, storeAdminBase+"backup", nil)); err != nil {
		t.Fatal(err)
	}
	var e struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(w.Body.Bytes(), &e); w.Code != http.StatusNotImplemented || e.Code != codeNotSupported {
		t.Errorf("backup of a PostgreSQL store: %d %s; want 501 %s", w.Code, w.Body, codeNotSupported)
	}
}

// TestRollupExportNamesCostUnit: an hourly rollup's cost is money in the
// product's listing currency (or credits for PREPAID), and the rollup
// export names it as the row export does (costUnit); it gave the summed
// cost as a bare number, in every format.
func TestRollupExportNamesCostUnit(t *testing.T) {
	app, srv, _ := ledgerEnv(t)
	cat, err := catalog.Compile([]*catalog.Service{{ID: "weather", Backend: "http://127.0.0.1:9", Secrets: []string{"s3cret-s3cret-s3cret-s3cret-0001"},
		Endpoints: []*catalog.Endpoint{{ID: "forecast", Path: "/forecast"}},
		Products: []*billing.Product{
			{ID: "basic", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1) / 2},
		},
		ProductListings: []*catalog.ProductListing{{Product: "basic", Currency: "EUR"}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	app.catalog = cat
	r := ledgerGet(t, srv.URL+"?rollup=hour&userId=alice&from=2026-05-02&to=2026-05-02&format=ndjson", nil)
	if first, _, _ := strings.Cut(string(r.body), "\n"); r.status != 200 || !strings.HasSuffix(first, `"cost":10,"costUnit":"EUR"}`) {
		t.Errorf("ndjson rollup: %d %s", r.status, first)
	}
	r = ledgerGet(t, srv.URL+"?rollup=hour&userId=alice&from=2026-05-02&to=2026-05-02&format=csv", nil)
	rows, err := csv.NewReader(bytes.NewReader(r.body)).ReadAll()
	if err != nil || len(rows) < 2 || rows[0][len(rows[0])-1] != "costUnit" || rows[1][len(rows[1])-1] != "EUR" {
		t.Errorf("csv rollup: %v (%v)", rows[:min(2, len(rows))], err)
	}
}
