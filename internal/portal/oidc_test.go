package portal

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/golang-jwt/jwt/v5"
	"github.com/oauth2-proxy/mockoidc"

	"github.com/platformgw/gateway/internal/ops"
)

// testIdP is a real OpenID Connect provider (mockoidc) on 127.0.0.1: it
// serves discovery, the authorization endpoint (which signs the queued
// user in at once), the token endpoint (which checks the PKCE verifier)
// and its keys. tamper, when set, rewrites the claims of the ID tokens
// it issues and signs them again with its own key, so a token that is
// wrong in one way only (issuer, audience, nonce) is otherwise genuine.
type testIdP struct {
	*mockoidc.MockOIDC
	mu     sync.Mutex
	tamper func(jwt.MapClaims)
	// issued are the tokens its token endpoint answered.
	issued []string
}

// newTestIdP starts a provider on ln (a fresh loopback port if nil),
// with the client id and secret given (its own random ones if empty).
func newTestIdP(t *testing.T, ln net.Listener, clientID, clientSecret string) *testIdP {
	t.Helper()
	m, err := mockoidc.NewServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	if clientID != "" {
		m.ClientID, m.ClientSecret = clientID, clientSecret
	}
	p := &testIdP{MockOIDC: m}
	if err := m.AddMiddleware(p.tamperTokens); err != nil {
		t.Fatal(err)
	}
	if ln == nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Start(ln, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return p
}

func (p *testIdP) setTamper(fn func(jwt.MapClaims)) {
	p.mu.Lock()
	p.tamper = fn
	p.mu.Unlock()
}

func (p *testIdP) tamperTokens(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		tamper := p.tamper
		p.mu.Unlock()
		if r.URL.Path != mockoidc.TokenEndpoint {
			next.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			http.Error(w, "test provider: "+err.Error(), http.StatusInternalServerError)
			return
		}
		if raw, ok := body["id_token"].(string); ok && tamper != nil {
			claims := jwt.MapClaims{}
			if _, _, err := jwt.NewParser().ParseUnverified(raw, claims); err != nil {
				http.Error(w, "test provider: "+err.Error(), http.StatusInternalServerError)
				return
			}
			tamper(claims)
			signed, err := p.Keypair.SignJWT(claims)
			if err != nil {
				http.Error(w, "test provider: "+err.Error(), http.StatusInternalServerError)
				return
			}
			body["id_token"] = signed
		}
		p.mu.Lock()
		for _, k := range []string{"id_token", "access_token", "refresh_token"} {
			if v, ok := body[k].(string); ok {
				p.issued = append(p.issued, v)
			}
		}
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.Code)
		_ = json.NewEncoder(w).Encode(body)
	})
}

// oidcOptions is the portal's oidc block for the provider, the portal
// being on site (siteBase, or local's "{site}").
func oidcOptions(p *testIdP, site, extra string) string {
	return fmt.Sprintf(`sign_in_limit 1000
allow_key_management
oidc {
	name "Test IdP"
	issuer %s
	client_id %s
	client_secret %s
	redirect_url %s/portal/oidc/callback
%s
}`, p.Issuer(), p.ClientID, p.ClientSecret, site, extra)
}

// noRedirects is the provider's side of a browser: it follows nothing.
var noRedirects = &http.Client{
	Timeout:       10 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// oidcCallbackURL starts a sign-in and goes through the provider; it
// returns the callback the provider sends the browser to (not yet
// followed).
func (c *client) oidcCallbackURL() string {
	c.t.Helper()
	resp, body := c.get("/portal/oidc/start")
	if resp.StatusCode != http.StatusSeeOther {
		c.t.Fatalf("start: %d\n%s", resp.StatusCode, body)
	}
	auth := resp.Header.Get("Location")
	u, err := url.Parse(auth)
	if err != nil {
		c.t.Fatal(err)
	}
	q := u.Query()
	if q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("nonce") == "" || q.Get("state") == "" {
		c.t.Fatalf("authorization request without PKCE, nonce or state: %s", auth)
	}
	pr, err := noRedirects.Get(auth)
	if err != nil {
		c.t.Fatal(err)
	}
	pr.Body.Close()
	cb := pr.Header.Get("Location")
	if pr.StatusCode != http.StatusFound || !strings.HasPrefix(cb, c.base+"/portal/oidc/callback?") {
		c.t.Fatalf("provider: %d %s", pr.StatusCode, cb)
	}
	return cb
}

// callback follows a callback URL in this browser.
func (c *client) callback(cb string) (*http.Response, string) {
	c.t.Helper()
	return c.get(strings.TrimPrefix(cb, c.base))
}

// oidcSignIn signs c in through the provider and returns the dashboard.
func (c *client) oidcSignIn() string {
	c.t.Helper()
	resp, body := c.callback(c.oidcCallbackURL())
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `http-equiv="refresh"`) {
		c.t.Fatalf("callback: %d\n%s", resp.StatusCode, body)
	}
	resp, body = c.get("/portal/")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Your usage") {
		c.t.Fatalf("dashboard after sign-in: %d\n%s", resp.StatusCode, body)
	}
	return body
}

