package console

// The overview at scale (issue 27): the console's overview page over a
// month of 10 million calls, read from the hourly rollups of a real bbolt
// store. A benchmark, not a test: the figure is reported, never passed or
// failed on (the machine is shared and its speed drifts).
//
//	OVERVIEW_SCALE_DIR=/tmp/ovscale go test -run '^$' -bench '^BenchmarkOverviewScale$' -benchtime 20x -count 5 ./internal/console
//
// OVERVIEW_SCALE_CALLS changes the number of calls (default 10,000,000).
// OVERVIEW_SCALE_DIR keeps the store (about 350 MB) between runs and
// -count rounds; without it each round builds one in a temporary
// directory (about 15 s here) and removes it. Skipped under -short.

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	segledger "github.com/platformgw/gateway/internal/store/ledger"
)

// The month the calls fall in, and the console's clock: the last ten
// minutes of it, so the whole month is "this month" on the overview.
var (
	scaleMonth = time.Date(2026, time.October, 1, 0, 0, 0, 0, time.UTC)
	scaleNow   = time.Date(2026, time.October, 30, 23, 50, 0, 0, time.UTC)
)

const scaleUsers = 21

// scaleCatalog: four services of three endpoints each, one product each
// (per request, but writer per token).
func scaleCatalog(tb testing.TB) *catalog.Catalog {
	tb.Helper()
	quota := billing.Whole(1_000_000_000)
	perRequest := func(id string) *billing.Product {
		return &billing.Product{ID: id, BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
			UnitLabel: "request", Price: billing.Whole(1) / 1000}
	}
	svc := func(id string, eps []string, p *billing.Product) *catalog.Service {
		s := &catalog.Service{ID: id, Backend: "http://127.0.0.1:9", Secrets: []string{testSecret}, Products: []*billing.Product{p}}
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

// scaleSubs: each of the 21 users on two of the four services, 42
// subscriptions.
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

// buildScaleLedger writes calls ledger rows, spread evenly over the 30
// days from scaleMonth to scaleNow, at random over the subscriptions and their
// endpoints, into the ledger directory of the store file at path, through
// the ledger's own Append (internal/store/ledger), which is what the
// store's applier calls: it keeps the hourly rollups as the rows go in.
// Going around the store's settlement path (a Settle per call) is what
// makes 10 million rows take seconds instead of an hour; the store opened
// on the directory afterwards is an ordinary one (it numbers new rows on
// from the ledger's last).
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
	start := time.Now()
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
	appended := time.Since(start)
	if err := l.Seal(); err != nil { // else the store would seal them in the background, during the measuring
		tb.Fatal(err)
	}
	if err := l.Close(); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("%d calls appended in %s, sealed %s later", calls, appended.Round(time.Second), (time.Since(start) - appended).Round(time.Second))
}

// scaleConsole opens (building first, when missing) the store with calls
// calls in dir and returns the console over it.
func scaleConsole(tb testing.TB, dir string, calls int) (*Handler, *boltstore.Store) {
	tb.Helper()
	cat := scaleCatalog(tb)
	path := filepath.Join(dir, fmt.Sprintf("overview-%d.db", calls))
	_, err := os.Stat(path)
	fresh := err != nil
	if fresh {
		os.RemoveAll(boltstore.LedgerDir(path)) // a build cut short
		buildScaleLedger(tb, path, cat, calls)
	}
	st, err := boltstore.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	used := ops.NewKeyUse()
	rt := engine.New(engine.Runtime{Catalog: cat, Data: st, KeyUsed: used.Touch, Calls: new(engine.Calls),
		Clock: func() time.Time { return scaleNow }})
	o := ops.New(rt, used.Get)
	if fresh {
		for _, s := range scaleSubs(cat) {
			if _, err := o.PutSubscription(context.Background(), "console:operator", s.user, s.service, s.product, "ACTIVE"); err != nil {
				st.Close()
				tb.Fatal(err)
			}
		}
	}
	h := &Handler{Prefix: "/console"}
	if err := h.setup(rt, o, zap.NewNop()); err != nil {
		st.Close()
		tb.Fatal(err)
	}
	return h, st
}

// BenchmarkOverviewScale renders the console's overview (GET /console/,
// the real handler through httptest) over a month of 10 million calls by
// 21 users on 4 services of 3 endpoints: about 90,000 hourly rollups.
func BenchmarkOverviewScale(b *testing.B) {
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
	h, st := scaleConsole(b, dir, calls)
	defer st.Close()
	rollups := 0
	if err := st.ScanRollups(context.Background(), store.RollupFilter{From: scaleMonth}, func(store.Rollup) error {
		rollups++
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	// The page must be the whole month, every call counted, not the
	// partial one the overview shows past its cap.
	w := serve(h, httptest.NewRequest("GET", "/console/", nil), "op")
	body := w.Body.String()
	if w.Code != 200 || !strings.Contains(body, fmt.Sprintf(`<div class="v">%d</div>`, calls)) || strings.Contains(body, "more ledger entries than the overview adds up") {
		b.Fatalf("the overview does not show the month's %d calls: %d\n%s", calls, w.Code, body)
	}
	b.Logf("%d calls, %d hourly rollups in the month, page %d bytes", calls, rollups, len(body))
	b.Run("console", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			w := serve(h, httptest.NewRequest("GET", "/console/", nil), "op")
			if w.Code != 200 {
				b.Fatal(w.Code)
			}
		}
	})
}
