package portal

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// local serves the portal as start does, with the same options (the lines
// of its platform_portal block), but with no Caddy: the catalog of start's
// Caddyfile (service echo, endpoint hello, products basic and capped), a
// real bbolt store in t.TempDir(), the runtime and the operations over it
// as the platform app builds them, and an httptest server that mounts the
// handler under /portal/ as handle_path does. Its clock is the test's
// (setClock). "{site}" in portalOptions is the server's URL, known
// before the handler is set up; what the handler logs is in env.logs.
// Tests that make a call through the gateway or use the admin API stay
// on start.
func local(t *testing.T, portalOptions string) *env {
	t.Helper()
	quota, limit := billing.Whole(100), billing.Whole(10)
	svc := &catalog.Service{
		ID: "echo", Backend: "http://127.0.0.1:9", Secrets: []string{echoSecret},
		Endpoints: []*catalog.Endpoint{{ID: "hello", Methods: []string{"GET", "POST"}, Path: "/hello"}},
		Products: []*billing.Product{
			{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request",
				Quota: &quota, Overage: "block"},
			{ID: "capped", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, UnitLabel: "request",
				Price: billing.Whole(1) / 2, SpendingCap: &limit},
		},
	}
	return localWith(t, portalOptions, svc)
}

// localWith is local over a catalog of the services given.
func localWith(t *testing.T, portalOptions string, services ...*catalog.Service) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cat, err := catalog.Compile(services, nil)
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Pointer[func() time.Time]
	now := func() time.Time {
		if fn := clock.Load(); fn != nil {
			return (*fn)()
		}
		return time.Now()
	}
	used := ops.NewKeyUse()
	rt := engine.New(engine.Runtime{Catalog: cat, Data: st, Clock: now, KeyUsed: used.Touch})
	o := ops.New(rt, used.Get)

	h := new(Handler)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// handle_path /portal/*: the handler sees the path below /portal
		// and finds its base in the original request Caddy keeps.
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
			t.Errorf("%s %s: %v", r.Method, r.URL, err)
		}
	}))
	base := "http://" + srv.Listener.Addr().String()
	d := caddyfile.NewTestDispenser("platform_portal {\n" + strings.ReplaceAll(portalOptions, "{site}", base) + "\n}")
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	if err := h.setup(t.Context(), rt, o, zap.New(core)); err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return &env{t: t, dir: dir, base: srv.URL, rt: rt, ops: o, logs: logs, clock: func(fn func() time.Time) {
		if fn == nil {
			clock.Store(nil)
			return
		}
		clock.Store(&fn)
	}}
}
