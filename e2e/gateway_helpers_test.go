// Package e2e runs the real Caddy server in-process (caddytest) with the
// platform modules, a real bbolt file under a temp dir, and real backends on
// loopback that verify the gateway's signatures with their own code.
package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/platformgw/gateway/internal/billing"
	_ "github.com/platformgw/gateway/internal/console" // Caddyfile.example has a console
	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/platform"
	_ "github.com/platformgw/gateway/internal/platformgw"
	_ "github.com/platformgw/gateway/internal/portal"
	_ "github.com/platformgw/gateway/internal/publiccatalog" // Caddyfile.example has a catalog
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	_ "github.com/platformgw/gateway/internal/storefront" // and a storefront
	_ "github.com/platformgw/gateway/internal/usagehandler"
)

const testSecret = "s3cret-s3cret-s3cret-s3cret-0001"

// The ports of the in-process server. caddytest's default admin port is
// 2999; E2E_ADMIN_PORT and E2E_HTTP_PORT move them, so two test processes
// on one machine do not talk to each other's server.
var (
	adminPort = e2etest.EnvInt("E2E_ADMIN_PORT", 2999)
	gwPort    = e2etest.EnvInt("E2E_HTTP_PORT", 9080)
	gwBase    = fmt.Sprintf("http://127.0.0.1:%d", gwPort)
)

// newTester is a caddytest tester on this package's admin port, for a
// config on a store of its own.
func newTester(t *testing.T) *caddytest.Tester { return testerFor(t, "") }

// testerFor is a caddytest tester for a config on the store at path. It
// first unloads the config a previous test left running if that serves
// another store, as a restart would: a reload never switches stores
// (docs/operations.md, "The store path"), and a test reloading its own
// gateway keeps it.
func testerFor(t *testing.T, path string) *caddytest.Tester {
	if a, err := caddy.ActiveContext().AppIfConfigured("platform"); err == nil {
		if app, ok := a.(*platform.App); ok && app.StorePath() != filepath.Clean(path) {
			admin := fmt.Sprintf("localhost:%d", adminPort)
			if resp, err := loadClient.Post("http://"+admin+"/load", "application/json",
				strings.NewReader(fmt.Sprintf(`{"admin": {"listen": %q}}`, admin))); err == nil {
				resp.Body.Close()
			}
		}
	}
	return caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
}

// seenRequest is what a test backend received.
type seenRequest struct {
	Method   string
	Path     string
	RawQuery string
	Header   http.Header
	Body     []byte
	SigOK    bool
}

// testBackend is a service backend that checks every request's v3
// signature independently of the gateway's signing package, as a backend
// developer's own code would.
type testBackend struct {
	*httptest.Server
	secret string
	brand  string

	mu   sync.Mutex
	seen []seenRequest
}

func newTestBackend(t *testing.T, secret, brand string) *testBackend {
	b := &testBackend{secret: secret, brand: brand}
	b.Server = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.Close)
	return b
}

// v3Signature is written out here from docs/wire-contract.md, not taken from the code
// under test: Base64(HMAC-SHA256(secret, body + ts + ctx)).
func v3Signature(secret string, body []byte, ts, ctx string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	m.Write([]byte(ts))
	m.Write([]byte(ctx))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

func (b *testBackend) contextString(h http.Header) string {
	x := "X-" + b.brand + "-"
	g := func(n string) string { return h.Get(x + n) }
	return "3" + g("User-ID") + g("Service-Product-ID") + g("Roles") + g("Subscription-Status") +
		g("Billing-Model") + g("Measurement-Type") + g("Unit-Label")
}

func (b *testBackend) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	x := "X-" + b.brand + "-"
	want := v3Signature(b.secret, body, r.Header.Get(x+"Timestamp"), b.contextString(r.Header))
	sigOK := r.Header.Get(x+"Signing-Version") == "3" && hmac.Equal([]byte(want), []byte(r.Header.Get(x+"Signature")))
	b.mu.Lock()
	b.seen = append(b.seen, seenRequest{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body, sigOK})
	b.mu.Unlock()
	if !sigOK {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	switch {
	case strings.HasSuffix(r.URL.Path, "/units"):
		w.Header().Set(x+"Units", r.URL.Query().Get("n"))
		io.WriteString(w, "tokens")
	case strings.HasSuffix(r.URL.Path, "/fail"):
		http.Error(w, "backend broke", http.StatusServiceUnavailable)
	case strings.HasSuffix(r.URL.Path, "/bytes"):
		w.Write(bytes.Repeat([]byte("b"), 1000))
	case strings.HasSuffix(r.URL.Path, "/slow"):
		time.Sleep(300 * time.Millisecond)
		io.WriteString(w, "slow")
	case strings.HasSuffix(r.URL.Path, "/stream"):
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
		}
	default:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Backend", "yes")
		json.NewEncoder(w).Encode(map[string]any{"ok": true, "path": r.URL.Path, "query": r.URL.RawQuery, "body": string(body)})
	}
}

func (b *testBackend) last(t *testing.T) seenRequest {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.seen) == 0 {
		t.Fatal("backend saw no request")
	}
	return b.seen[len(b.seen)-1]
}

func (b *testBackend) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.seen)
}

// gateway is a running server with its platform app.
type gateway struct {
	t      *testing.T
	tester *caddytest.Tester
	dir    string
}

