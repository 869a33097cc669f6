package portal

// The portal's dashboard at scale (issue 27), beside the console's
// overview (internal/console/overview_scale_test.go, the same store): one
// user's dashboard over a month of 10 million calls by 21 users, read
// from the hourly rollups of a real bbolt store. A benchmark, not a test:
// the figure is reported, never passed or failed on.
//
//	OVERVIEW_SCALE_DIR=/tmp/ovscale-portal go test -run '^$' -bench '^BenchmarkDashboardScale$' -benchtime 20x -count 5 ./internal/portal
//
// OVERVIEW_SCALE_CALLS and OVERVIEW_SCALE_DIR as for the console's.

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	segledger "github.com/platformgw/gateway/internal/store/ledger"
)

// The same month, clock, catalog and rows as the console's benchmark.
var (
	scaleMonth = time.Date(2026, time.October, 1, 0, 0, 0, 0, time.UTC)
	scaleNow   = time.Date(2026, time.October, 30, 23, 50, 0, 0, time.UTC)
)

const scaleUsers = 21

func scaleCatalog(tb testing.TB) *catalog.Catalog {
	tb.Helper()
	quota := billing.Whole(1_000_000_000)
	perRequest := func(id string) *billing.Product {
		return &billing.Product{ID: id, BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
			UnitLabel: "request", Price: billing.Whole(1) / 1000}
	}
	svc := func(id string, eps []string, p *billing.Product) *catalog.Service {
		s := &catalog.Service{ID: id, Backend: "http://127.0.0.1:9", Secrets: []string{echoSecret}, Products: []*billing.Product{p}}
		for _, e := range eps {
			s.Endpoints = append(s.Endpoints, &catalog.Endpoint{ID: e, Path: "/" + e})
		}
		return s
	}
	cat, err := catalog.Compile([]*catalog.Service{
		svc("weather", []string{"hello", "forecast", "history"}, &billing.Product{ID: "basic", BillingModel: billing.Subscription,
			MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: &quota, Period: "month", Overage: "block"}),
		svc("maps", []string{"tiles", "geocode", "route"}, perRequest("metered")),
		svc("search", []string{"query", "suggest", "index"}, perRequest("metered")),
		svc("writer", []string{"draft", "edit", "summarize"}, &billing.Product{ID: "tokens", BillingModel: billing.UsagePostpaid,
			MeasurementType: billing.PerToken, UnitLabel: "token", Price: billing.Whole(1) / 1000}),
	}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return cat
}

type scaleSub struct{ user, service, product string }

func scaleSubs(cat *catalog.Catalog) []scaleSub {
	services := []string{"weather", "maps", "search", "writer"}
	var out []scaleSub
	for u := range scaleUsers {
		for _, s := range []string{services[u%4], services[(u+1)%4]} {
			svc, _ := cat.Service(s)
			out = append(out, scaleSub{fmt.Sprintf("user-%02d", u), s, svc.Products[0].ID})
		}
	}
	return out
}

// buildScaleLedger is the console benchmark's: calls rows from scaleMonth
// to scaleNow through the ledger's own Append, which keeps the rollups.
func buildScaleLedger(tb testing.TB, path string, cat *catalog.Catalog, calls int) {
	tb.Helper()
	l, err := segledger.Open(boltstore.LedgerDir(path), segledger.Options{ManualSeal: true, Level: zstd.SpeedFastest})
	if err != nil {
		tb.Fatal(err)
	}
	subs := scaleSubs(cat)
	eps := map[string][]string{}
	for _, s := range subs {
		svc, _ := cat.Service(s.service)
		for _, e := range svc.Endpoints {
			eps[s.service] = append(eps[s.service], e.ID)
		}
	}
	rng := rand.New(rand.NewPCG(27, 27))
	step := scaleNow.Sub(scaleMonth) / time.Duration(calls)
	const batch = 50_000
	es := make([]store.LedgerEntry, 0, batch)
	var uuid [16]byte
	var hexbuf [32]byte
	for i := range calls {
		s := subs[rng.IntN(len(subs))]
		e := eps[s.service][rng.IntN(len(eps[s.service]))]
		units := billing.Whole(1)
		if s.service == "writer" {
			units = billing.Whole(int64(200 + rng.IntN(1800)))
		}
		for j := 0; j < 16; j += 8 {
			v := rng.Uint64()
			for k := range 8 {
				uuid[j+k] = byte(v >> (8 * k))
			}
		}
		hex.Encode(hexbuf[:], uuid[:])
		seq := uint64(i + 1)
		es = append(es, store.LedgerEntry{Seq: seq, ID: "led_" + strconv.FormatUint(seq, 10),
			Time: scaleMonth.Add(time.Duration(i) * step), UserID: s.user, ServiceID: s.service, EndpointID: e,
			ProductID: s.product, RequestID: string(hexbuf[:]), Units: units, Cost: units / 1000, Source: store.SourceGateway})
		if len(es) == batch || i == calls-1 {
			if err := l.Append(es, seq); err != nil {
				tb.Fatal(err)
			}
			es = es[:0]
		}
	}
	if err := l.Seal(); err != nil {
		tb.Fatal(err)
	}
	if err := l.Close(); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkDashboardScale renders user-00's dashboard (GET /portal/,
// signed in with a key, through the real handler over httptest) over a
// month of 10 million calls; user-00 has about a 21st of them, on two
// services.
func BenchmarkDashboardScale(b *testing.B) {
	if testing.Short() {
		b.Skip("builds a store of millions of ledger rows")
	}
	calls := 10_000_000
	if v, err := strconv.Atoi(os.Getenv("OVERVIEW_SCALE_CALLS")); err == nil && v > 0 {
		calls = v
	}
	dir := os.Getenv("OVERVIEW_SCALE_DIR")
	if dir == "" {
		dir = b.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	cat := scaleCatalog(b)
	path := filepath.Join(dir, fmt.Sprintf("dashboard-%d.db", calls))
	_, err := os.Stat(path)
	fresh := err != nil
	if fresh {
		os.RemoveAll(boltstore.LedgerDir(path)) // a build cut short
		buildScaleLedger(b, path, cat, calls)
	}
	st, err := boltstore.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if fresh {
		for _, s := range scaleSubs(cat) {
			if _, err := st.PutSubscription(ctx, store.Subscription{UserID: s.user, ServiceID: s.service, ProductID: s.product,
				Status: "ACTIVE", UpdatedAt: scaleMonth.Add(-24 * time.Hour)}); err != nil {
				b.Fatal(err)
			}
		}
	}
	key, hash, err := servicekey.Generate()
	if err != nil {
		b.Fatal(err)
	}
	if err := st.CreateKey(ctx, store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: "user-00", Created: scaleNow.Add(-time.Hour)}); err != nil {
		b.Fatal(err)
	}
	used := ops.NewKeyUse()
	rt := engine.New(engine.Runtime{Catalog: cat, Data: st, Clock: func() time.Time { return scaleNow }, KeyUsed: used.Touch})
	h := new(Handler)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/portal")
		if !ok || !strings.HasPrefix(rest, "/") {
			http.NotFound(w, r)
			return
		}
		orig := *r
		u := *r.URL
		orig.URL = &u
		inner := r.Clone(context.WithValue(r.Context(), caddyhttp.OriginalRequestCtxKey, orig))
		inner.URL.Path, inner.URL.RawPath = rest, ""
		if err := h.ServeHTTP(w, inner, nil); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("platform_portal {\nsign_in_limit 1000\n}")); err != nil {
		b.Fatal(err)
	}
	if err := h.setup(ctx, rt, ops.New(rt, used.Get), zap.NewNop()); err != nil {
		b.Fatal(err)
	}
	srv.Start()
	defer srv.Close()

	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(p string) (int, string) {
		resp, err := c.Get(srv.URL + p)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	_, page := get("/portal/")
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		b.Fatalf("no csrf field:\n%s", page)
	}
	resp, err := c.PostForm(srv.URL+"/portal/signin", url.Values{"csrf": {m[1]}, "key": {key}})
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		b.Fatalf("sign-in: %d", resp.StatusCode)
	}
	code, page := get("/portal/")
	if code != http.StatusOK || !strings.Contains(page, "Your usage") {
		b.Fatalf("dashboard: %d\n%s", code, page)
	}
	b.Logf("%d calls, dashboard %d bytes", calls, len(page))
	b.Run("portal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if code, _ := get("/portal/"); code != http.StatusOK {
				b.Fatal(code)
			}
		}
	})
}
