package platformgw

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// The invoke path in process, without a Caddy server: a Handler serving
// from an engine.Runtime around a real bbolt store in a temp dir, driven
// through ServeHTTP with httptest, and a stand-in for reverse_proxy (the
// next handler) that answers as a backend would.

// testGateway is a handler, its runtime and the keys of its users.
type testGateway struct {
	t    *testing.T
	h    *Handler
	rt   *engine.Runtime
	at   time.Time
	keys map[string]string // user → service key
}

// The catalog: service svc, owned by "owner", with a plain endpoint, an
// async-only one and an async one that also answers sync; products basic
// (per request, quota 100 a month, 2 calls a minute) and bytes (per byte).
func newTestGateway(t *testing.T) *testGateway {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	quota, big := billing.Whole(100), billing.Whole(1_000_000)
	svc := &catalog.Service{
		ID: "svc", Backend: "http://127.0.0.1:9", Secrets: []string{"test-secret-0123456789abcdef0123"},
		Owners: []string{"owner"},
		Endpoints: []*catalog.Endpoint{
			{ID: "call", Methods: []string{"GET", "POST"}},
			{ID: "job", Async: true, AsyncOnly: true},
			{ID: "either", Async: true},
		},
		Products: []*billing.Product{
			{ID: "basic", BillingModel: "SUBSCRIPTION", MeasurementType: billing.PerRequest, UnitLabel: "request",
				Quota: &quota, RateLimit: &billing.RateLimit{Requests: 2, WindowSeconds: 60}},
			{ID: "bytes", BillingModel: "SUBSCRIPTION", MeasurementType: billing.PerByte, UnitLabel: "byte", Quota: &big},
		},
	}
	cat, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := &testGateway{t: t, at: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), keys: map[string]string{}}
	g.rt = engine.New(engine.Runtime{
		Catalog:   cat,
		Data:      st,
		Clock:     func() time.Time { return g.at },
		PublicURL: "https://gw.example",
		Limits:    engine.Limits{MaxBodyBytes: 1 << 10, JobTTL: time.Hour},
	})
	g.h = new(Handler)
	g.h.init(g.rt, zap.NewNop())
	ctx := context.Background()
	subs := map[string]string{ // user → product and status
		"alice": "basic ACTIVE", "trial": "basic TRIAL", "cancelling": "basic CANCELLING",
		"pending": "basic CANCELLING_PENDING", "expired": "basic EXPIRED", "cancelled": "basic CANCELLED",
		"suspended": "basic SUSPENDED", "reader": "bytes ACTIVE", "gone": "retired ACTIVE",
	}
	for _, user := range []string{"alice", "trial", "cancelling", "pending", "expired", "cancelled", "suspended", "reader", "gone", "nobody", "owner"} {
		key, hash, err := servicekey.Generate()
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CreateKey(ctx, store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: user, Created: g.at}); err != nil {
			t.Fatal(err)
		}
		g.keys[user] = key
		if sub, ok := subs[user]; ok {
			product, status, _ := strings.Cut(sub, " ")
			if _, err := st.PutSubscription(ctx, store.Subscription{UserID: user, ServiceID: "svc", ProductID: product,
				Status: status, StartedAt: g.at.Add(-time.Hour)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return g
}

// backend stands in for reverse_proxy: it answers as fn does and counts
// the requests that reached it.
type backend struct {
	calls int
	fn    func(w http.ResponseWriter, r *http.Request)
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	b.calls++
	b.fn(w, r)
	return nil
}

// ok answers 200 with a small JSON body, and the units header when given.
func ok(units string) *backend {
	return &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		if units != "" {
			w.Header().Set("X-Platform-Units", units)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}}
}

// invoke sends one call of user to endpoint (async: /invoke/async).
func (g *testGateway) invoke(user, method, endpoint string, async bool, next caddyhttp.Handler) *httptest.ResponseRecorder {
	g.t.Helper()
	path := "/api/service/svc/endpoint/" + endpoint + "/invoke"
	if async {
		path += "/async"
	}
	r := httptest.NewRequest(method, path, strings.NewReader(`{"q":1}`))
	if key, ok := g.keys[user]; ok {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	w := httptest.NewRecorder()
	if err := g.h.ServeHTTP(w, r, next); err != nil {
		g.t.Fatalf("ServeHTTP: %v", err)
	}
	return w
}

// ledger is what user was charged, entry by entry, in units.
func (g *testGateway) ledger(user string) []billing.Units {
	g.t.Helper()
	var out []billing.Units
	err := g.rt.Store().ScanLedger(context.Background(), store.LedgerFilter{UserID: user}, func(e store.LedgerEntry) error {
		out = append(out, e.Units)
		return nil
	})
	if err != nil {
		g.t.Fatal(err)
	}
	return out
}

// state is user's period state under product.
func (g *testGateway) state(user, product string) billing.State {
	g.t.Helper()
	svc, _ := g.rt.Catalog.Service("svc")
	p, _ := svc.Product(product)
	st, err := g.rt.Store().State(context.Background(), store.Account{UserID: user, ServiceID: "svc", Product: *p}, g.at)
	if err != nil {
		g.t.Fatal(err)
	}
	return st
}

func errorCode(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	body := w.Body.String()
	_, rest, found := strings.Cut(body, `"code":"`)
	if !found {
		return ""
	}
	code, _, _ := strings.Cut(rest, `"`)
	return code
}

// TestAdmission: who is let through to the backend, and with which error
// the others are refused before anything is forwarded or charged.
func TestAdmission(t *testing.T) {
	g := newTestGateway(t)
	tests := []struct {
		user, method, endpoint string
		async                  bool
		status                 int
		code                   string
	}{
		{"alice", "POST", "call", false, 200, ""},
		{"trial", "POST", "call", false, 200, ""},
		{"cancelling", "POST", "call", false, 200, ""},
		{"pending", "POST", "call", false, 200, ""},
		{"owner", "POST", "call", false, 200, ""}, // no subscription: the owner calls free
		{"expired", "POST", "call", false, 403, "subscription_inactive"},
		{"cancelled", "POST", "call", false, 403, "subscription_inactive"},
		{"suspended", "POST", "call", false, 403, "subscription_inactive"},
		{"gone", "POST", "call", false, 403, "subscription_inactive"}, // a product the catalog no longer offers
		{"nobody", "POST", "call", false, 403, "no_subscription"},
		{"stranger", "POST", "call", false, 401, "missing_key"},
		{"trial", "DELETE", "call", false, 405, "method_not_allowed"},
		{"trial", "POST", "nope", false, 404, "endpoint_not_found"},
		{"trial", "POST", "job", false, 400, "invalid_request"},    // async only: refused, not forwarded and charged
		{"trial", "POST", "call", true, 404, "endpoint_not_found"}, // not asynchronous
	}
	for _, tt := range tests {
		be := ok("")
		w := g.invoke(tt.user, tt.method, tt.endpoint, tt.async, be)
		if w.Code != tt.status || errorCode(t, w) != tt.code {
			t.Errorf("%s %s %s async=%v: %d %s, want %d %s", tt.user, tt.method, tt.endpoint, tt.async, w.Code, w.Body, tt.status, tt.code)
		}
		if forwarded := be.calls > 0; forwarded != (tt.status == 200) {
			t.Errorf("%s %s: forwarded %v with status %d", tt.user, tt.endpoint, forwarded, w.Code)
		}
		if w.Header().Get("X-Platform-Request-ID") == "" {
			t.Errorf("%s %s: no request id header", tt.user, tt.endpoint)
		}
	}
	// The owner's call is in the ledger, with no product, never counted.
	if got := g.ledger("owner"); len(got) != 1 {
		t.Errorf("owner's ledger: %v", got)
	}
	for _, user := range []string{"expired", "nobody", "suspended"} {
		if got := g.ledger(user); len(got) != 0 {
			t.Errorf("%s was charged %v", user, got)
		}
	}
}

// TestAdmissionAsyncOnly: the async-only endpoint takes /invoke/async,
// answers 202 with the job's URLs, and the job holds the call's cost.
func TestAdmissionAsyncOnly(t *testing.T) {
	g := newTestGateway(t)
	be := &backend{fn: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) }}
	w := g.invoke("alice", "POST", "job", true, be)
	if w.Code != http.StatusAccepted || be.calls != 1 {
		t.Fatalf("async: %d %s, backend called %d times", w.Code, w.Body, be.calls)
	}
	id := w.Header().Get("X-Platform-Request-ID")
	if loc := w.Header().Get("Location"); loc != "https://gw.example/api/requests/"+id+"/status" {
		t.Errorf("Location %q", loc)
	}
	job, err := g.rt.Store().GetJob(context.Background(), id)
	if err != nil || job.Status != store.JobPending || !job.ExpiresAt.Equal(g.at.Add(time.Hour)) {
		t.Errorf("job %+v %v", job, err)
	}
	if st := g.state("alice", "basic"); st.Reserved != billing.Whole(1) || st.Used != 0 {
		t.Errorf("the job's hold: %+v", st)
	}
}