// TestOIDCSignIn: the whole flow over loopback against the provider: a
// session for the verified email address, an empty dashboard that says
// so, the sign-in audited, the state cookie gone, and keys made with no
// parent and no roles.
func TestOIDCSignIn(t *testing.T) {
	idp := newTestIdP(t, nil, "", "")
	e := start(t, oidcOptions(idp, siteBase, ""))
	c := e.newClient()

	_, page := c.get("/portal/")
	if !strings.Contains(page, `href="/portal/oidc/start"`) || !strings.Contains(page, "Sign in with Test IdP") {
		t.Fatalf("no provider button on the sign-in page:\n%s", page)
	}
	resp, _ := c.get("/portal/oidc/start")
	var flow *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == oidcCookie {
			flow = ck
		}
	}
	if flow == nil || !flow.HttpOnly || flow.SameSite != http.SameSiteLaxMode || flow.Path != "/portal/oidc/" ||
		flow.MaxAge <= 0 || flow.MaxAge > int(oidcFlowTTL/time.Second) {
		t.Fatalf("state cookie: %+v", flow)
	}

	c = e.newClient()
	body := c.oidcSignIn()
	if !strings.Contains(body, "jane.doe@example.com") || !strings.Contains(body, "You have no subscriptions yet.") {
		t.Fatalf("dashboard of the new user:\n%s", body)
	}
	if ck := c.cookie(sessionCookie); ck == nil {
		t.Fatal("no session cookie")
	}
	u, _ := url.Parse(siteBase + "/portal/oidc/callback")
	for _, ck := range c.c.Jar.Cookies(u) {
		if ck.Name == oidcCookie {
			t.Error("the state cookie outlived the callback")
		}
	}
	audit, _, err := e.store().ListAudit(context.Background(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range audit {
		if a.Action == ops.AuditPortalSignIn && a.UserID == "jane.doe@example.com" && strings.Contains(a.Detail, "Test IdP") {
			found = true
		}
	}
	if !found {
		t.Errorf("no sign-in in the audit log: %+v", audit)
	}

	// A key made by a caller who signed in with the provider.
	resp, body = c.post("/portal/keys", keyForm(t, body, "first"))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create key: %d\n%s", resp.StatusCode, body)
	}
	keys, err := e.store().ListKeys(context.Background(), "jane.doe@example.com")
	if err != nil || len(keys) != 1 || keys[0].ParentKeyID != "" || len(keys[0].Roles) != 0 || keys[0].Label != "first" {
		t.Fatalf("keys: %+v %v", keys, err)
	}
	// Sign-out ends the session as it does a key's.
	_, body = c.get("/portal/")
	if resp, _ := c.post("/portal/signout", url.Values{"csrf": {csrf(t, body)}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", resp.StatusCode)
	}
	if _, body := c.get("/portal/"); strings.Contains(body, "jane.doe@example.com") {
		t.Error("still signed in after sign-out")
	}
}

// TestOIDCRefusals: each way a callback can be wrong is refused with a
// sentence and no session: a wrong issuer, audience or nonce, an expired
// ID token, a missing or unverified email address, a state that is not
// the cookie's, no cookie at all.
func TestOIDCRefusals(t *testing.T) {
	idp := newTestIdP(t, nil, "", "")
	e := start(t, oidcOptions(idp, siteBase, ""))

	refused := func(t *testing.T, c *client, resp *http.Response, body string, status int, want string) {
		t.Helper()
		if resp.StatusCode != status || !strings.Contains(body, want) {
			t.Fatalf("got %d, want %d with %q:\n%s", resp.StatusCode, status, want, body)
		}
		if strings.Contains(body, "{") || strings.Contains(body, "eyJ") {
			t.Errorf("the page shows JSON or a token:\n%s", body)
		}
		if ck := c.cookie(sessionCookie); ck != nil {
			t.Errorf("a session cookie was set: %v", ck)
		}
	}
	for _, tc := range []struct {
		name   string
		tamper func(jwt.MapClaims)
		before func()
		status int
		want   string
	}{
		{name: "wrong issuer", tamper: func(c jwt.MapClaims) { c["iss"] = "http://127.0.0.1:1/oidc" },
			status: http.StatusUnauthorized, want: "could not be verified"},
		{name: "wrong audience", tamper: func(c jwt.MapClaims) { c["aud"] = []string{"someone-else"} },
			status: http.StatusUnauthorized, want: "could not be verified"},
		{name: "wrong nonce", tamper: func(c jwt.MapClaims) { c["nonce"] = "not-the-one-sent" },
			status: http.StatusUnauthorized, want: "could not be verified"},
		{name: "no nonce", tamper: func(c jwt.MapClaims) { delete(c, "nonce") },
			status: http.StatusUnauthorized, want: "could not be verified"},
		{name: "expired ID token", tamper: func(c jwt.MapClaims) {
			c["iat"], c["exp"] = time.Now().Add(-time.Hour).Unix(), time.Now().Add(-time.Minute).Unix()
		}, status: http.StatusUnauthorized, want: "may have expired"},
		{name: "no email", before: func() {
			idp.QueueUser(&mockoidc.MockUser{Subject: "s-1", PreferredUsername: "noemail"})
		}, status: http.StatusForbidden, want: "did not tell the portal your email address"},
		{name: "unverified email", before: func() {
			idp.QueueUser(&mockoidc.MockUser{Subject: "s-2", Email: "mallory@example.com", EmailVerified: false})
		}, status: http.StatusForbidden, want: "not verified"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idp.setTamper(tc.tamper)
			defer idp.setTamper(nil)
			if tc.before != nil {
				tc.before()
			}
			c := e.newClient()
			resp, body := c.callback(c.oidcCallbackURL())
			refused(t, c, resp, body, tc.status, tc.want)
		})
	}

	t.Run("state not the cookie's", func(t *testing.T) {
		c := e.newClient()
		cb := c.oidcCallbackURL()
		u, _ := url.Parse(cb)
		q := u.Query()
		q.Set("state", "forged")
		u.RawQuery = q.Encode()
		resp, body := c.callback(u.String())
		refused(t, c, resp, body, http.StatusForbidden, "does not belong to the sign-in this browser started")
	})
	t.Run("answer from another issuer", func(t *testing.T) {
		c := e.newClient()
		u, _ := url.Parse(c.oidcCallbackURL())
		q := u.Query()
		q.Set("iss", "http://127.0.0.1:1/oidc")
		u.RawQuery = q.Encode()
		resp, body := c.callback(u.String())
		refused(t, c, resp, body, http.StatusForbidden, "did not come from Test IdP")
	})
	t.Run("no cookie", func(t *testing.T) {
		cb := e.newClient().oidcCallbackURL()
		c := e.newClient()
		resp, body := c.callback(cb)
		refused(t, c, resp, body, http.StatusBadRequest, "not started in this browser")
	})
	t.Run("provider error", func(t *testing.T) {
		c := e.newClient()
		cb := c.oidcCallbackURL()
		u, _ := url.Parse(cb)
		q := u.Query()
		q.Del("code")
		q.Set("error", "access_denied")
		q.Set("error_description", "<b>{json}</b>")
		u.RawQuery = q.Encode()
		resp, body := c.callback(u.String())
		refused(t, c, resp, body, http.StatusUnauthorized, "was cancelled or refused")
	})
	t.Run("expired state cookie", func(t *testing.T) {
		c := e.newClient()
		cb := c.oidcCallbackURL()
		e.setClock(func() time.Time { return time.Now().Add(oidcFlowTTL + time.Minute) })
		defer e.setClock(nil)
		resp, body := c.callback(cb)
		refused(t, c, resp, body, http.StatusBadRequest, "started too long ago")
	})
}

