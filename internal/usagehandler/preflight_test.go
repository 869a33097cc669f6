package usagehandler

import (
	"context"
	"encoding/json"
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
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

const (
	flightSecret       = "preflight-secret-0123456789abcdef"
	flightHiddenSecret = "preflight-hidden-0123456789abcdef"
)

// flightServer serves a Handler over loopback HTTP from a real bbolt
// store: service svc (a quota of 10 requests) and hidden, a service no
// caller is told of.
type flightServer struct {
	t   *testing.T
	url string
	at  time.Time
	hd  engine.Headers
	st  store.Store
}

func newFlightServer(t *testing.T) *flightServer {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return newFlightServerOn(t, st, time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
}

// Products of svc.
var (
	flightBasic = billing.Product{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		UnitLabel: "request", Quota: func() *billing.Units { q := billing.Whole(10); return &q }()}
	flightPrepaid = billing.Product{ID: "pre", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken,
		UnitLabel: "token", Price: billing.Whole(2)}
)

// newFlightServerOn serves from st, its clock stopped at at.
func newFlightServerOn(t *testing.T, st store.Store, at time.Time) *flightServer {
	t.Helper()
	basic, pre := flightBasic, flightPrepaid
	svc := &catalog.Service{
		ID: "svc", Backend: "http://127.0.0.1:9", Secrets: []string{flightSecret},
		Endpoints: []*catalog.Endpoint{{ID: "e"}},
		Products:  []*billing.Product{&basic, &pre},
	}
	hidden := &catalog.Service{
		ID: "hidden", Backend: "http://127.0.0.1:9", Secrets: []string{flightHiddenSecret},
		Endpoints: []*catalog.Endpoint{{ID: "e"}},
		Products: []*billing.Product{{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
			UnitLabel: "request"}},
	}
	cat, err := catalog.Compile([]*catalog.Service{svc, hidden}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &flightServer{t: t, at: at, hd: engine.NewHeaders("Platform"), st: st}
	rt := engine.New(engine.Runtime{
		Catalog: cat, Data: st, Clock: func() time.Time { return f.at },
		Limits: engine.Limits{UsageMaxBodyBytes: 1 << 16, ResultMaxBytes: 1 << 10, JobTTL: time.Hour,
			TimestampTolerance: time.Minute},
	})
	h := &Handler{rt: rt, logger: zap.NewNop()}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			http.NotFound(w, r)
			return nil
		}))
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// key makes a service key of user and subscribes the user to svc's
// product basic.
func (f *flightServer) key(user string) string {
	f.t.Helper()
	return f.keyFor(user, "basic")
}

func (f *flightServer) keyFor(user, product string) string {
	f.t.Helper()
	k, hash, err := servicekey.Generate()
	if err != nil {
		f.t.Fatal(err)
	}
	ctx := context.Background()
	if err := f.st.CreateKey(ctx, store.KeyRecord{ID: "key_" + user, Hash: hash, UserID: user, Created: f.at}); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.st.PutSubscription(ctx, store.Subscription{UserID: user, ServiceID: "svc", ProductID: product,
		Status: "ACTIVE", StartedAt: f.at.Add(-time.Hour), UpdatedAt: f.at}); err != nil {
		f.t.Fatal(err)
	}
	return k
}

// flightAnswer is an answer with its requestId taken out of the body, so
// that two answers can be compared byte for byte.
type flightAnswer struct {
	status int
	header http.Header
	body   string
}

// post sends body to path, signed with secret when it is not empty, with
// the header pairs given.
func (f *flightServer) post(path, body, secret string, header ...string) flightAnswer {
	f.t.Helper()
	req, err := http.NewRequest("POST", f.url+path, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	if secret != "" {
		ts := signing.Timestamp(f.at)
		req.Header.Set(f.hd.Timestamp, ts)
		req.Header.Set(f.hd.Signature, signing.Sign([]byte(secret), []byte(body), []byte(ts)))
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		f.t.Fatalf("%s: not a JSON object: %d %s", path, resp.StatusCode, raw)
	}
	delete(m, "requestId")
	out, _ := json.Marshal(m)
	return flightAnswer{status: resp.StatusCode, header: resp.Header, body: string(out)}
}

// TestUnknownServiceAnswersAsAWrongSignature: a request naming a service
// the catalog does not have is answered exactly as one naming a service
// that exists and did not sign it, message included, so that no caller
// without a secret can tell which service ids exist (docs/wire-contract.md:
// "so the catalog cannot be probed"). The billing estimate told them apart
// by its message, signed or not, and so did an unsigned report.
func TestUnknownServiceAnswersAsAWrongSignature(t *testing.T) {
	f := newFlightServer(t)
	f.key("alice")
	for _, route := range []struct{ name, path, body string }{
		{"billing estimate", "/api/v1/billing/usage/estimate", `{"userId":"alice","serviceId":"%s","estimatedUnits":1}`},
		{"report", "/api/usage/report", `{"userId":"alice","serviceId":"%s","unitsUsed":1,"timestamp":1772366400}`},
		{"estimate-usage", "/api/v1/service-keys/estimate-usage", `{"serviceKey":"psk_x","serviceId":"%s","estimatedUnits":1}`},
		{"validate", "/api/v1/service-keys/validate", `{"serviceKey":"psk_x","serviceId":"%s"}`},
		{"validate, serviceSecret", "/api/v1/service-keys/validate", `{"serviceKey":"psk_x","serviceId":"%s","serviceSecret":"guess"}`},
	} {
		for _, signed := range []struct {
			how, secret string
			header      []string
		}{
			{"unsigned", "", nil},
			{"signed", "a-secret-of-no-service-0123456789", nil},
			// A second signature line is refused as its own case, and
			// must not tell a known service from an unknown one either.
			{"signed twice", "a-secret-of-no-service-0123456789", []string{f.hd.Signature, "c2Vjb25k"}},
		} {
			body := func(service string) string { return strings.Replace(route.body, "%s", service, 1) }
			unknown := f.post(route.path, body("no-such-service"), signed.secret, signed.header...)
			for _, service := range []string{"svc", "hidden"} {
				known := f.post(route.path, body(service), signed.secret, signed.header...)
				if known.status != 401 || unknown.status != known.status || unknown.body != known.body {
					t.Errorf("%s, %s: unknown service %d %s, %s %d %s", route.name, signed.how,
						unknown.status, unknown.body, service, known.status, known.body)
				}
			}
		}
	}
}

// TestDuplicateFieldsRefused: a body that gives a field twice is refused,
// 400 invalid_request naming the field, and changes nothing, on every
// route of the usage service. encoding/json kept the last value: an
// estimate of {"estimatedUnits":1,"estimatedUnits":100} answered for 100,
// a report of {"unitsUsed":1,"unitsUsed":1000} charged 1000, where a proxy,
// a log or the backend's own reconciliation read the first. Names are
// compared as decoded, so an escape does not hide a repeat.
func TestDuplicateFieldsRefused(t *testing.T) {
	f := newFlightServer(t)
	k := f.key("alice")
	ctx := context.Background()
	for _, tc := range []struct{ path, body, field, bearer string }{
		{"/api/v1/service-keys/estimate-usage", `{"serviceKey":"` + k + `","serviceId":"svc","estimatedUnits":1,"estimatedUnits":100}`, "estimatedUnits", ""},
		{"/api/v1/service-keys/estimate-usage", `{"serviceKey":"` + k + `","serviceId":"svc","estimatedUnits":1,"estimated\u0055nits":100}`, "estimatedUnits", ""},
		{"/api/v1/service-keys/validate", `{"serviceKey":"psk_x","serviceKey":"` + k + `","serviceId":"svc"}`, "serviceKey", ""},
		{"/api/v1/service-keys/validate", `{"serviceId":"hidden","serviceKey":"` + k + `","serviceId":"svc"}`, "serviceId", ""},
		{"/api/v1/billing/usage/estimate", `{"userId":"alice","serviceId":"svc","estimatedUnits":1,"estimatedUnits":null}`, "estimatedUnits", ""},
		{"/api/v1/billing/usage/estimate", `{"userId":"bob","userId":"alice","serviceId":"svc","estimatedUnits":1}`, "userId", k},
		{"/api/usage/report", `{"userId":"alice","serviceId":"svc","unitsUsed":1,"unitsUsed":1000,"timestamp":1772366400}`, "unitsUsed", ""},
		{"/api/v1/service-keys/estimate-usage", `{"serviceKey":"` + k + `","serviceId":"svc","estimatedUnits":1,"":1,"":2}`, "body", ""},
		{"/api/v1/service-keys/estimate-usage", `{"serviceKey":"` + k + `","serviceId":"svc","estimatedUnits":1,"a\u0000":1,"a\u0000":2}`, "body", ""},
	} {
		secret := flightSecret
		var header []string
		if tc.bearer != "" {
			secret, header = "", []string{"Authorization", "Bearer " + tc.bearer}
		}
		a := f.post(tc.path, tc.body, secret, header...)
		var e struct{ Code, Field string }
		json.Unmarshal([]byte(a.body), &e)
		if a.status != 400 || e.Code != "invalid_request" || e.Field != tc.field {
			t.Errorf("%s %s: %d %s, want 400 invalid_request field %s", tc.path, tc.body, a.status, a.body, tc.field)
		}
	}
	st, err := f.st.State(ctx, store.Account{UserID: "alice", ServiceID: "svc", Product: billing.Product{ID: "basic",
		BillingModel: billing.Subscription, MeasurementType: billing.PerRequest}}, f.at)
	if err != nil || st.Used != 0 || st.Reserved != 0 {
		t.Errorf("state after the refusals: %+v %v, want nothing used", st, err)
	}
	// A field given once, with unknown fields and nulls around it, is read.
	a := f.post("/api/v1/service-keys/estimate-usage", `{"serviceKey":"`+k+`","serviceId":"svc","estimatedUnits":2,"x":1,"X":2,"extra":null}`, flightSecret)
	if a.status != 200 {
		t.Errorf("a body without repeats: %d %s", a.status, a.body)
	}
}

// TestEstimateSameOnBothStores: the two estimates answer alike, to the
// byte, from the embedded store and from PostgreSQL, with calls and a job
// in flight holding part of a quota and of a prepaid balance: both
// stores count what the holds take, so an estimate allows exactly what
// the next call's hold would get.
func TestEstimateSameOnBothStores(t *testing.T) {
	at := time.Now().UTC().Truncate(time.Second)
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	pg, err := pgstore.Open(context.Background(), pgstore.Options{DSN: pgtest.DB(t), NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	type answers map[string]flightAnswer
	run := func(st store.Store) answers {
		f := newFlightServerOn(t, st, at)
		ctx := context.Background()
		keys := map[string]string{"alice": f.keyFor("alice", "basic"), "bob": f.keyFor("bob", "pre")}
		if _, err := st.AddCredits(ctx, "bob", "svc", billing.Whole(10), at); err != nil {
			t.Fatal(err)
		}
		alice := store.Account{UserID: "alice", ServiceID: "svc", Product: flightBasic}
		bob := store.Account{UserID: "bob", ServiceID: "svc", Product: flightPrepaid}
		if _, err := st.Record(ctx, alice, store.LedgerEntry{Time: at, UserID: "alice", ServiceID: "svc", ProductID: "basic",
			Units: billing.Whole(3), Source: store.SourceReport}, func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
			t.Fatal(err)
		}
		for _, h := range []struct {
			a     store.Account
			units int64
			job   string
		}{{alice, 4, ""}, {alice, 2, "job-a"}, {bob, 1, ""}, {bob, 1, "job-b"}} {
			var res store.Reservation
			var err error
			if h.job == "" {
				res, err = st.Reserve(ctx, h.a, billing.Whole(h.units), at)
			} else {
				res, err = st.CreateJobReserved(ctx, store.Job{ID: h.job, UserID: h.a.UserID, ServiceID: "svc", EndpointID: "e",
					ProductID: h.a.Product.ID, Status: "PENDING", CreatedAt: at, UpdatedAt: at, ExpiresAt: at.Add(time.Hour)},
					h.a, billing.Whole(h.units), at)
			}
			if err != nil || !res.Decision.Allowed {
				t.Fatalf("hold %+v: %+v %v", h, res.Decision, err)
			}
		}
		out := answers{}
		for _, user := range []string{"alice", "bob"} {
			for _, n := range []string{"0", "1", "1.5", "2", "3", "4"} {
				a := f.post("/api/v1/service-keys/estimate-usage", `{"serviceKey":"`+keys[user]+`","serviceId":"svc","estimatedUnits":`+n+`}`, flightSecret)
				out["key "+user+" "+n] = a
				a = f.post("/api/v1/billing/usage/estimate", `{"userId":"`+user+`","serviceId":"svc","estimatedUnits":`+n+`}`, flightSecret)
				out["user "+user+" "+n] = a
			}
		}
		return out
	}
	onBolt, onPG := run(bolt), run(pg)
	for name, b := range onBolt {
		p := onPG[name]
		if b.status != p.status || b.body != p.body || b.header.Get("Retry-After") != p.header.Get("Retry-After") {
			t.Errorf("%s:\n bbolt      %d %s\n PostgreSQL %d %s", name, b.status, b.body, p.status, p.body)
		}
	}
	// The holds count: 3 used and 6 held of alice's 10 leave 1; bob's 10
	// credits less 4 held buy 3 tokens at 2.
	for name, want := range map[string]int{"key alice 1": 200, "key alice 1.5": 429, "key bob 3": 200, "key bob 4": 403} {
		if got := onBolt[name].status; got != want {
			t.Errorf("%s: %d %s, want %d", name, got, onBolt[name].body, want)
		}
	}
}
