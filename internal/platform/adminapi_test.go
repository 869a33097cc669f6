package platform

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// admPort is the admin port of the in-process server: caddytest's 2999,
// or E2E_ADMIN_PORT, so two test processes on one machine (two worktrees,
// say) do not talk to each other's server.
var admPort = func() int {
	if v, err := strconv.Atoi(os.Getenv("E2E_ADMIN_PORT")); err == nil && v > 0 {
		return v
	}
	return 2999
}()

// admAddr is the admin endpoint every caddytest config listens on.
var admAddr = fmt.Sprintf("localhost:%d", admPort)

func admTester(t *testing.T) *caddytest.Tester {
	return caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: admPort})
}

// admEnv is a running server with the platform app on a fresh bbolt file.
type admEnv struct {
	t       *testing.T
	dbPath  string
	logPath string
	app     *App
}

// admStart loads a config with the platform app (one service, two
// products) and an HTTP server on a free loopback port into the in-process
// Caddy of caddytest.
func admStart(t *testing.T) *admEnv {
	t.Helper()
	env := &admEnv{t: t}
	config := env.config(t.TempDir(), "")
	tester := admTester(t)
	tester.InitServer(config, "json")
	if t.Failed() {
		t.FailNow()
	}
	env.app = admActiveApp(t)
	t.Cleanup(env.stop)
	return env
}

func admActiveApp(t *testing.T) *App {
	t.Helper()
	appIface, err := caddy.ActiveContext().App("platform")
	if err != nil {
		t.Fatalf("platform app: %v", err)
	}
	return appIface.(*App)
}

// config returns the JSON config of the test server with its files under
// dir and extraProducts appended to the service's products.
func (e *admEnv) config(dir, extraProducts string) string {
	t := e.t
	dbPath := filepath.Join(dir, "platform.db")
	logPath := filepath.Join(dir, "caddy.log")
	e.dbPath, e.logPath = dbPath, logPath
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dbJSON, _ := json.Marshal(dbPath)
	logJSON, _ := json.Marshal(logPath)
	config := fmt.Sprintf(`{
		"admin": {"listen": %q},
		"logging": {"logs": {"default": {"level": "DEBUG", "writer": {"output": "file", "filename": %s}}}},
		"apps": {
			"platform": {
				"store": %s,
				"services": [{
					"id": "weather",
					"backend": "http://127.0.0.1:1",
					"secrets": ["0123456789abcdef0123456789abcdef"],
					"endpoints": [{"id": "forecast"}],
					"products": [
						{"id": "basic", "billing_model": "PREPAID", "measurement_type": "PER_REQUEST", "unit_label": "request", "price": 0.5},
						{"id": "pro", "billing_model": "SUBSCRIPTION", "measurement_type": "PER_REQUEST", "quota": 1000}%s
					]
				}]
			},
			"http": {"servers": {"srv0": {
				"listen": ["127.0.0.1:%d"],
				"routes": [{"handle": [{"handler": "static_response", "body": "ok"}]}]
			}}}
		}
	}`, admAddr, logJSON, dbJSON, extraProducts, port)
	return config
}

// load posts a config to /load and returns the status and body.
func admLoad(t *testing.T, config string) (int, string) {
	t.Helper()
	// Caddy restarts its admin server when a load changes the admin
	// config, and a connection kept alive from the previous call may be
	// closed under the request (EOF before any answer): loading the same
	// config again is harmless, so a transport error is retried.
	var resp *http.Response
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		resp, err = http.Post("http://"+admAddr+"/load", "application/json", strings.NewReader(config))
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("loading a config: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// stop loads a config without the platform app, which releases and closes
// the store file.
func (e *admEnv) stop() {
	e.t.Helper()
	if status, body := admLoad(e.t, fmt.Sprintf(`{"admin": {"listen": %q}}`, admAddr)); status != http.StatusOK {
		e.t.Fatalf("loading the empty config: %d %s", status, body)
	}
}

// admResponse is an admin API answer.
type admResponse struct {
	status int
	header http.Header
	body   []byte
}

func (r admResponse) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
}

// admDo sends a request to the admin API over real HTTP.
func admDo(t *testing.T, method, path string, body io.Reader) admResponse {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+admAddr+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return admResponse{status: resp.StatusCode, header: resp.Header, body: b}
}

func admJSON(t *testing.T, method, path, body string) admResponse {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	return admDo(t, method, path, rd)
}

// admExpectError checks that r is the gateway's JSON error with status,
// code and (when not empty) field.
func admExpectError(t *testing.T, r admResponse, status int, code, field string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field"`
	}
	r.decode(t, &e)
	if e.Code != code || e.Field != field || e.Message == "" {
		t.Errorf("error %s, want code %q field %q and a message", r.body, code, field)
	}
}

