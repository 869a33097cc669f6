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
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/scaletest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// scaleConsole opens (building first, when missing) the store with calls
// calls in dir and returns the console over it.
func scaleConsole(tb testing.TB, dir string, calls int) (*Handler, *boltstore.Store) {
	tb.Helper()
	cat := scaletest.Catalog(tb, testSecret)
	path := filepath.Join(dir, fmt.Sprintf("overview-%d.db", calls))
	_, err := os.Stat(path)
	fresh := err != nil
	if fresh {
		os.RemoveAll(boltstore.LedgerDir(path)) // a build cut short
		scaletest.BuildLedger(tb, path, cat, calls)
	}
	st, err := boltstore.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	used := ops.NewKeyUse()
	rt := engine.New(engine.Runtime{Catalog: cat, Data: st, KeyUsed: used.Touch, Calls: new(engine.Calls),
		Clock: func() time.Time { return scaletest.Now }})
	o := ops.New(rt, used.Get)
	if fresh {
		for _, s := range scaletest.Subs(cat) {
			if _, err := o.PutSubscription(context.Background(), "console:operator", s.User, s.Service, s.Product, "ACTIVE"); err != nil {
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
	if err := st.ScanRollups(context.Background(), store.RollupFilter{From: scaletest.Month}, func(store.Rollup) error {
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