// TestOIDCReplayedState: a callback URL used once is refused the second
// time, even by a browser that still presents the state cookie it came
// with.
func TestOIDCReplayedState(t *testing.T) {
	idp := newTestIdP(t, nil, "", "")
	e := start(t, oidcOptions(idp, siteBase, ""))
	c := e.newClient()
	cb := c.oidcCallbackURL()
	flow := c.cookie(oidcCookie) // under /portal/ too: the jar's match
	if flow == nil {
		u, _ := url.Parse(siteBase + "/portal/oidc/callback")
		for _, ck := range c.c.Jar.Cookies(u) {
			if ck.Name == oidcCookie {
				flow = ck
			}
		}
	}
	if flow == nil {
		t.Fatal("no state cookie")
	}
	if resp, body := c.callback(cb); resp.StatusCode != http.StatusOK {
		t.Fatalf("first callback: %d\n%s", resp.StatusCode, body)
	}
	// The attacker's browser replays the callback with the stolen cookie.
	a := e.newClient()
	u, _ := url.Parse(siteBase + "/portal/oidc/")
	a.c.Jar.SetCookies(u, []*http.Cookie{{Name: oidcCookie, Value: flow.Value, Path: "/portal/oidc/"}})
	resp, body := a.callback(cb)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "already used") {
		t.Fatalf("replayed callback: %d\n%s", resp.StatusCode, body)
	}
	if a.cookie(sessionCookie) != nil {
		t.Error("the replay got a session")
	}
}