// TestRateLimit: the token bucket of basic (2 a minute, burst 2) refuses
// the third call with 429, Retry-After and the RateLimit headers, and
// lets one through again when a token is back.
func TestRateLimit(t *testing.T) {
	g := newTestGateway(t)
	want := []struct {
		status int
		state  string
	}{
		{200, `"quota";r=99;t=2674800, "rate";r=1;t=30`}, // the period ends a month after the start, 11:00
		{200, `"quota";r=98;t=2674800, "rate";r=0;t=30`},
	}
	for i, wt := range want {
		w := g.invoke("alice", "POST", "call", false, ok(""))
		if w.Code != wt.status {
			t.Fatalf("call %d: %d %s", i+1, w.Code, w.Body)
		}
		if got := w.Header().Get("RateLimit"); got != wt.state {
			t.Errorf("call %d: RateLimit %q, want %s", i+1, got, wt.state)
		}
		if pol := w.Header().Get("RateLimit-Policy"); !strings.Contains(pol, `"rate";q=2;w=60`) {
			t.Errorf("call %d: RateLimit-Policy %q", i+1, pol)
		}
	}
	w := g.invoke("alice", "POST", "call", false, ok(""))
	if w.Code != 429 || errorCode(t, w) != "rate_limited" || w.Header().Get("Retry-After") != "30" {
		t.Errorf("over the limit: %d %s Retry-After %q", w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	// Refused before the quota is looked at: the bucket alone.
	if got := w.Header().Get("RateLimit"); got != `"rate";r=0;t=30` {
		t.Errorf("refused: RateLimit %q", got)
	}
	g.at = g.at.Add(30 * time.Second)
	if w := g.invoke("alice", "POST", "call", false, ok("")); w.Code != 200 {
		t.Errorf("a token later: %d %s", w.Code, w.Body)
	}
	if got := g.ledger("alice"); len(got) != 3 {
		t.Errorf("charged %v, want 3 calls", got)
	}
}

// TestMeterUnitsHeader: the backend's X-Platform-Units decides the charge
// and never reaches the caller; a malformed one is ignored (the endpoint's
// cost is charged).
func TestMeterUnitsHeader(t *testing.T) {
	g := newTestGateway(t)
	for _, tt := range []struct {
		units string
		want  billing.Units
	}{
		{"3", billing.Whole(3)},
		{"0.5", billing.Whole(1) / 2},
		{"many", billing.Whole(1)},
		{"", billing.Whole(1)},
	} {
		g.at = g.at.Add(time.Minute) // a fresh token each call
		w := g.invoke("alice", "POST", "call", false, ok(tt.units))
		if w.Code != 200 || w.Body.String() != `{"ok":true}` {
			t.Fatalf("units %q: %d %s", tt.units, w.Code, w.Body)
		}
		if v, found := w.Header()["X-Platform-Units"]; found {
			t.Errorf("units %q: the header reached the caller: %q", tt.units, v)
		}
		l := g.ledger("alice")
		if got := l[len(l)-1]; got != tt.want {
			t.Errorf("units %q: charged %v, want %v", tt.units, got, tt.want)
		}
	}
	if st := g.state("alice", "basic"); st.Reserved != 0 {
		t.Errorf("holds left: %+v", st)
	}
}

// TestMeterServerError: a backend's 5xx reaches the caller as it is, and
// is not charged; the hold is released. A backend that never answers is
// a 502 service_error, not charged either.
func TestMeterServerError(t *testing.T) {
	g := newTestGateway(t)
	be := &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Platform-Units", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "down")
	}}
	w := g.invoke("alice", "POST", "call", false, be)
	if w.Code != http.StatusServiceUnavailable || w.Body.String() != "down" || w.Header().Get("X-Platform-Units") != "" {
		t.Errorf("5xx: %d %q %v", w.Code, w.Body, w.Header())
	}
	silent := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return caddyhttp.Error(http.StatusBadGateway, errors.New("dial tcp: connection refused"))
	})
	g.at = g.at.Add(time.Minute)
	if w := g.invoke("alice", "POST", "call", false, silent); w.Code != http.StatusBadGateway || errorCode(t, w) != "service_error" {
		t.Errorf("unreachable: %d %s", w.Code, w.Body)
	}
	if got := g.ledger("alice"); len(got) != 0 {
		t.Errorf("charged %v for failed calls", got)
	}
	if st := g.state("alice", "basic"); st.Reserved != 0 || st.Used != 0 {
		t.Errorf("after failed calls: %+v", st)
	}
}

