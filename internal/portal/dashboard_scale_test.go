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
	"fmt"
	"io"
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
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/scaletest"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

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
	cat := scaletest.Catalog(b, echoSecret)
	path := filepath.Join(dir, fmt.Sprintf("dashboard-%d.db", calls))
	_, err := os.Stat(path)
	fresh := err != nil
	if fresh {
		os.RemoveAll(boltstore.LedgerDir(path)) // a build cut short
		scaletest.BuildLedger(b, path, cat, calls)
	}
	st, err := boltstore.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if fresh {
		for _, s := range scaletest.Subs(cat) {
			if _, err := st.PutSubscription(ctx, store.Subscription{UserID: s.User, ServiceID: s.Service, ProductID: s.Product,
				Status: "ACTIVE", UpdatedAt: scaletest.Month.Add(-24 * time.Hour)}); err != nil {
				b.Fatal(err)
			}
		}
	}
	key, hash, err := servicekey.Generate()
	if err != nil {
		b.Fatal(err)
	}
	if err := st.CreateKey(ctx, store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: "user-00", Created: scaletest.Now.Add(-time.Hour)}); err != nil {
		b.Fatal(err)
	}
	used := ops.NewKeyUse()
	rt := engine.New(engine.Runtime{Catalog: cat, Data: st, Clock: func() time.Time { return scaletest.Now }, KeyUsed: used.Touch})
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
