package portal

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/platform"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"

	// The gateway's handlers, for the real calls the portal then shows.
	_ "github.com/platformgw/gateway/internal/platformgw"
	_ "github.com/platformgw/gateway/internal/storefront"
	_ "github.com/platformgw/gateway/internal/usagehandler"
)

// The ports of the in-process server, moved by E2E_ADMIN_PORT and
// E2E_HTTP_PORT as in the e2e package.
var (
	adminPort = envInt("E2E_ADMIN_PORT", 2999)
	httpPort  = envInt("E2E_HTTP_PORT", 9080)
	siteBase  = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

const echoSecret = "portal-test-secret-0123456789abcdef"

// signingBackend answers every call after checking its v3 signature with
// its own code (Base64(HMAC-SHA256(secret, body + ts + ctx))), as a
// backend developer's would.
func signingBackend(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		g := func(n string) string { return r.Header.Get("X-Platform-" + n) }
		ctx := "3" + g("User-ID") + g("Service-Product-ID") + g("Roles") + g("Subscription-Status") +
			g("Billing-Model") + g("Measurement-Type") + g("Unit-Label")
		m := hmac.New(sha256.New, []byte(echoSecret))
		m.Write(body)
		m.Write([]byte(g("Timestamp")))
		m.Write([]byte(ctx))
		if !hmac.Equal([]byte(base64.StdEncoding.EncodeToString(m.Sum(nil))), []byte(g("Signature"))) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"hello":"world"}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// env is a running gateway with the portal under /portal/ (start), or
// the portal alone served by httptest with no Caddy (local, local_test.go).
// Tests reach the store, the runtime and the operations alike through it.
type env struct {
	t    *testing.T
	dir  string
	base string // the site's root URL: siteBase, or local's server
	rt   *engine.Runtime
	ops  *ops.Ops
	// clock moves the runtime's clock (nil: time.Now again).
	clock func(func() time.Time)
	// logs are what the handler logged (local only).
	logs *observer.ObservedLogs
	// outcomeSeq numbers the batches addOutcomes adds.
	outcomeSeq uint64
}

// start loads a config with the echo service, the gateway and the portal
// (with portalOptions in its block) on a store in a fresh directory.
func start(t *testing.T, portalOptions string) *env {
	t.Helper()
	return startSite(t, portalOptions, false)
}

// startShop is start with echo public, its basic plan listed as a free
// self-service plan "Free" (capped kept private), and the storefront
// under /store/ with its sign-in pointing at the portal: the site a
// caller walks from browsing to calling.
func startShop(t *testing.T, portalOptions string) *env {
	t.Helper()
	return startSite(t, portalOptions, true)
}

func startSite(t *testing.T, portalOptions string, shop bool) *env {
	t.Helper()
	return startSiteWith(t, "", portalOptions, shop)
}

// startSiteWith is startSite with more global options.
func startSiteWith(t *testing.T, global, portalOptions string, shop bool) *env {
	t.Helper()
	public, basicListing, cappedListing, storefront := "", "", "", ""
	if shop {
		public = "public\n\t\t\tdisplay_name Echo"
		basicListing = "display_name Free\n\t\t\t\tself_service"
		cappedListing = "private"
		storefront = "handle_path /store/* {\n\t\tplatform_storefront {\n\t\t\tsign_in_url /portal/\n\t\t}\n\t}"
	}
	dir := t.TempDir()
	backend := signingBackend(t)
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
	%s
	platform {
		store %s/platform.db
		public_url %s
		service echo {
			backend %s
			secret %s
			%s
			endpoint hello {
				methods GET POST
				path /hello
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
				overage block
				%s
			}
			product capped {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				unit request
				price 0.5
				spending_cap 10
				%s
			}
		}
	}
}
:%d {
	bind 127.0.0.1
	%s
	handle_path /portal/* {
		platform_portal {
%s
		}
	}
	handle {
		platform_usage
		platform_gateway
		reverse_proxy {
			dynamic platform
			transport platform
		}
	}
}
`, adminPort, httpPort, global, dir, siteBase, backend.URL, echoSecret, public, basicListing, cappedListing, httpPort, storefront, portalOptions)
	unloadOtherStore(filepath.Join(dir, "platform.db"))
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	e := &env{t: t, dir: dir, base: siteBase}
	app := e.app()
	e.rt, e.ops, e.clock = app.Runtime(), app.Ops(), app.SetClock
	return e
}

// unloadOtherStore unloads a running config that serves another store: a
// reload never switches stores, a restart does.
func unloadOtherStore(path string) {
	if a, err := caddy.ActiveContext().AppIfConfigured("platform"); err == nil {
		if app, ok := a.(*platform.App); ok && app.StorePath() != filepath.Clean(path) {
			admin := fmt.Sprintf("localhost:%d", adminPort)
			if resp, err := http.Post("http://"+admin+"/load", "application/json",
				strings.NewReader(fmt.Sprintf(`{"admin": {"listen": %q}}`, admin))); err == nil {
				resp.Body.Close()
			}
		}
	}
}

func (e *env) app() *platform.App {
	e.t.Helper()
	a, err := caddy.ActiveContext().App("platform")
	if err != nil {
		e.t.Fatal(err)
	}
	return a.(*platform.App)
}

func (e *env) store() store.Store { return e.rt.Store() }

// setClock moves the portal's clock; nil puts time.Now back.
func (e *env) setClock(fn func() time.Time) { e.clock(fn) }

// newClient is a client of this env's site.
func (e *env) newClient() *client {
	c := newClient(e.t)
	c.base = e.base
	return c
}

// user gives a user a key and a subscription to echo under product.
func (e *env) user(id, product string) (string, store.KeyRecord) {
	e.t.Helper()
	key, hash, err := servicekey.Generate()
	if err != nil {
		e.t.Fatal(err)
	}
	rec := store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: id, Created: time.Now().UTC()}
	if err := e.store().CreateKey(context.Background(), rec); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.store().PutSubscription(context.Background(), store.Subscription{
		UserID: id, ServiceID: "echo", ProductID: product, Status: "ACTIVE", UpdatedAt: time.Now().UTC(),
	}); err != nil {
		e.t.Fatal(err)
	}
	return key, rec
}

// job stores a job of user.
func (e *env) job(user, status, message string) store.Job {
	e.t.Helper()
	now := time.Now().UTC()
	j := store.Job{
		ID: "job-" + servicekey.NewID(), UserID: user, ServiceID: "echo", EndpointID: "hello",
		Status: status, ErrorMessage: message, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
	}
	if err := e.store().CreateJob(context.Background(), j); err != nil {
		e.t.Fatal(err)
	}
	return j
}

func (e *env) keyByID(id string) store.KeyRecord {
	e.t.Helper()
	k, err := e.store().KeyByID(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return k
}

// invoke makes a real call through the gateway and returns its status and
// request id.
func invoke(t *testing.T, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, siteBase+"/api/service/echo/endpoint/hello/invoke", strings.NewReader(`{"q":1}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Platform-Request-ID")
}

// client is a browser without a browser: a cookie jar, redirects not
// followed so each answer is seen.
type client struct {
	t    *testing.T
	c    *http.Client
	base string // the site's root URL
}

func newClient(t *testing.T) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, base: siteBase, c: &http.Client{
		Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (c *client) do(req *http.Request) (*http.Response, string) {
	c.t.Helper()
	resp, err := c.c.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (c *client) get(p string) (*http.Response, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.base+p, nil)
	return c.do(req)
}

func (c *client) post(p string, form url.Values) (*http.Response, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.base+p, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return c.do(req)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the token of the first form of a page.
func csrf(t *testing.T, body string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no csrf field in the page:\n%s", body)
	}
	return m[1]
}

// signIn signs c in with key and returns the dashboard.
func (c *client) signIn(key string) string {
	c.t.Helper()
	_, page := c.get("/portal/")
	resp, body := c.post("/portal/signin", url.Values{"csrf": {csrf(c.t, page)}, "key": {key}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/portal/" {
		c.t.Fatalf("sign-in: %d %s\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	resp, body = c.get("/portal/")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Your usage") {
		c.t.Fatalf("dashboard after sign-in: %d\n%s", resp.StatusCode, body)
	}
	return body
}

func (c *client) cookie(name string) *http.Cookie {
	u, _ := url.Parse(c.base + "/portal/")
	for _, ck := range c.c.Jar.Cookies(u) {
		if ck.Name == name {
			return ck
		}
	}
	return nil
}

var newKeyField = regexp.MustCompile(newKeyFieldPattern)

func caddyDuration(d time.Duration) caddy.Duration { return caddy.Duration(d) }
