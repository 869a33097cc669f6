package platformgw

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
)

// TestOutcomes: every invoke call is counted once under its outcome, charged
// or not: sync and async answers, refusals before anything is forwarded,
// a backend's 5xx, a backend not reached, a cut-off answer and a path the
// catalog does not know; and the counts reach the store exactly.
func TestOutcomes(t *testing.T) {
	g := newTestGateway(t)
	g.rt.Outcomes = engine.NewOutcomeCounter()
	fail := &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Millisecond) // a backend time to see in its histogram
		w.WriteHeader(http.StatusServiceUnavailable)
	}}
	silent := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return caddyhttp.Error(http.StatusBadGateway, errors.New("dial tcp: connection refused"))
	})
	cut := &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "0123456789")
		panic(http.ErrAbortHandler)
	}}
	accept := &backend{fn: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) }}

	g.invoke("alice", "POST", "call", false, ok(""))    // 2xx
	g.invoke("alice", "POST", "call", false, fail)      // 5xx from the backend
	g.invoke("alice", "POST", "call", false, ok(""))    // rate_limited: 2 calls a minute
	g.at = g.at.Add(time.Minute)                        // a new minute, the same hour
	g.invoke("alice", "POST", "call", false, silent)    // service_error
	g.invoke("expired", "POST", "call", false, ok(""))  // subscription_inactive
	g.invoke("stranger", "POST", "call", false, ok("")) // no key: invalid_key or the like
	g.invoke("owner", "POST", "job", true, accept)      // async 202
	g.invoke("owner", "POST", "job", false, ok(""))     // invalid_request: async only
	func() {
		defer func() { recover() }()
		g.invoke("reader", "GET", "call", false, cut) // cut_off
	}()
	r := httptest.NewRequest("GET", "/api/service/svc/endpoint/call/invoke/extra", nil)
	g.h.ServeHTTP(httptest.NewRecorder(), r, ok("")) // not_found

	st := g.rt.Store().(store.Outcomes)
	if err := g.rt.Outcomes.Flush(context.Background(), st, time.Now()); err != nil {
		t.Fatal(err)
	}
	got := map[[5]string]int64{}
	var backendCalls int64
	err := st.ScanOutcomes(context.Background(), store.OutcomeFilter{}, func(r store.OutcomeRow) error {
		got[[5]string{r.UserID, r.ServiceID, r.EndpointID, r.ProductID, r.Outcome}] += r.Calls
		if r.Outcome == store.Outcome5xx {
			for _, n := range r.Backend.Buckets {
				backendCalls += n
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	keyless := errorCode(t, g.invoke("stranger", "POST", "call", false, ok("")))
	want := map[[5]string]int64{
		{"alice", "svc", "call", "basic", "2xx"}:                1,
		{"alice", "svc", "call", "basic", "5xx"}:                1,
		{"alice", "svc", "call", "basic", "rate_limited"}:       1,
		{"alice", "svc", "call", "basic", "service_error"}:      1,
		{"expired", "svc", "call", "", "subscription_inactive"}: 1,
		{"", "", "", "", keyless}:                               1,
		{"owner", "svc", "job", "", "2xx"}:                      1,
		{"owner", "svc", "job", "", "invalid_request"}:          1,
		{"reader", "svc", "call", "bytes", store.OutcomeCutOff}: 1,
		{"", "", "", "", "not_found"}:                           1,
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%v: %d calls, want %d", k, got[k], n)
		}
	}
	for k, n := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%v: %d calls, which no call made", k, n)
		}
	}
	if backendCalls != 1 {
		t.Errorf("the backend's 5xx is in its histogram %d times, want 1", backendCalls)
	}
}

// TestOutcomeHour: a call counts in its UTC hour, by the runtime's clock.
func TestOutcomeHour(t *testing.T) {
	for _, tc := range []struct {
		at   time.Time
		want time.Time
	}{
		{time.Date(2026, 3, 1, 12, 59, 59, 0, time.UTC), time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)},
		{time.Date(2026, 3, 1, 13, 0, 0, 0, time.FixedZone("x", 5400)), time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)},
		{time.Date(1969, 12, 31, 23, 30, 0, 0, time.UTC), time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC)},
	} {
		if got := hourOf(tc.at); got != tc.want.Unix() {
			t.Errorf("hourOf(%v) = %v, want %v", tc.at, time.Unix(got, 0).UTC(), tc.want)
		}
	}
}

// BenchmarkEndCall is what a call's ending costs the gateway: the
// console's figures and the hourly outcome counted, for a caller seen
// before this hour (docs/performance.md, "Call outcomes"); cpu-ns/op is
// the process's CPU time per call:
//
//	go test -run '^$' -bench EndCall -benchmem ./internal/platformgw
func BenchmarkEndCall(b *testing.B) {
	rt := engine.New(engine.Runtime{Calls: new(engine.Calls), Outcomes: engine.NewOutcomeCounter()})
	h := new(Handler)
	h.init(rt, zap.NewNop())
	c := &call{started: time.Now(), svc: &catalog.Service{ID: "svc"}, ep: &catalog.Endpoint{ID: "call"},
		product: &billing.Product{ID: "basic"}}
	c.key.ID, c.key.UserID = "key-1", "alice"
	c.observed.status = http.StatusOK
	c.observed.backend = 3 * time.Millisecond
	var err error
	start := time.Now()
	b.ReportAllocs()
	cpu0 := processCPU()
	for b.Loop() {
		h.endCall(c, start, &err)
	}
	// CPU time, which a machine busy with other work does not inflate.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

// TestEndCallAllocs: ending a call of a caller seen before this hour
// allocates nothing.
func TestEndCallAllocs(t *testing.T) {
	rt := engine.New(engine.Runtime{Calls: new(engine.Calls), Outcomes: engine.NewOutcomeCounter()})
	h := new(Handler)
	h.init(rt, zap.NewNop())
	c := &call{started: time.Now(), svc: &catalog.Service{ID: "svc"}, ep: &catalog.Endpoint{ID: "call"}}
	c.key.ID, c.key.UserID = "key-1", "alice"
	c.code = "rate_limited"
	var err error
	h.endCall(c, time.Now(), &err)
	if n := testing.AllocsPerRun(200, func() { h.endCall(c, time.Now(), &err) }); n != 0 {
		t.Errorf("endCall allocates %v times a call, want 0", n)
	}
}