func TestAdminKeys(t *testing.T) {
	env := admStart(t)
	ctx := context.Background()
	expires := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)

	r := admJSON(t, "POST", "/platform/keys", fmt.Sprintf(
		`{"userId": "alice", "roles": ["reader", "writer", "reader"], "label": "laptop", "expiresAt": %q}`,
		expires.Format(time.RFC3339)))
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if cc := r.header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", cc)
	}
	var alice ops.KeyView
	r.decode(t, &alice)
	if !servicekey.WellFormed(alice.Key) {
		t.Fatalf("key %q is not well formed", alice.Key)
	}
	if !isUUID(alice.ID) || alice.UserID != "alice" || alice.Label != "laptop" ||
		!slices.Equal(alice.Roles, []string{"reader", "writer"}) || !alice.ExpiresAt.Equal(expires) ||
		alice.Status != ops.KeyActive || alice.CreatedAt.IsZero() {
		t.Errorf("created key %+v", alice)
	}
	if loc := r.header.Get("Location"); loc != "/platform/keys/"+alice.ID {
		t.Errorf("Location %q", loc)
	}
	// Only the hash is stored, and the gateway finds the key by it.
	rec, err := env.app.DataStore().KeyByHash(ctx, servicekey.Hash(alice.Key))
	if err != nil || rec.ID != alice.ID || rec.UserID != "alice" {
		t.Fatalf("KeyByHash: %+v, %v", rec, err)
	}

	r = admJSON(t, "POST", "/platform/keys", `{"userId": "bob"}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var bob ops.KeyView
	r.decode(t, &bob)
	if bob.Key == alice.Key || bob.ID == alice.ID || !servicekey.WellFormed(bob.Key) {
		t.Fatalf("second key %+v", bob)
	}
	var fields map[string]any
	r.decode(t, &fields)
	if _, ok := fields["expiresAt"]; ok {
		t.Errorf("a key without expiry shows expiresAt: %s", r.body)
	}
	if roles, ok := fields["roles"].([]any); !ok || len(roles) != 0 {
		t.Errorf("a key without roles shows roles %v, want []", fields["roles"])
	}

	// Listings and reads never show a key or its hash.
	wantFields := []string{"createdAt", "keyId", "label", "roles", "status", "userId"}
	for _, path := range []string{"/platform/keys", "/platform/keys?userId=alice", "/platform/keys/" + alice.ID} {
		r = admJSON(t, "GET", path, "")
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
		if bytes.Contains(r.body, []byte(alice.Key)) || bytes.Contains(r.body, []byte(bob.Key)) ||
			bytes.Contains(r.body, []byte("hash")) || bytes.Contains(r.body, []byte(`"key"`)) {
			t.Errorf("GET %s shows a key: %s", path, r.body)
		}
	}
	var list struct{ Keys []map[string]any }
	admJSON(t, "GET", "/platform/keys", "").decode(t, &list)
	if len(list.Keys) != 2 || list.Keys[0]["keyId"] != alice.ID || list.Keys[1]["keyId"] != bob.ID {
		t.Fatalf("all keys, oldest first: %v", list.Keys)
	}
	list.Keys = nil
	admJSON(t, "GET", "/platform/keys?userId=bob", "").decode(t, &list)
	if len(list.Keys) != 1 || list.Keys[0]["keyId"] != bob.ID {
		t.Fatalf("bob's keys: %v", list.Keys)
	}
	var names []string
	for name := range list.Keys[0] {
		names = append(names, name)
	}
	slices.Sort(names)
	if !slices.Equal(names, wantFields) {
		t.Errorf("listed fields %v, want %v", names, wantFields)
	}
	list.Keys = nil
	admJSON(t, "GET", "/platform/keys?userId=nobody", "").decode(t, &list)
	if list.Keys == nil || len(list.Keys) != 0 {
		t.Errorf("keys of an unknown user: %v, want []", list.Keys)
	}

	// Revoking answers the revoked record; revoking again keeps the first time.
	r = admJSON(t, "DELETE", "/platform/keys/"+bob.ID, "")
	if r.status != http.StatusOK {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	var revoked ops.KeyView
	r.decode(t, &revoked)
	if revoked.ID != bob.ID || revoked.Status != ops.KeyRevoked || revoked.RevokedAt.IsZero() || revoked.Key != "" {
		t.Fatalf("revoked %+v", revoked)
	}
	r = admJSON(t, "DELETE", "/platform/keys/"+bob.ID, "")
	var again ops.KeyView
	r.decode(t, &again)
	if r.status != http.StatusOK || !again.RevokedAt.Equal(revoked.RevokedAt) || again.Status != ops.KeyRevoked {
		t.Fatalf("second revoke: %d %s", r.status, r.body)
	}
	if rec, err := env.app.DataStore().KeyByHash(ctx, servicekey.Hash(bob.Key)); err != nil || rec.RevokedAt.IsZero() {
		t.Fatalf("stored key after revoke: %+v, %v", rec, err)
	}
	admExpectError(t, admJSON(t, "DELETE", "/platform/keys/key_unknown", ""), 404, "not_found", "")
	admExpectError(t, admJSON(t, "GET", "/platform/keys/key_unknown", ""), 404, "not_found", "")

	// Refusals, each leaving the store as it was.
	long := strings.Repeat("u", 129)
	bad := []struct {
		name, body  string
		status      int
		code, field string
	}{
		{"no body", "", 400, "invalid_request", "body"},
		{"no user", `{"roles": ["a"]}`, 400, "invalid_request", "userId"},
		{"empty user", `{"userId": ""}`, 400, "invalid_request", "userId"},
		{"slash in user", `{"userId": "a/b"}`, 400, "invalid_request", "userId"},
		{"NUL in user", `{"userId": "a\u0000b"}`, 400, "invalid_request", "userId"},
		{"newline in user", `{"userId": "a\nb"}`, 400, "invalid_request", "userId"},
		{"leading space in user", `{"userId": " a"}`, 400, "invalid_request", "userId"},
		{"user too long", `{"userId": "` + long + `"}`, 400, "invalid_request", "userId"},
		{"user not a string", `{"userId": 7}`, 400, "invalid_request", "userId"},
		{"comma in role", `{"userId": "c", "roles": ["a,b"]}`, 400, "invalid_request", "roles"},
		{"empty role", `{"userId": "c", "roles": [""]}`, 400, "invalid_request", "roles"},
		{"roles not a list", `{"userId": "c", "roles": "a"}`, 400, "invalid_request", "roles"},
		{"control in label", `{"userId": "c", "label": "a\u0007"}`, 400, "invalid_request", "label"},
		{"expiry not RFC 3339", `{"userId": "c", "expiresAt": "tomorrow"}`, 400, "invalid_request", "expiresAt"},
		{"expiry in the past", `{"userId": "c", "expiresAt": "2001-01-01T00:00:00Z"}`, 400, "invalid_request", "expiresAt"},
		{"unknown field", `{"userId": "c", "user": "c"}`, 400, "invalid_request", "user"},
		{"malformed JSON", `{"userId": "c"`, 400, "invalid_request", "body"},
		{"not an object", `["c"]`, 400, "invalid_request", "body"},
		{"trailing data", `{"userId": "c"} {}`, 400, "invalid_request", "body"},
		{"body over 1 MiB", `{"userId": "c", "label": "` + strings.Repeat("x", 1<<20) + `"}`, 413, "payload_too_large", ""},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			admExpectError(t, admJSON(t, "POST", "/platform/keys", tt.body), tt.status, tt.code, tt.field)
		})
	}
	if keys, err := env.app.DataStore().ListKeys(ctx, ""); err != nil || len(keys) != 2 {
		t.Fatalf("after refusals the store holds %d keys (%v), want 2", len(keys), err)
	}

	admExpectError(t, admJSON(t, "GET", "/platform/keys?user=alice", ""), 400, "invalid_request", "user")
	admExpectError(t, admJSON(t, "GET", "/platform/keys?userId=a&userId=b", ""), 400, "invalid_request", "userId")
	r = admJSON(t, "PUT", "/platform/keys", `{}`)
	admExpectError(t, r, 405, "method_not_allowed", "")
	if allow := r.header.Get("Allow"); allow != "GET, POST" {
		t.Errorf("Allow %q, want GET, POST", allow)
	}
	r = admJSON(t, "POST", "/platform/keys/"+alice.ID, `{}`)
	admExpectError(t, r, 405, "method_not_allowed", "")
	if allow := r.header.Get("Allow"); allow != "DELETE, GET" {
		t.Errorf("Allow %q, want DELETE, GET", allow)
	}
	admExpectError(t, admJSON(t, "GET", "/platform/nothing", ""), 404, "not_found", "")
	admExpectError(t, admJSON(t, "GET", "/platform/keys/a/b", ""), 404, "not_found", "")

	// The plaintext keys never reach the file or the log; their hashes
	// and ids do.
	env.stop()
	db, err := os.ReadFile(env.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	logged, err := os.ReadFile(env.logPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(logged, []byte("service key created")) || !bytes.Contains(logged, []byte(alice.ID)) {
		t.Errorf("the log does not record the key's creation:\n%s", logged)
	}
	for _, k := range []ops.KeyView{alice, bob} {
		if bytes.Contains(db, []byte(k.Key)) {
			t.Errorf("the store file holds the key %s", k.ID)
		}
		if bytes.Contains(logged, []byte(k.Key)) {
			t.Errorf("the log holds the key %s", k.ID)
		}
		h := servicekey.Hash(k.Key)
		if !bytes.Contains(db, h[:]) {
			t.Errorf("the store file lacks the hash of key %s", k.ID)
		}
		if !bytes.Contains(db, []byte(k.ID)) {
			t.Errorf("the store file lacks key id %s", k.ID)
		}
	}
}

// admSubscription is a subscription as the admin API answers it, with the
// credit balance as the exact JSON number it was sent as.
type admSubscription struct {
	UserID    string      `json:"userId"`
	ServiceID string      `json:"serviceId"`
	ProductID string      `json:"productId"`
	Status    string      `json:"status"`
	StartedAt time.Time   `json:"startedAt"`
	UpdatedAt time.Time   `json:"updatedAt"`
	Credits   json.Number `json:"credits"`
}

func TestAdminSubscriptions(t *testing.T) {
	admStart(t)
	const path = "/platform/subscriptions/alice/weather"

	admExpectError(t, admJSON(t, "GET", path, ""), 404, "not_found", "")

	r := admJSON(t, "PUT", path, `{"productId": "basic", "status": "trial"}`)
	if r.status != http.StatusOK {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	var sub admSubscription
	r.decode(t, &sub)
	if sub.UserID != "alice" || sub.ServiceID != "weather" || sub.ProductID != "basic" || sub.Status != "TRIAL" ||
		sub.Credits != "0" || sub.StartedAt.IsZero() {
		t.Fatalf("subscription %+v", sub)
	}
	var got admSubscription
	r = admJSON(t, "GET", path, "")
	r.decode(t, &got)
	if r.status != http.StatusOK || got != sub {
		t.Fatalf("get: %d %+v, want %+v", r.status, got, sub)
	}

	bad := []struct {
		name, path, body string
		field            string
	}{
		{"unknown service", "/platform/subscriptions/alice/rain", `{"productId": "basic"}`, "serviceId"},
		{"invalid service id", "/platform/subscriptions/alice/-rain", `{"productId": "basic"}`, "serviceId"},
		{"unknown product", path, `{"productId": "gold", "status": "ACTIVE"}`, "productId"},
		{"invalid product id", path, `{"productId": "a b"}`, "productId"},
		{"no product", path, `{"status": "ACTIVE"}`, "productId"},
		{"unknown status", path, `{"productId": "pro", "status": "PAUSED"}`, "status"},
		{"unknown field", path, `{"productId": "pro", "plan": "x"}`, "plan"},
		{"slash in user", "/platform/subscriptions/a%2Fb/weather", `{"productId": "basic"}`, "userId"},
		{"control in user", "/platform/subscriptions/a%07b/weather", `{"productId": "basic"}`, "userId"},
		{"empty body", path, ``, "body"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			admExpectError(t, admJSON(t, "PUT", tt.path, tt.body), 400, "invalid_request", tt.field)
		})
	}
	r = admJSON(t, "GET", path, "")
	r.decode(t, &got)
	if got != sub {
		t.Fatalf("after refusals: %+v, want %+v", got, sub)
	}
	admExpectError(t, admJSON(t, "GET", "/platform/subscriptions/alice/rain", ""), 404, "not_found", "")
	admExpectError(t, admJSON(t, "GET", "/platform/subscriptions/a%2Fb/weather", ""), 400, "invalid_request", "userId")

	// Changing product and status keeps the start and the balance; no
	// status means ACTIVE.
	r = admJSON(t, "PUT", path, `{"productId": "pro"}`)
	var changed admSubscription
	r.decode(t, &changed)
	if r.status != 200 || changed.ProductID != "pro" || changed.Status != "ACTIVE" || !changed.StartedAt.Equal(sub.StartedAt) {
		t.Fatalf("changed: %d %s", r.status, r.body)
	}

	r = admJSON(t, "DELETE", path, "")
	admExpectError(t, r, 405, "method_not_allowed", "")
	if allow := r.header.Get("Allow"); allow != "GET, PUT" {
		t.Errorf("Allow %q", allow)
	}

	// A user id with spaces and non-ASCII travels percent-encoded.
	r = admJSON(t, "PUT", "/platform/subscriptions/J%C3%BCrgen%20M/weather", `{"productId": "basic", "status": "Suspended"}`)
	var odd admSubscription
	r.decode(t, &odd)
	if r.status != 200 || odd.UserID != "Jürgen M" || odd.Status != "SUSPENDED" {
		t.Fatalf("encoded user id: %d %s", r.status, r.body)
	}
}

func TestAdminCredits(t *testing.T) {
	env := admStart(t)
	const path = "/platform/subscriptions/alice/weather"
	admExpectError(t, admJSON(t, "POST", path+"/credits", `{"amount": 5}`), 404, "not_found", "")
	if r := admJSON(t, "PUT", path, `{"productId": "basic"}`); r.status != 200 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}

	steps := []struct{ body, balance string }{
		{`{"amount": 10.5}`, "10.5"},
		{`{"amount": "-0.25"}`, "10.25"},
		{`{"amount": 0.000001}`, "10.250001"},
		{`{"amount": -20}`, "-9.749999"},
		{`{"amount": 1e1}`, "0.250001"},
	}
	for _, s := range steps {
		r := admJSON(t, "POST", path+"/credits", s.body)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", s.body, r.status, r.body)
		}
		if !bytes.Contains(r.body, []byte(`"credits":`+s.balance+",")) {
			t.Fatalf("%s: balance in %s, want %s as a JSON number", s.body, r.body, s.balance)
		}
	}
	sub, err := env.app.DataStore().GetSubscription(context.Background(), "alice", "weather")
	if err != nil || sub.Credits != 250001 {
		t.Fatalf("stored balance %v (%v), want 0.250001", sub.Credits, err)
	}

	for _, body := range []string{
		`{"amount": 0}`, `{"amount": "-0"}`, `{}`, `{"amount": null}`, `{"amount": "ten"}`,
		`{"amount": 1.0000001}`, `{"amount": true}`, `{"amount": "--1"}`, `{"amount": "+-1"}`, `{"amount": 1e40}`,
	} {
		admExpectError(t, admJSON(t, "POST", path+"/credits", body), 400, "invalid_request", "amount")
	}
	admExpectError(t, admJSON(t, "POST", path+"/credits", `{"amount": 1, "note": "x"}`), 400, "invalid_request", "note")
	admExpectError(t, admJSON(t, "POST", "/platform/subscriptions/bob/weather/credits", `{"amount": 1}`), 404, "not_found", "")
	r := admJSON(t, "GET", path+"/credits", "")
	admExpectError(t, r, 405, "method_not_allowed", "")
	if r.header.Get("Allow") != "POST" {
		t.Errorf("Allow %q", r.header.Get("Allow"))
	}
	if sub2, _ := env.app.DataStore().GetSubscription(context.Background(), "alice", "weather"); sub2.Credits != sub.Credits {
		t.Fatalf("refused credits changed the balance to %v", sub2.Credits)
	}
}

// admRecord writes a ledger entry through the app's store as the gateway
// would.
func admRecord(t *testing.T, app *App, e store.LedgerEntry) {
	t.Helper()
	a := store.Account{UserID: e.UserID, ServiceID: e.ServiceID, Free: e.ProductID == ""}
	if e.ProductID != "" {
		svc, _ := app.Catalog().Service(e.ServiceID)
		p, _ := svc.Product(e.ProductID)
		a.Product = *p
	}
	_, err := app.DataStore().Record(context.Background(), a, e, func(store.LedgerEntry, billing.State) ([]byte, error) {
		return []byte("{}"), nil
	})
	if err != nil {
		t.Fatalf("record %+v: %v", e, err)
	}
}

func TestAdminUsageExport(t *testing.T) {
	env := admStart(t)
	if r := admJSON(t, "PUT", "/platform/subscriptions/alice/weather", `{"productId": "basic"}`); r.status != 200 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}
	jan := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
	feb := time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC)
	mar := time.Date(2026, 3, 10, 8, 30, 0, 0, time.UTC)
	admRecord(t, env.app, store.LedgerEntry{Time: jan, UserID: "alice", ServiceID: "weather", EndpointID: "forecast",
		ProductID: "basic", RequestID: "req-1", Units: billing.Whole(2), Source: store.SourceGateway})
	admRecord(t, env.app, store.LedgerEntry{Time: feb, UserID: "-bob", ServiceID: "weather", EndpointID: "forecast",
		RequestID: `=HYPERLINK("http://evil","x")`, Units: 1500000, Source: store.SourceReport, IdempotencyKey: "@SUM(1+1)"})
	admRecord(t, env.app, store.LedgerEntry{Time: mar, UserID: "alice", ServiceID: "weather",
		ProductID: "basic", RequestID: `say "hi", ok`, Units: 250000, Source: store.SourceCompletion, OccurredAt: mar.Add(-time.Minute)})

	r := admJSON(t, "GET", "/platform/usage", "")
	if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("json export: %d %v %s", r.status, r.header, r.body)
	}
	var all []store.LedgerEntry
	r.decode(t, &all)
	if len(all) != 3 || !all[0].Time.Equal(jan) || !all[1].Time.Equal(feb) || !all[2].Time.Equal(mar) {
		t.Fatalf("json export not the three entries in time order: %s", r.body)
	}
	if all[0].UserID != "alice" || all[0].Units != billing.Whole(2) || all[0].Cost != billing.Whole(1) ||
		all[0].ProductID != "basic" || all[0].RequestID != "req-1" || all[0].Source != "gateway" || all[0].ID == "" {
		t.Errorf("first entry %+v", all[0])
	}
	if !bytes.Contains(r.body, []byte(`"units":1.5`)) {
		t.Errorf("units are not exact JSON numbers: %s", r.body)
	}

	filters := []struct {
		query string
		want  []time.Time
	}{
		{"userId=alice", []time.Time{jan, mar}},
		{"userId=-bob", []time.Time{feb}},
		{"serviceId=weather", []time.Time{jan, feb, mar}},
		{"serviceId=rain", nil},
		{"from=2026-02-01", []time.Time{feb, mar}},
		{"to=2026-02-10", []time.Time{jan, feb}}, // a date includes its day
		{"to=2026-02-10T00:00:00Z", []time.Time{jan}},
		{"from=2026-02-10T00:00:00Z&to=2026-03-10T08:30:00Z", []time.Time{feb}},
		{"from=2026-01-10T13:00:00%2B01:00", []time.Time{jan, feb, mar}},
		{"userId=alice&from=2026-02-01&to=2026-03-31&format=JSON", []time.Time{mar}},
	}
	for _, f := range filters {
		r := admJSON(t, "GET", "/platform/usage?"+f.query, "")
		var got []store.LedgerEntry
		r.decode(t, &got)
		var times []time.Time
		for _, e := range got {
			times = append(times, e.Time)
		}
		if r.status != 200 || !slices.EqualFunc(times, f.want, time.Time.Equal) {
			t.Errorf("%s: %d %v, want %v", f.query, r.status, times, f.want)
		}
	}
	if r := admJSON(t, "GET", "/platform/usage?userId=nobody", ""); string(r.body) != "[]\n" {
		t.Errorf("empty export %q, want []", r.body)
	}

	r = admJSON(t, "GET", "/platform/usage?format=ndjson&userId=alice", "")
	lines := strings.Split(strings.TrimSuffix(string(r.body), "\n"), "\n")
	if r.status != 200 || r.header.Get("Content-Type") != "application/x-ndjson" || len(lines) != 2 {
		t.Fatalf("ndjson: %d %s", r.status, r.body)
	}
	for _, l := range lines {
		var e store.LedgerEntry
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.UserID != "alice" {
			t.Errorf("ndjson line %q: %v", l, err)
		}
	}

	r = admJSON(t, "GET", "/platform/usage?format=csv", "")
	if r.status != 200 || r.header.Get("Content-Type") != "text/csv; charset=utf-8" {
		t.Fatalf("csv: %d %v", r.status, r.header)
	}
	rows, err := csv.NewReader(bytes.NewReader(r.body)).ReadAll()
	if err != nil {
		t.Fatalf("csv does not parse: %v\n%s", err, r.body)
	}
	if len(rows) != 4 || !slices.Equal(rows[0], ops.UsageCSVColumns()) {
		t.Fatalf("csv rows %q", rows)
	}
	col := func(row []string, name string) string { return row[slices.Index(ops.UsageCSVColumns(), name)] }
	if col(rows[1], "time") != "2026-01-10T12:00:00Z" || col(rows[1], "units") != "2" || col(rows[1], "cost") != "1" ||
		col(rows[1], "userId") != "alice" || col(rows[1], "overage") != "0" || col(rows[1], "occurredAt") != "" {
		t.Errorf("csv row %q", rows[1])
	}
	// Values that a spreadsheet would run as formulas are defused.
	if col(rows[2], "userId") != "'-bob" || col(rows[2], "requestId") != `'=HYPERLINK("http://evil","x")` ||
		col(rows[2], "idempotencyKey") != "'@SUM(1+1)" || col(rows[2], "units") != "1.5" {
		t.Errorf("csv row with formula-like values %q", rows[2])
	}
	if col(rows[3], "requestId") != `say "hi", ok` || col(rows[3], "occurredAt") != "2026-03-10T08:29:00Z" {
		t.Errorf("csv row with quotes %q", rows[3])
	}
	if !bytes.Contains(r.body, []byte(`"say ""hi"", ok"`)) {
		t.Errorf("csv does not quote a field with quotes and a comma:\n%s", r.body)
	}
	r = admJSON(t, "GET", "/platform/usage?format=csv&userId=nobody", "")
	if string(r.body) != strings.Join(ops.UsageCSVColumns(), ",")+"\n" {
		t.Errorf("empty csv %q, want the header row", r.body)
	}

	for _, bad := range []struct{ query, field string }{
		{"format=xml", "format"},
		{"from=yesterday", "from"},
		{"to=2026-13-01", "to"},
		{"from=2026-03-01&to=2026-02-01", "to"},
		{"from=2026-03-01&to=2026-03-01T00:00:00Z", "to"},
		{"user=alice", "user"},
		{"userId=a%2Fb", "userId"},
		{"serviceId=..", "serviceId"},
		{"format=csv&format=json", "format"},
	} {
		admExpectError(t, admJSON(t, "GET", "/platform/usage?"+bad.query, ""), 400, "invalid_request", bad.field)
	}
	r = admJSON(t, "POST", "/platform/usage", "{}")
	admExpectError(t, r, 405, "method_not_allowed", "")
	if r.header.Get("Allow") != "GET" {
		t.Errorf("Allow %q", r.header.Get("Allow"))
	}
}

// TestAdminUsageExportStreams exports a ledger larger than one store scan
// chunk and one write buffer: the response is chunked (streamed, no
// Content-Length) and holds every entry once, in order.
func TestAdminUsageExportStreams(t *testing.T) {
	env := admStart(t)
	const n = 3000
	start := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		admRecord(t, env.app, store.LedgerEntry{Time: start.Add(time.Duration(i) * time.Second), UserID: "owner",
			ServiceID: "weather", EndpointID: "forecast", RequestID: fmt.Sprintf("req-%05d", i), Units: billing.Whole(1),
			Source: store.SourceGateway})
	}
	for _, format := range []string{"json", "ndjson", "csv"} {
		resp, err := http.Get("http://" + admAddr + "/platform/usage?format=" + format)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.ContentLength != -1 || !slices.Equal(resp.TransferEncoding, []string{"chunked"}) {
			t.Errorf("%s: status %d, length %d, transfer %v: not streamed", format, resp.StatusCode, resp.ContentLength, resp.TransferEncoding)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		switch format {
		case "json":
			var entries []store.LedgerEntry
			if err := json.Unmarshal(body, &entries); err != nil {
				t.Fatalf("json: %v", err)
			}
			for _, e := range entries {
				ids = append(ids, e.RequestID)
			}
		case "ndjson":
			dec := json.NewDecoder(bytes.NewReader(body))
			for dec.More() {
				var e store.LedgerEntry
				if err := dec.Decode(&e); err != nil {
					t.Fatalf("ndjson: %v", err)
				}
				ids = append(ids, e.RequestID)
			}
		case "csv":
			rows, err := csv.NewReader(bytes.NewReader(body)).ReadAll()
			if err != nil {
				t.Fatalf("csv: %v", err)
			}
			for _, row := range rows[1:] {
				ids = append(ids, row[slices.Index(ops.UsageCSVColumns(), "requestId")])
			}
		}
		if len(ids) != n || !slices.IsSorted(ids) || ids[0] != "req-00000" || ids[n-1] != fmt.Sprintf("req-%05d", n-1) {
			t.Errorf("%s: %d entries, want %d in order", format, len(ids), n)
		}
	}
}

func TestAdminJobs(t *testing.T) {
	env := admStart(t)
	created := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	job := store.Job{
		ID: "6f1c2a9e-8d1b-4e8a-9a7e-2b1f0c3d4e5f", UserID: "alice", KeyID: "key_x", ServiceID: "weather",
		EndpointID: "forecast", ProductID: "basic", Status: store.JobRunning, Stage: "rendering",
		PercentageComplete: 40, CreatedAt: created, UpdatedAt: created, ExpiresAt: created.Add(24 * time.Hour),
	}
	if err := env.app.DataStore().CreateJob(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	r := admJSON(t, "GET", "/platform/jobs/"+job.ID, "")
	if r.status != 200 {
		t.Fatalf("job: %d %s", r.status, r.body)
	}
	var got map[string]any
	r.decode(t, &got)
	if got["requestId"] != job.ID || got["status"] != "RUNNING" || got["currentStage"] != "rendering" ||
		got["percentageComplete"] != 40.0 || got["userId"] != "alice" || got["startTime"] != "2026-05-01T09:00:00Z" {
		t.Errorf("job %s", r.body)
	}
	admExpectError(t, admJSON(t, "GET", "/platform/jobs/no-such-job", ""), 404, "request_not_found", "")
	r = admJSON(t, "DELETE", "/platform/jobs/"+job.ID, "")
	admExpectError(t, r, 405, "method_not_allowed", "")
	if r.header.Get("Allow") != "GET" {
		t.Errorf("Allow %q", r.header.Get("Allow"))
	}
}

// TestAdminFollowsReload: after a reload the admin API serves the new
// catalog and the same store; a config that fails to load leaves the
// running one, admin API included, in service.
func TestAdminFollowsReload(t *testing.T) {
	env := admStart(t)
	dir := filepath.Dir(env.dbPath)
	r := admJSON(t, "POST", "/platform/keys", `{"userId": "alice"}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	admExpectError(t, admJSON(t, "PUT", "/platform/subscriptions/alice/weather", `{"productId": "gold"}`), 400, "invalid_request", "productId")

	gold := `, {"id": "gold", "billing_model": "USAGE_POSTPAID", "measurement_type": "PER_TOKEN", "price": 0.001}`
	if status, body := admLoad(t, env.config(dir, gold)); status != http.StatusOK {
		t.Fatalf("reload: %d %s", status, body)
	}
	if r := admJSON(t, "PUT", "/platform/subscriptions/alice/weather", `{"productId": "gold"}`); r.status != http.StatusOK {
		t.Fatalf("subscribing to the product added by the reload: %d %s", r.status, r.body)
	}
	var list struct{ Keys []ops.KeyView }
	admJSON(t, "GET", "/platform/keys", "").decode(t, &list)
	if len(list.Keys) != 1 {
		t.Fatalf("keys after reload: %+v", list.Keys)
	}

	broken := `, {"id": "bad", "billing_model": "FREE", "measurement_type": "PER_REQUEST"}`
	if status, body := admLoad(t, env.config(dir, gold+broken)); status == http.StatusOK {
		t.Fatalf("a config with an unknown billing model loaded: %s", body)
	}
	admJSON(t, "GET", "/platform/keys", "").decode(t, &list)
	if r := admJSON(t, "GET", "/platform/subscriptions/alice/weather", ""); r.status != http.StatusOK || len(list.Keys) != 1 {
		t.Fatalf("after a failed load: %d %s, keys %+v", r.status, r.body, list.Keys)
	}
	if r := admJSON(t, "POST", "/platform/keys", `{"userId": "bob"}`); r.status != http.StatusCreated {
		t.Fatalf("create after a failed load: %d %s", r.status, r.body)
	}
}

// TestAdminWithoutPlatformApp: with no platform app in the running config,
// every route says so with a 503 rather than failing obscurely.
func TestAdminWithoutPlatformApp(t *testing.T) {
	tester := admTester(t)
	tester.InitServer(fmt.Sprintf(`{"admin": {"listen": %q}}`, admAddr), "json")
	for _, path := range []string{"/platform/keys", "/platform/usage", "/platform/nothing"} {
		admExpectError(t, admJSON(t, "GET", path, ""), 503, codeNotConfigured, "")
	}
}

// admFailingLedger is the real store with a ledger scan that fails after a
// number of entries, as a disk error would.
type admFailingLedger struct {
	store.Store
	after int
}

func (s admFailingLedger) ScanLedger(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error {
	n := 0
	return s.Store.ScanLedger(ctx, f, func(e store.LedgerEntry) error {
		if n == s.after {
			return errors.New("disk on fire")
		}
		n++
		return fn(e)
	})
}

// TestAdminUsageExportStoreFailure: a store failure before anything is
// sent is an ordinary 500; after part of the export is out, the connection
// is cut so the client cannot mistake a short export for a whole one.
func TestAdminUsageExportStoreFailure(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	app := appOver(bolt)
	start := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	for i := range 700 {
		admRecord(t, app, store.LedgerEntry{Time: start.Add(time.Duration(i) * time.Second), UserID: "owner",
			ServiceID: "weather", RequestID: fmt.Sprintf("req-%05d", i), Units: billing.Whole(1), Source: store.SourceGateway})
	}
	api := &adminAPI{logger: zap.NewNop()}
	serve := func(after int) *httptest.Server {
		failing := appOver(admFailingLedger{Store: bolt, after: after})
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := api.exportUsage(failing, w, r, nil); err != nil {
				api.writeError(w, r, err)
			}
		}))
	}

	early := serve(0)
	defer early.Close()
	resp, err := http.Get(early.URL + "?format=csv")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	admExpectError(t, admResponse{status: resp.StatusCode, header: resp.Header, body: body}, 500, "internal_error", "")
	if bytes.Contains(body, []byte("disk on fire")) {
		t.Errorf("the 500 shows the internal error: %s", body)
	}

	// Go's client asks for gzip: both the compressed and the plain export.
	for _, format := range []string{"json", "ndjson", "csv", "json&gzip=false", "ndjson&gzip=false", "csv&gzip=false"} {
		late := serve(600)
		resp, err := http.Get(late.URL + "?format=" + format)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		late.Close()
		if resp.StatusCode != 200 || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: status %d, read error %v; want 200 and a cut transfer", format, resp.StatusCode, err)
		}
	}
}

// TestAdminDuplicateFields: a body that gives a field twice (in any case:
// encoding/json matches names without regard to it) is refused, naming
// the field, and changes nothing. encoding/json took the last value, so
// {"amount": 1, "amount": 1000} credited 1000 where a proxy, a log or a
// reviewer reading the first saw 1.
func TestAdminDuplicateFields(t *testing.T) {
	env := admStart(t)
	const path = "/platform/subscriptions/alice/weather"
	if r := admJSON(t, "PUT", path, `{"productId": "basic"}`); r.status != 200 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}
	var before auditPage
	admJSON(t, "GET", "/platform/audit", "").decode(t, &before)
	for _, tc := range []struct{ method, path, body, field string }{
		{"POST", path + "/credits", `{"amount": 1, "amount": 1000}`, "amount"},
		{"POST", path + "/credits", `{"amount": 1, "AMOUNT": 1000}`, "AMOUNT"},
		{"PUT", path, `{"productId": "basic", "status": "SUSPENDED", "status": "ACTIVE"}`, "status"},
		{"PUT", path, `{"productId": "basic", "productId": "pro"}`, "productId"},
		{"POST", "/platform/keys", `{"userId": "alice", "userId": "mallory"}`, "userId"},
	} {
		t.Run(tc.body, func(t *testing.T) {
			admExpectError(t, admJSON(t, tc.method, tc.path, tc.body), 400, "invalid_request", tc.field)
		})
	}
	// Nested objects keep their own names; the same name in two of them
	// is not a duplicate (roles is a list of strings, so this is only
	// refused for its type).
	admExpectError(t, admJSON(t, "POST", "/platform/keys", `{"userId": "bob", "roles": [{"a": 1}, {"a": 2}]}`), 400, "invalid_request", "roles")

	sub, err := env.app.DataStore().GetSubscription(context.Background(), "alice", "weather")
	if err != nil || sub.Credits != 0 || sub.ProductID != "basic" || sub.Status != "ACTIVE" {
		t.Fatalf("subscription after refused bodies: %+v, %v", sub, err)
	}
	for _, user := range []string{"alice", "mallory", "bob"} {
		if keys, _ := env.app.DataStore().ListKeys(context.Background(), user); len(keys) != 0 {
			t.Fatalf("a refused body made a key for %s: %+v", user, keys)
		}
	}
	var after auditPage
	admJSON(t, "GET", "/platform/audit", "").decode(t, &after)
	if len(after.Entries) != len(before.Entries) {
		t.Fatalf("refused bodies were audited: %+v", after.Entries)
	}
}
