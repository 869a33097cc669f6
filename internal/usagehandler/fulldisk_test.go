package usagehandler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/disktest"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

const diskSecret = "full-disk-secret-0123456789abcdef"

// diskServer serves a Handler over loopback HTTP from a real bbolt store
// on a small tmpfs; the handler and the store log into logs, the
// handler's lines named "usage", the store's "store".
type diskServer struct {
	t     *testing.T
	url   string
	at    time.Time
	hd    engine.Headers
	store *boltstore.Store
	dir   string
}

func newDiskServer(t *testing.T, logs *zap.Logger) *diskServer {
	t.Helper()
	dir := disktest.Small(t, "2m")
	st, err := boltstore.Open(filepath.Join(dir, "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	st.SetLogger(logs.Named("store"))
	quota := billing.Whole(1_000_000)
	svc := &catalog.Service{
		ID: "svc", Backend: "http://127.0.0.1:9", Secrets: []string{diskSecret},
		Endpoints: []*catalog.Endpoint{{ID: "job", Async: true}},
		Products: []*billing.Product{{ID: "basic", BillingModel: "SUBSCRIPTION", MeasurementType: billing.PerRequest,
			UnitLabel: "request", Quota: &quota}},
	}
	cat, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &diskServer{t: t, at: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), hd: engine.NewHeaders("Platform"), store: st, dir: dir}
	rt := engine.New(engine.Runtime{
		Catalog: cat,
		Data:    st,
		Clock:   func() time.Time { return d.at },
		Limits: engine.Limits{UsageMaxBodyBytes: 1 << 16, ResultMaxBytes: 1 << 10, JobTTL: time.Hour,
			TimestampTolerance: time.Minute},
	})
	h := &Handler{rt: rt, logger: logs.Named("usage")}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			http.NotFound(w, r)
			return nil
		}))
	}))
	t.Cleanup(srv.Close)
	d.url = srv.URL
	ctx := context.Background()
	if _, err := st.PutSubscription(ctx, store.Subscription{UserID: "alice", ServiceID: "svc", ProductID: "basic",
		Status: "ACTIVE", StartedAt: d.at.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	return d
}

// post sends body signed with the service's secret and returns the
// status and the JSON error's code.
func (d *diskServer) post(path, body string) (int, string) {
	d.t.Helper()
	ts := signing.Timestamp(d.at)
	req, err := http.NewRequest("POST", d.url+path, strings.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set(d.hd.Timestamp, ts)
	req.Header.Set(d.hd.Signature, signing.Sign([]byte(diskSecret), []byte(body), []byte(ts)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e struct{ Code string }
	json.Unmarshal(raw, &e)
	return resp.StatusCode, e.Code
}

// TestFullDiskLogsOncePerBurst: on a full disk every writing route of the
// usage service (report, progress, completion) refuses with 503
// store_unavailable, and the log holds one line for the burst, the
// store's, with the count of failed writes, never a line per refusal (a
// full disk was 93,560 ERROR lines in 20 s). A store failure that is not
// an unavailable store is still logged by the handler, one line each.
func TestFullDiskLogsOncePerBurst(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	d := newDiskServer(t, zap.New(core))
	const n = 100
	ids := []string{"job-progress"}
	for i := range n { // one a completion: a completion that got through ends its job
		ids = append(ids, fmt.Sprintf("job-complete-%d", i))
	}
	for _, id := range ids {
		if err := d.store.CreateJob(context.Background(), store.Job{ID: id, UserID: "alice", ServiceID: "svc", EndpointID: "job",
			ProductID: "basic", Status: store.JobPending, CreatedAt: d.at, UpdatedAt: d.at, ExpiresAt: d.at.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	epoch := d.at.Unix()
	report := func(i int) string {
		return fmt.Sprintf(`{"serviceId":"svc","userId":"alice","unitsUsed":1,"timestamp":%d,"requestId":"r-%d"}`, epoch, i)
	}
	if status, code := d.post("/usage/api/v1/report", report(-1)); status != 200 {
		t.Fatalf("report before the disk filled: %d %s", status, code)
	}
	disktest.Fill(t, d.dir)

	routes := []struct {
		name, path string
		body       func(i int) string
	}{
		{"report", "/usage/api/v1/report", report},
		{"progress", "/usage/api/v1/progress/job-progress", func(i int) string {
			return fmt.Sprintf(`{"stage":"s%d","percentageComplete":10,"timestamp":%d}`, i, epoch)
		}},
		{"complete", "", func(i int) string {
			return fmt.Sprintf(`{"status":"done","result":"r%d","units":1,"timestamp":%d}`, i, epoch)
		}},
	}
	start := time.Now()
	refused := 0
	for _, rt := range routes {
		routeRefused := 0
		for i := range n {
			path := rt.path
			if rt.name == "complete" {
				path = fmt.Sprintf("/usage/api/v1/complete/job-complete-%d", i)
			}
			status, code := d.post(path, rt.body(i))
			switch {
			case status == 503 && code == "store_unavailable":
				routeRefused++
			case status == 200:
				// A small record may still fit in the last block the
				// settlement log's file has: written and acknowledged.
			default:
				t.Fatalf("%s %d on a full disk: %d %s, want 503 store_unavailable", rt.name, i, status, code)
			}
		}
		if routeRefused == 0 {
			t.Fatalf("no %s was refused on a full disk", rt.name)
		}
		refused += routeRefused
	}
	elapsed := time.Since(start)

	// Each refusal has its INFO line, the request log the invoke path
	// keeps too ("usage request refused"); nothing above it.
	handlerErrs := logs.FilterLoggerName("usage").Filter(func(e observer.LoggedEntry) bool { return e.Level > zapcore.InfoLevel })
	if got := handlerErrs.Len(); got != 0 {
		t.Errorf("the usage handler logged %d warnings or errors for %d refusals, want none (the store sums them up): %v",
			got, refused, handlerErrs.All()[0].Message)
	}
	if got := logs.FilterLoggerName("usage").FilterMessage("usage request refused").Len(); got != refused {
		t.Errorf("%d refusal lines for %d refusals", got, refused)
	}
	storeLines := logs.FilterLoggerName("store").FilterLevelExact(zapcore.ErrorLevel).All()
	// One line for the burst, and at most one summary per interval the
	// loop took (the store's interval is 10 s; the loop takes well under).
	if len(storeLines) == 0 || len(storeLines) > 1+int(elapsed/(10*time.Second)) {
		t.Fatalf("%d store error lines for one burst in %s, want 1", len(storeLines), elapsed)
	}
	if _, ok := storeLines[0].ContextMap()["writes"]; !ok {
		t.Errorf("the burst's line has no count: %v", storeLines[0].ContextMap())
	}
	if got := d.store.WriteFailures(); got < uint64(refused) {
		t.Errorf("the store counted %d failed writes for %d refusals", got, refused)
	}

	// A failure that is not an unavailable store (the store closed under
	// the handler) is a 500 and logged, each time.
	if err := d.store.Close(); err != nil && !errors.Is(err, store.ErrUnavailable) {
		t.Logf("close on a full disk: %v", err)
	}
	errorLines := func() []observer.LoggedEntry {
		return logs.FilterLoggerName("usage").FilterLevelExact(zapcore.ErrorLevel).All()
	}
	before := len(errorLines())
	for i := range 3 {
		if status, code := d.post("/usage/api/v1/report", report(1000+i)); status != 500 || code != "internal_error" {
			t.Fatalf("report to a closed store: %d %s, want 500 internal_error", status, code)
		}
	}
	lines := errorLines()[before:]
	if len(lines) != 3 || lines[0].Message != "record report" || lines[0].ContextMap()["error"] == nil {
		t.Errorf("%d handler error lines for 3 reports to a closed store, want 3 \"record report\" with the error: %v", len(lines), lines)
	}
}

// TestPreflightRefusedWhileStoreCannotWrite: while the store cannot
// write, an invoke is refused before it is forwarded (503
// store_unavailable), and so are the pre-flight routes: an estimate said
// wouldAllow and a validation valid while every call and report failed,
// sending a backend to work it could not be paid for. When the disk has
// room again they answer as before, by themselves: the pre-flight routes
// probe the disk as invokes do, so a deployment that only reports and
// estimates recovers too. A closed store is a 500, as for an invoke.
func TestPreflightRefusedWhileStoreCannotWrite(t *testing.T) {
	d := newDiskServer(t, zap.NewNop())
	key, hash, err := servicekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.store.CreateKey(context.Background(), store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: "alice", Created: d.at}); err != nil {
		t.Fatal(err)
	}
	routes := []struct{ name, path, body string }{
		{"billing estimate", "/core/api/v1/billing/usage/estimate", `{"serviceId":"svc","userId":"alice","estimatedUnits":1}`},
		{"key estimate", "/core/api/v1/service-keys/estimate-usage", fmt.Sprintf(`{"serviceId":"svc","serviceKey":%q,"estimatedUnits":1}`, key)},
		{"validate", "/core/api/v1/service-keys/validate", fmt.Sprintf(`{"serviceId":"svc","serviceKey":%q}`, key)},
	}
	expect := func(when string, status int, code string) {
		t.Helper()
		for _, r := range routes {
			if s, c := d.post(r.path, r.body); s != status || c != code {
				t.Errorf("%s: %s answered %d %q, want %d %q", when, r.name, s, c, status, code)
			}
		}
	}
	expect("before the disk filled", 200, "")

	filler := disktest.Fill(t, d.dir)
	epoch := d.at.Unix()
	for i := 0; d.store.Healthy(); i++ {
		if i == 1000 {
			t.Fatal("1000 reports on a full disk and the store still says it writes")
		}
		d.post("/usage/api/v1/report", fmt.Sprintf(`{"serviceId":"svc","userId":"alice","unitsUsed":1,"timestamp":%d,"requestId":"r-%d"}`, epoch, i))
	}
	p := billing.Product{ID: "basic", BillingModel: "SUBSCRIPTION", MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: unitsPtr("1000000")}
	if _, err := d.store.Reserve(context.Background(), store.Account{UserID: "alice", ServiceID: "svc", Product: p}, billing.Whole(1), d.at); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("an invoke's hold on a full disk: %v, want store unavailable", err)
	}
	expect("on a full disk", 503, "store_unavailable")

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second) // the probe runs once a second
	for !d.store.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("the pre-flight routes never found the disk writable again")
		}
		d.post(routes[0].path, routes[0].body)
		time.Sleep(100 * time.Millisecond)
	}
	expect("with room again", 200, "")

	d.store.Close()
	expect("after the store closed", 500, "internal_error")
}