// TestMeterCutOff: a PER_BYTE answer the proxy aborts mid-body (it panics
// with http.ErrAbortHandler) is settled with the bytes that reached the
// caller, the hold released, and the abort goes on to the server.
func TestMeterCutOff(t *testing.T) {
	g := newTestGateway(t)
	be := &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "0123456789")
		panic(http.ErrAbortHandler)
	}}
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("recovered %v, want the abort to go on", v)
			}
		}()
		g.invoke("reader", "GET", "call", false, be)
	}()
	if got := g.ledger("reader"); len(got) != 1 || got[0] != billing.Whole(10) {
		t.Errorf("charged %v, want the 10 bytes delivered", got)
	}
	if st := g.state("reader", "bytes"); st.Reserved != 0 || st.Used != billing.Whole(10) {
		t.Errorf("after the cut: %+v", st)
	}
	// A whole PER_BYTE answer is charged its length.
	w := g.invoke("reader", "GET", "call", false, ok(""))
	if l := g.ledger("reader"); w.Code != 200 || len(l) != 2 || l[1] != billing.Whole(int64(len(`{"ok":true}`))) {
		t.Errorf("whole answer: %d, ledger %v", w.Code, l)
	}
}

// TestMeterStoreFailure: a settlement the store cannot write withholds the
// backend's answer (500, "not charged") and leaves no hold behind.
func TestMeterStoreFailure(t *testing.T) {
	g := newTestGateway(t)
	be := &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		g.rt.Store().Close() // the store goes away while the call is out
		io.WriteString(w, `{"secret":"answer"}`)
	}}
	w := g.invoke("alice", "POST", "call", false, be)
	if w.Code != http.StatusInternalServerError || strings.Contains(w.Body.String(), "answer") {
		t.Errorf("unsettled call: %d %s", w.Code, w.Body)
	}
}

