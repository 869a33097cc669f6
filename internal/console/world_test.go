package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// world is a console over a store with a month of life in it, for the
// browser tests of the pages: requests and tokens on two services, limits
// near and past, a balance at zero, a pending alert, jobs in each state,
// changes in the audit log.
type world struct {
	*env
	url string // the console, http://127.0.0.1:port/console
	now time.Time
}

// worldCatalog is the catalog of the world: weather (requests: basic
// with a quota, credits prepaid, capped billed per call up to a cap) and
// writer (tokens). quota and spendCap vary: the usage is recorded under
// roomy limits and read under tight ones, as after an operator lowered a
// product's quota (which is how a subscription ends up at 133%).
func worldCatalog(t *testing.T, quota, spendCap int64) *catalog.Catalog {
	t.Helper()
	q, c := billing.Whole(quota), billing.Whole(spendCap)
	weather := &catalog.Service{
		ID: "weather", Backend: "http://127.0.0.1:9", Secrets: []string{testSecret},
		Endpoints: []*catalog.Endpoint{{ID: "hello", Methods: []string{"GET", "POST"}, Path: "/hello"}, {ID: "forecast", Path: "/forecast"}},
		Products: []*billing.Product{
			{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request",
				Quota: &q, Period: "month", Overage: "block"},
			{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, UnitLabel: "request",
				Price: billing.Whole(1) / 2},
			{ID: "capped", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, UnitLabel: "request",
				Price: billing.Whole(1), SpendingCap: &c},
		},
		// capped is sold in euros, tokens in dollars (below): the pages
		// show money per currency, never summed across them or with credits.
		ProductListings: []*catalog.ProductListing{{Product: "capped", Currency: "EUR"}},
	}
	writer := &catalog.Service{
		ID: "writer", Backend: "http://127.0.0.1:9", Secrets: []string{testSecret},
		Endpoints: []*catalog.Endpoint{{ID: "draft", Path: "/draft"}},
		Products: []*billing.Product{
			{ID: "tokens", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken, UnitLabel: "token",
				Price: billing.Whole(1) / 1000},
		},
		ProductListings: []*catalog.ProductListing{{Product: "tokens", Currency: "USD"}},
	}
	cat, err := catalog.Compile([]*catalog.Service{weather, writer}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

func newWorld(t *testing.T) *world {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	used := ops.NewKeyUse()
	roomy := engine.New(engine.Runtime{Catalog: worldCatalog(t, 1000, 1000), Data: st, KeyUsed: used.Touch, Calls: new(engine.Calls)})
	seed := ops.New(roomy, used.Get)
	bg := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []struct{ user, service, product string }{
		{"alice", "weather", "basic"}, {"carol", "weather", "basic"}, {"erin", "weather", "capped"},
		{"bob", "writer", "tokens"}, {"dave", "weather", "basic"},
	} {
		_, err := seed.PutSubscription(bg, "console:operator", s.user, s.service, s.product, "ACTIVE")
		must(err)
	}
	// dave moves to prepaid credits, gets 5 and has them taken back: a
	// balance at zero, and changes with a before and an after.
	_, err = seed.PutSubscription(bg, "admin-api 10.0.0.7:5100", "dave", "weather", "credits", "ACTIVE")
	must(err)
	_, err = seed.AddCredits(bg, "console:operator", "dave", "weather", billing.Whole(5))
	must(err)
	_, err = seed.AddCredits(bg, "console:operator", "dave", "weather", billing.Whole(-5))
	must(err)
	for _, u := range []string{"alice", "bob", "dave"} {
		_, err := seed.CreateKey(bg, "console:operator", ops.CreateKeyRequest{UserID: u, Label: u + "'s laptop"})
		must(err)
	}
	// After the subscriptions started, so their periods hold the calls.
	now := time.Now().UTC()
	call := func(user, service, endpoint, product string, units int64, at time.Time) {
		t.Helper()
		svc, _ := roomy.Catalog.Service(service)
		p, _ := svc.Product(product)
		a := store.Account{UserID: user, ServiceID: service, Product: *p}
		res, err := st.Reserve(bg, a, billing.Whole(1), now)
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("hold for %s: %v %+v", user, err, res.Decision)
		}
		_, err = st.Settle(bg, res, billing.Whole(units), store.LedgerEntry{Time: at, UserID: user,
			ServiceID: service, EndpointID: endpoint, ProductID: product, Source: store.SourceGateway})
		must(err)
	}
	// The ledger's times only go forward: the oldest calls first.
	for i, n := range []int64{1500, 900, 2400} {
		call("bob", "writer", "draft", "tokens", n, now.Add(time.Duration(i-2)*26*time.Hour))
	}
	call("alice", "weather", "hello", "basic", 100, now)
	call("alice", "weather", "forecast", "basic", 33, now)
	call("carol", "weather", "hello", "basic", 85, now)
	call("erin", "weather", "hello", "capped", 10, now)
	// This hour's call outcomes, as the gateway counts them: weather's
	// backend fails 12 of its 192 calls (6%: failing), writer's 1 of 51;
	// refusals for rate and quota. The latencies put the gateway's p50 at
	// 100µs and p99 at 2.5ms, the backends' at 25ms and 1s.
	hour := now.Truncate(time.Hour)
	outcome := func(user, service, endpoint, code string, gateway, backend map[int]int64) store.OutcomeRow {
		r := store.OutcomeRow{OutcomeKey: store.OutcomeKey{Hour: hour, UserID: user, ServiceID: service, EndpointID: endpoint, Outcome: code}}
		for b, n := range gateway {
			r.Calls += n
			r.Gateway.Buckets[b] += n
		}
		for b, n := range backend {
			r.Backend.Buckets[b] += n
		}
		return r
	}
	_, err = st.AddOutcomes(bg, store.OutcomeBatch{Writer: "world", Seq: 1, Rows: []store.OutcomeRow{
		outcome("alice", "weather", "hello", store.Outcome2xx, map[int]int64{1: 170, 5: 10}, map[int]int64{8: 170, 11: 10}),
		outcome("carol", "weather", "hello", store.Outcome5xx, map[int]int64{1: 12}, map[int]int64{13: 12}),
		outcome("alice", "weather", "hello", apierror.RateLimited, map[int]int64{0: 9}, nil),
		outcome("alice", "weather", "forecast", apierror.QuotaExceeded, map[int]int64{0: 4}, nil),
		outcome("bob", "writer", "draft", store.Outcome2xx, map[int]int64{1: 50}, map[int]int64{10: 50}),
		outcome("bob", "writer", "draft", store.Outcome5xx, map[int]int64{1: 1}, map[int]int64{9: 1}),
	}})
	must(err)
	must2 := func(_ store.Alert, err error) { must(err) }
	must2(st.CreateAlert(bg, store.Alert{UserID: "carol", ServiceID: "weather", ProductID: "basic", PeriodStart: now.Add(-time.Hour),
		Threshold: "quota 80%", Value: billing.Whole(85), Limit: billing.Whole(100), Created: now, Status: "PENDING", NextAttempt: now.Add(time.Minute)}))
	long := strings.Repeat("0123456789abcdef", 4000) // 64 KB on one line
	for _, j := range []store.Job{
		{ID: "job-1", UserID: "alice", ServiceID: "weather", EndpointID: "forecast", ProductID: "basic", Status: store.JobCompleted,
			PercentageComplete: 100, CreatedAt: now.Add(-3 * time.Hour), UpdatedAt: now.Add(-170 * time.Minute),
			CompletedAt: now.Add(-170 * time.Minute), ExpiresAt: now.Add(time.Hour), Result: long, ResultSize: len(long), ContentType: "text/plain"},
		{ID: "job-2", UserID: "bob", ServiceID: "writer", EndpointID: "draft", ProductID: "tokens", Status: store.JobRunning, Stage: "outline",
			PercentageComplete: 30, CreatedAt: now.Add(-2 * time.Hour), UpdatedAt: now.Add(-time.Hour), ExpiresAt: now.Add(time.Hour)},
		{ID: "job-3", UserID: "alice", ServiceID: "weather", EndpointID: "forecast", ProductID: "basic", Status: store.JobFailed,
			ErrorMessage: "backend timed out after 30s", CreatedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-50 * time.Minute),
			CompletedAt: now.Add(-50 * time.Minute), ExpiresAt: now.Add(time.Hour)},
	} {
		must(st.CreateJob(bg, j))
	}
	// The console reads it all under the tight limits: alice's quota of
	// 100 is at 133%, carol's at 85%, erin's cap of 10 at 100%.
	rt := engine.New(engine.Runtime{Catalog: worldCatalog(t, 100, 10), Data: st, KeyUsed: used.Touch, Calls: new(engine.Calls)})
	e := &env{rt: rt, ops: ops.New(rt, used.Get)}
	h := direct(t, e, false)
	return &world{env: e, url: consoleServer(t, h), now: now}
}

// consoleServer serves h under /console as Caddy would, with the
// operator signed in, and returns the console's URL.
func consoleServer(t *testing.T, h *Handler) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/console") {
			// The browser's /favicon.ico is not the console's, as under
			// Caddy's handle /console*: served by it, it would set a new
			// CSRF cookie over the page's.
			http.NotFound(w, r)
			return
		}
		repl := caddy.NewReplacer()
		repl.Set("http.auth.user.id", testOperator) // as basic_auth signs one in
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)), nil)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/console"
}