// TestOIDCProviderDownAtStart: a config whose provider cannot be reached
// loads; key sign-in works, the provider's button says it is not
// available, and once the provider answers (found again with backoff)
// its sign-in works.
func TestOIDCProviderDownAtStart(t *testing.T) {
	defer func(first time.Duration) { discoveryFirstGap = first }(discoveryFirstGap)
	discoveryFirstGap = 50 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	opts := fmt.Sprintf(`sign_in_limit 1000
oidc {
	name "Test IdP"
	issuer http://%s/oidc
	client_id portal
	client_secret not-yet
	redirect_url %s/portal/oidc/callback
}`, addr, siteBase)
	e := start(t, opts)
	key, _ := e.user("kim", "basic")
	c := e.newClient()
	c.signIn(key)

	c = e.newClient()
	resp, body := c.get("/portal/oidc/start")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "sign in with a service key") {
		t.Fatalf("start while the provider is down: %d\n%s", resp.StatusCode, body)
	}

	// The provider comes up on the address the config names.
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the provider's port was taken meanwhile: %v", err)
	}
	newTestIdP(t, ln, "portal", "not-yet")
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, _ = c.get("/portal/oidc/start")
		if resp.StatusCode == http.StatusSeeOther || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the provider was not found again: %d", resp.StatusCode)
	}
	c.oidcSignIn()
}