// startGateway loads a Caddyfile with the given global platform block body
// and the standard site: platform_usage, platform_gateway, reverse_proxy.
func startGateway(t *testing.T, dir, platformBlock string) *gateway {
	t.Helper()
	return startGatewayWithTransport(t, dir, platformBlock, "")
}

// startGatewayWithTransport is startGateway with options for the platform
// transport (timeouts, say), one per line.
func startGatewayWithTransport(t *testing.T, dir, platformBlock, transportOptions string) *gateway {
	t.Helper()
	return startGatewayWithOptions(t, dir, platformBlock, transportOptions, "")
}

// startGatewayWithOptions is startGatewayWithTransport with more global
// options (a servers block, say), one per line.
func startGatewayWithOptions(t *testing.T, dir, platformBlock, transportOptions, globalOptions string) *gateway {
	t.Helper()
	return startGatewayWithProxy(t, dir, platformBlock, transportOptions, globalOptions, "")
}

// startGatewayWithProxy is startGatewayWithOptions with options of
// reverse_proxy itself (request_buffers, say), one per line.
func startGatewayWithProxy(t *testing.T, dir, platformBlock, transportOptions, globalOptions, proxyOptions string) *gateway {
	t.Helper()
	cfg := gatewayConfig(dir, platformBlock, transportOptions, globalOptions, proxyOptions)
	tester := testerFor(t, filepath.Join(dir, "platform.db"))
	tester.InitServer(cfg, "caddyfile")
	return &gateway{t: t, tester: tester, dir: dir}
}

// loadClient posts configs to the admin API's /load, each on a connection
// of its own: Caddy replaces its admin server as a load applies (or rolls
// back), closing the connections it had, so a /load sent on a connection
// kept alive from an earlier one could read EOF (it failed CI once, in
// TestAlertsBadConfigRefused's series of refused loads).
var loadClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}

// reload loads the standard config (startGateway's) with another platform
// block into the running server, as `caddy reload` does (POST /load).
func (g *gateway) reload(platformBlock string) {
	g.t.Helper()
	resp, err := loadClient.Post(fmt.Sprintf("http://localhost:%d/load", adminPort), "text/caddyfile",
		strings.NewReader(gatewayConfig(g.dir, platformBlock, "", "", "")))
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
		g.t.Fatalf("reload: %d %s", resp.StatusCode, b)
	}
}

// gatewayConfig is the Caddyfile startGatewayWithProxy loads.
func gatewayConfig(dir, platformBlock, transportOptions, globalOptions, proxyOptions string) string {
	return fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	https_port 9443
	grace_period 10s
%s
	platform {
		store %s/platform.db
%s
	}
}
:%d {
	bind 127.0.0.1
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
%s
		transport platform {
%s
		}
	}
}
`, adminPort, gwPort, globalOptions, dir, platformBlock, gwPort, proxyOptions, transportOptions)
}

func (g *gateway) app() *platform.App {
	g.t.Helper()
	a, err := caddy.ActiveContext().App("platform")
	if err != nil {
		g.t.Fatal(err)
	}
	return a.(*platform.App)
}

func (g *gateway) store() store.Store { return g.app().DataStore() }

// newKey stores a fresh service key for user and returns its text.
func (g *gateway) newKey(user string, roles ...string) (string, store.KeyRecord) {
	g.t.Helper()
	key, hash, err := servicekey.Generate()
	if err != nil {
		g.t.Fatal(err)
	}
	rec := store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: user, Roles: roles, Created: time.Now().UTC()}
	if err := g.store().CreateKey(context.Background(), rec); err != nil {
		g.t.Fatal(err)
	}
	return key, rec
}

func (g *gateway) subscribe(user, service, product, status string) {
	g.t.Helper()
	_, err := g.store().PutSubscription(context.Background(), store.Subscription{
		UserID: user, ServiceID: service, ProductID: product, Status: status, UpdatedAt: time.Now().UTC(),
	})
	if err != nil {
		g.t.Fatal(err)
	}
}

func (g *gateway) credits(user, service, amount string) {
	g.t.Helper()
	u, err := billing.ParseUnits(amount)
	if err != nil {
		g.t.Fatal(err)
	}
	if _, err := g.store().AddCredits(context.Background(), user, service, u, time.Now()); err != nil {
		g.t.Fatal(err)
	}
}

// ledger returns every ledger entry of a user.
func (g *gateway) ledger(user string) []store.LedgerEntry {
	g.t.Helper()
	var out []store.LedgerEntry
	err := g.store().ScanLedger(context.Background(), store.LedgerFilter{UserID: user}, func(e store.LedgerEntry) error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		g.t.Fatal(err)
	}
	return out
}

func ledgerSum(es []store.LedgerEntry) billing.Units {
	var s billing.Units
	for _, e := range es {
		s += e.Units
	}
	return s
}

var client = &http.Client{Timeout: 10 * time.Second}

// call invokes the gateway and returns status, headers and body.
func call(t *testing.T, method, url, key string, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// errorCode decodes a JSON error body and checks its content type.
func errorCode(t *testing.T, resp *http.Response, body []byte) string {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("error content type %q, body %s", ct, body)
	}
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Code == "" || e.Message == "" {
		t.Fatalf("not a JSON error: %s", body)
	}
	return e.Code
}

func invokeURL(service, endpoint string) string {
	return gwBase + "/api/service/" + service + "/endpoint/" + endpoint + "/invoke"
}