// TestAdmissionEndsAtTheEnd: a trial and a cancellation with an end are
// let through up to it and refused from it, by the runtime's clock, with
// the status they end in, whatever the stored status still says (no sweep
// has run); an operator's put without an end lets the caller back in.
func TestAdmissionEndsAtTheEnd(t *testing.T) {
	g := newTestGateway(t)
	ctx := context.Background()
	st := g.rt.Subscriptions()
	end := g.at.Add(time.Hour)
	for user, endStatus := range map[string]string{"trial": "EXPIRED", "cancelling": "CANCELLED"} {
		cur, err := st.GetSubscription(ctx, user, "svc")
		if err != nil {
			t.Fatal(err)
		}
		cur.EndsAt, cur.EndStatus = end, endStatus
		if _, err := st.PutSubscription(ctx, cur); err != nil {
			t.Fatal(err)
		}
	}
	g.at = end.Add(-time.Nanosecond)
	for _, user := range []string{"trial", "cancelling"} {
		if w := g.invoke(user, "POST", "call", false, ok("")); w.Code != 200 {
			t.Errorf("%s just before the end: %d %s", user, w.Code, w.Body)
		}
	}
	for _, at := range []time.Time{end, end.Add(24 * time.Hour)} {
		g.at = at
		for user, status := range map[string]string{"trial": "EXPIRED", "cancelling": "CANCELLED"} {
			be := ok("")
			w := g.invoke(user, "POST", "call", false, be)
			if w.Code != 403 || errorCode(t, w) != "subscription_inactive" ||
				!strings.Contains(w.Body.String(), "the subscription is "+status) || be.calls != 0 {
				t.Errorf("%s %s after the end: %d %s, forwarded %d", user, at.Sub(end), w.Code, w.Body, be.calls)
			}
		}
	}
	if got := g.ledger("trial"); len(got) != 1 {
		t.Errorf("trial's ledger: %v, want the one call before the end", got)
	}
	// An operator sets ACTIVE: the put carries no end, so the end is gone.
	if _, err := st.PutSubscription(ctx, store.Subscription{UserID: "trial", ServiceID: "svc", ProductID: "basic",
		Status: "ACTIVE", UpdatedAt: g.at}); err != nil {
		t.Fatal(err)
	}
	if w := g.invoke("trial", "POST", "call", false, ok("")); w.Code != 200 {
		t.Errorf("after an operator's ACTIVE: %d %s", w.Code, w.Body)
	}
}