// TestUserFromClaims: the claim that names the user, the domains
// allowed, and the one rule for a user id.
func TestUserFromClaims(t *testing.T) {
	base := func(claim string, domains ...string) *OIDC {
		o := &OIDC{Issuer: "https://id.example.com", ClientID: "c", RedirectURL: "https://p.example.com/portal/oidc/callback",
			UserClaim: claim, AllowedDomains: domains}
		if err := o.check(); err != nil {
			t.Fatal(err)
		}
		return o
	}
	ok := idClaims{Subject: "248289761001", Email: "Ann@Example.com", EmailVerified: true, PreferredUsername: "ann"}
	for _, tc := range []struct {
		name string
		o    *OIDC
		c    idClaims
		want string // "" when refused
	}{
		{"email", base(""), ok, "ann@example.com"},
		{"email verified as a string", base("email"), idClaims{Email: "a@b.co", EmailVerified: "true"}, "a@b.co"},
		{"email unverified", base("email"), idClaims{Email: "a@b.co", EmailVerified: false}, ""},
		{"email verified missing", base("email"), idClaims{Email: "a@b.co"}, ""},
		{"no email", base("email"), idClaims{Subject: "x"}, ""},
		{"sub", base("sub"), ok, "248289761001"},
		{"sub without email", base("sub"), idClaims{Subject: "x"}, "x"},
		{"preferred_username", base("preferred_username"), ok, "ann"},
		{"preferred_username missing", base("preferred_username"), idClaims{Subject: "x"}, ""},
		{"sub with a slash", base("sub"), idClaims{Subject: "a/b"}, ""},
		{"allowed domain", base("sub", "example.com"), ok, "248289761001"},
		{"other domain", base("sub", "example.org"), ok, ""},
		{"domain needs a verified email", base("sub", "example.com"), idClaims{Subject: "x", Email: "a@example.com"}, ""},
	} {
		got, err := userFromClaims(tc.o, tc.c)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

// TestOIDCCaddyfile: the oidc block, and its mistakes named by line.
func TestOIDCCaddyfile(t *testing.T) {
	in := `platform_portal {
	oidc {
		name "Example SSO"
		issuer https://id.example.com/realms/main
		client_id portal
		client_secret {env.PORTAL_OIDC_SECRET}
		redirect_url https://api.example.com/portal/oidc/callback
		user_claim sub
		scopes openid email
		allowed_domains example.com example.org
	}
}`
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
		t.Fatal(err)
	}
	want := OIDC{Name: "Example SSO", Issuer: "https://id.example.com/realms/main", ClientID: "portal",
		ClientSecret: "{env.PORTAL_OIDC_SECRET}", RedirectURL: "https://api.example.com/portal/oidc/callback",
		UserClaim: "sub", Scopes: []string{"openid", "email"}, AllowedDomains: []string{"example.com", "example.org"}}
	if h.OIDC == nil || fmt.Sprint(*h.OIDC) != fmt.Sprint(want) {
		t.Fatalf("got %+v", h.OIDC)
	}
	const ok3 = "\t\tissuer https://id.example.com\n\t\tclient_id c\n\t\tredirect_url https://p.example.com/oidc/callback\n"
	for _, tc := range []struct{ in, line string }{
		{"platform_portal {\n oidc x {\n }\n}", ":2"},
		{"platform_portal {\n oidc {\n  issuer https://id.example.com\n }\n}", "needs issuer, client_id and redirect_url"},
		{"platform_portal {\n oidc {\n  issuer ftp://id.example.com\n }\n}", ":3"},
		{"platform_portal {\n oidc {\n  issuer\n }\n}", ":3"},
		{"platform_portal {\n oidc {\n  issuer https://a.example.com https://b.example.com\n }\n}", ":3"},
		{"platform_portal {\n oidc {\n" + ok3 + "  redirect_url https://p.example.com/portal/callback\n }\n}", ":6"},
		{"platform_portal {\n oidc {\n" + ok3 + "  user_claim name\n }\n}", ":6"},
		{"platform_portal {\n oidc {\n" + ok3 + "  allowed_domains a@b.com\n }\n}", ":6"},
		{"platform_portal {\n oidc {\n" + ok3 + "  scopes\n }\n}", ":6"},
		{"platform_portal {\n oidc {\n" + ok3 + "  client_id d\n }\n}", ":6"},
		{"platform_portal {\n oidc {\n" + ok3 + "  bogus 1\n }\n}", ":6"},
		{"platform_portal {\n oidc {\n" + ok3 + " }\n oidc {\n" + ok3 + " }\n}", ":7"},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		want := tc.line
		if strings.HasPrefix(want, ":") {
			want = "Testfile" + want
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", tc.in, err, want)
		}
	}
}

// TestOIDCCaddyfileErrorsKeepSecrets: a refused oidc line does not
// repeat its value. d.ArgErr() wrote "…after 'SECOND-HALF'" for a
// client_secret pasted with a space (a review of security by default).
func TestOIDCCaddyfileErrorsKeepSecrets(t *testing.T) {
	const ok = "  issuer https://id.example.com\n  client_id gw\n  redirect_url https://x.example.com/portal/oidc/callback\n"
	for _, tc := range []struct{ line, want string }{
		{"  client_secret first-half SECOND-SECRET-half\n", "client_secret takes one value, found 2"},
		{"  client_secret SECOND-SECRET-a SECOND-SECRET-b SECOND-SECRET-c\n", "client_secret takes one value, found 3"},
		{"  client_secret\n", "client_secret takes one value, found 0"},
		{"  issuer htps://u:SECOND-SECRET@id.example.com/x?y\n", "issuer 'htps://id.example.com/…'"},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("platform_portal {\n oidc {\n" + tc.line + ok + " }\n}"))
		switch {
		case err == nil:
			t.Errorf("%q: no error", tc.line)
		case strings.Contains(err.Error(), "SECOND-SECRET"):
			t.Errorf("the error repeats the secret: %s", err)
		case !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Testfile:3"):
			t.Errorf("%q: error %v, want %q at Testfile:3", tc.line, err, tc.want)
		}
	}
}

// TestOIDCLogsNoSecrets: what sign-ins log, accepted or refused, holds
// no token, code, state, nonce, PKCE verifier, client secret or cookie
// value, and names the user and the reason.
func TestOIDCLogsNoSecrets(t *testing.T) {
	idp := newTestIdP(t, nil, "", "")
	e := local(t, oidcOptions(idp, "{site}", ""))
	var secrets []string
	flowOf := func(c *client) oidcFlow {
		t.Helper()
		u, _ := url.Parse(c.base + "/portal/oidc/callback")
		for _, ck := range c.c.Jar.Cookies(u) {
			if ck.Name == oidcCookie {
				f, err := openFlow(ck.Value, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				secrets = append(secrets, ck.Value, f.Nonce, f.Verifier, f.State)
				return f
			}
		}
		t.Fatal("no state cookie")
		return oidcFlow{}
	}
	codeOf := func(cb string) {
		u, _ := url.Parse(cb)
		secrets = append(secrets, u.Query().Get("code"), u.Query().Get("state"))
	}

	c := e.newClient()
	cb := c.oidcCallbackURL()
	f := flowOf(c)
	codeOf(cb)
	if resp, body := c.callback(cb); resp.StatusCode != http.StatusOK {
		t.Fatalf("callback: %d\n%s", resp.StatusCode, body)
	}
	secrets = append(secrets, c.cookie(sessionCookie).Value)
	u, _ := url.Parse(e.base + "/portal/oidc/")
	c.c.Jar.SetCookies(u, []*http.Cookie{{Name: oidcCookie, Value: sealFlow(f), Path: "/portal/oidc/"}})
	if resp, _ := c.callback(cb); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("replay: %d", resp.StatusCode)
	}
	idp.setTamper(func(c jwt.MapClaims) { c["nonce"] = "x" })
	c = e.newClient()
	cb = c.oidcCallbackURL()
	flowOf(c)
	codeOf(cb)
	if resp, _ := c.callback(cb); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong nonce: %d", resp.StatusCode)
	}
	idp.mu.Lock()
	secrets = append(secrets, idp.issued...)
	idp.mu.Unlock()
	secrets = append(secrets, idp.ClientSecret)

	var reasons []string
	for _, entry := range e.logs.All() {
		line := entry.Message + " " + fmt.Sprint(entry.ContextMap())
		for _, s := range secrets {
			if s != "" && strings.Contains(line, s) {
				t.Errorf("a log line holds a secret %.12s…: %s", s, line)
			}
		}
		if r, ok := entry.ContextMap()["reason"].(string); ok {
			reasons = append(reasons, r)
		}
		if entry.Message == "portal sign-in" && entry.ContextMap()["user_id"] != "jane.doe@example.com" {
			t.Errorf("sign-in logged without its user: %v", entry.ContextMap())
		}
	}
	if want := []string{"state already used", "ID token refused: nonce does not match the cookie's"}; fmt.Sprint(reasons) != fmt.Sprint(want) {
		t.Errorf("reasons logged: %q, want %q", reasons, want)
	}
	if len(secrets) < 12 {
		t.Errorf("only %d secrets collected", len(secrets))
	}
}

// TestOIDCSecretFromEnvironment: client_secret may name an environment
// variable, replaced at provision, so the secret is not in the config.
func TestOIDCSecretFromEnvironment(t *testing.T) {
	idp := newTestIdP(t, nil, "portal-env", "s3cret-from-env")
	t.Setenv("PORTAL_TEST_OIDC_SECRET", "s3cret-from-env")
	opts := `sign_in_limit 1000
oidc {
	issuer ` + idp.Issuer() + `
	client_id portal-env
	client_secret {env.PORTAL_TEST_OIDC_SECRET}
	redirect_url {site}/portal/oidc/callback
	user_claim sub
}`
	e := local(t, opts)
	c := e.newClient()
	resp, body := c.callback(c.oidcCallbackURL())
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("callback with the secret from the environment: %d\n%s", resp.StatusCode, body)
	}
	if _, body := c.get("/portal/"); !strings.Contains(body, "1234567890") {
		t.Errorf("not signed in as the subject:\n%s", body)
	}
}
