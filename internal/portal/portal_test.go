package portal

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// TestPortalShowsOnlyOwnData: after real calls through the gateway by two
// users, each signed-in caller sees their own subscription, usage, calls,
// jobs and keys, and nothing of the other's; the key itself is never in a
// page, and the cookie and headers are as documented.
func TestPortalShowsOnlyOwnData(t *testing.T) {
	e := start(t, "sign_in_limit 1000")
	aliceKey, aliceRec := e.user("alice", "basic")
	bobKey, bobRec := e.user("bob", "capped")
	var aliceReqs, bobReqs []string
	for range 2 {
		st, id := invoke(t, aliceKey)
		if st != http.StatusOK || id == "" {
			t.Fatalf("alice's call: %d %q", st, id)
		}
		aliceReqs = append(aliceReqs, id)
	}
	st, id := invoke(t, bobKey)
	if st != http.StatusOK {
		t.Fatalf("bob's call: %d", st)
	}
	bobReqs = append(bobReqs, id)
	aliceJob := e.job("alice", "FAILED", "alice's backend gave up")
	bobJob := e.job("bob", "RUNNING", "")

	c := newClient(t)
	resp, _ := c.get("/portal/")
	if got := resp.Header.Get("Content-Security-Policy"); got != contentSecurityPolicy {
		t.Errorf("CSP %q", got)
	}
	page := c.signIn(aliceKey)
	for _, want := range append([]string{
		"alice", aliceRec.ID, "product basic", "Used this period</dt><dd>2", "100 requests · 98 left",
		aliceJob.ID, "alice&#39;s backend gave up", "<svg role=\"img\"", `<svg class="bar"`,
	}, aliceReqs...) {
		if !strings.Contains(page, want) {
			t.Errorf("alice's page lacks %q", want)
		}
	}
	for _, leak := range append([]string{"bob", bobRec.ID, bobJob.ID, "capped", aliceKey, bobKey}, bobReqs...) {
		if strings.Contains(page, leak) {
			t.Errorf("alice's page shows %q", leak)
		}
	}
	// One script, the portal's own file for the copy buttons; none inline.
	if strings.Count(page, "<script") != 1 || !strings.Contains(page, `<script src="/portal/assets/copy.js" defer></script>`) {
		t.Error("the page has a script other than assets/copy.js")
	}
	ck := c.cookie(sessionCookie)
	if ck == nil {
		t.Fatal("no session cookie")
	}
	if strings.Contains(ck.Value, aliceKey) || len(ck.Value) != 43 {
		t.Errorf("session cookie %q is not a random id", ck.Value)
	}

	// Bob sees his spend against the cap and his own call only.
	b := newClient(t)
	page = b.signIn(bobKey)
	for _, want := range append([]string{bobRec.ID, bobJob.ID, "of a cap of 10"}, bobReqs...) {
		if !strings.Contains(page, want) {
			t.Errorf("bob's page lacks %q", want)
		}
	}
	for _, leak := range append([]string{"alice", aliceRec.ID, aliceJob.ID}, aliceReqs...) {
		if strings.Contains(page, leak) {
			t.Errorf("bob's page shows %q", leak)
		}
	}
}

// TestPortalSessionCookie: the session cookie is HttpOnly, SameSite=Strict,
// under the portal's path, and not Secure over plain HTTP (the demo); the
// pages are not cached.
func TestPortalSessionCookie(t *testing.T) {
	e := local(t, "sign_in_limit 1000\nsession_ttl 10m")
	key, _ := e.user("carol", "basic")
	c := e.newClient()
	_, page := c.get("/portal/")
	resp, _ := c.post("/portal/signin", url.Values{"csrf": {csrf(t, page)}, "key": {key}})
	var set string
	for _, v := range resp.Header.Values("Set-Cookie") {
		if strings.HasPrefix(v, sessionCookie+"=") {
			set = v
		}
	}
	for _, want := range []string{"Path=/portal/", "Max-Age=600", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(set, want) {
			t.Errorf("session cookie %q lacks %s", set, want)
		}
	}
	if strings.Contains(set, "Secure") {
		t.Errorf("session cookie %q is Secure over plain HTTP", set)
	}
	resp, _ = c.get("/portal/")
	if resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("Cache-Control %q", resp.Header.Get("Cache-Control"))
	}
	// Signing in again from the same browser ends the first session.
	first := c.cookie(sessionCookie).Value
	n := sessions.count()
	// A signed-in browser is shown the dashboard, not the form: take the
	// form from a fresh browser, then post it with the session cookie.
	f := e.newClient()
	_, form := f.get("/portal/")
	u, _ := url.Parse(e.base + "/portal/")
	c.c.Jar.SetCookies(u, []*http.Cookie{f.cookie(preCookie)})
	if resp, _ := c.post("/portal/signin", url.Values{"csrf": {csrf(t, form)}, "key": {key}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("signing in again: %d", resp.StatusCode)
	}
	if sessions.count() != n {
		t.Errorf("%d sessions after signing in again, want %d", sessions.count(), n)
	}
	if _, ok := sessions.get(first, time.Now()); ok {
		t.Error("the first session lives on")
	}
}

// TestPortalCrossUserAttempts: another user's job id in a URL, another
// user's key id in a revoke form, a forged session cookie and forms
// without their CSRF token all fail and change nothing.
func TestPortalCrossUserAttempts(t *testing.T) {
	e := start(t, "sign_in_limit 1000\nallow_key_management")
	aliceKey, aliceRec := e.user("alice", "basic")
	bobKey, bobRec := e.user("bob", "basic")
	bobJob := e.job("bob", "RUNNING", "bob's secret stage")
	aliceJob := e.job("alice", "PENDING", "")

	c := newClient(t)
	page := c.signIn(aliceKey)
	token := csrf(t, page)

	resp, body := c.get("/portal/jobs/" + url.PathEscape(bobJob.ID))
	if resp.StatusCode != http.StatusNotFound || strings.Contains(body, "bob") {
		t.Errorf("bob's job: %d\n%s", resp.StatusCode, body)
	}
	missing, _ := c.get("/portal/jobs/job-does-not-exist")
	if missing.StatusCode != http.StatusNotFound {
		t.Errorf("a missing job: %d", missing.StatusCode)
	}
	if resp, body := c.get("/portal/jobs/" + url.PathEscape(aliceJob.ID)); resp.StatusCode != http.StatusOK || !strings.Contains(body, aliceJob.ID) {
		t.Errorf("alice's own job: %d", resp.StatusCode)
	}

	resp, _ = c.post("/portal/keys/revoke", url.Values{"csrf": {token}, "key_id": {bobRec.ID}})
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("revoking bob's key: %d", resp.StatusCode)
	}
	if k := e.keyByID(bobRec.ID); !k.RevokedAt.IsZero() {
		t.Fatal("bob's key was revoked through alice's session")
	}
	if st, _ := invoke(t, bobKey); st != http.StatusOK {
		t.Errorf("bob's key after the attempt: %d", st)
	}

	for name, form := range map[string]url.Values{
		"no token":    {"key_id": {aliceRec.ID}},
		"wrong token": {"key_id": {aliceRec.ID}, "csrf": {"x" + token}},
	} {
		resp, _ := c.post("/portal/keys/revoke", form)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: revoke answered %d", name, resp.StatusCode)
		}
		resp, _ = c.post("/portal/keys", url.Values{"label": {"x"}, "csrf": form["csrf"]})
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: create answered %d", name, resp.StatusCode)
		}
	}
	if k := e.keyByID(aliceRec.ID); !k.RevokedAt.IsZero() {
		t.Fatal("a CSRF-less form revoked a key")
	}
	if keys, _ := e.store().ListKeys(context.Background(), "alice"); len(keys) != 1 {
		t.Fatalf("a CSRF-less form created a key: %d keys", len(keys))
	}
	// The sign-out form without its token does not end the session.
	if resp, _ := c.post("/portal/signout", url.Values{}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("CSRF-less sign-out: %d", resp.StatusCode)
	}

	// A forged session cookie (the key itself, or a made-up id) is no
	// session: sign in again, no data.
	for _, forged := range []string{aliceKey, strings.Repeat("A", 43), aliceRec.ID} {
		f := newClient(t)
		u, _ := url.Parse(siteBase + "/portal/")
		f.c.Jar.SetCookies(u, []*http.Cookie{{Name: sessionCookie, Value: forged, Path: "/portal/"}})
		resp, body := f.get("/portal/")
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Sign in") || strings.Contains(body, "alice") {
			t.Errorf("forged cookie %q: %d\n%s", forged, resp.StatusCode, body)
		}
		resp, _ = f.get("/portal/jobs/" + url.PathEscape(aliceJob.ID))
		if resp.StatusCode != http.StatusSeeOther {
			t.Errorf("forged cookie on a job: %d", resp.StatusCode)
		}
		resp, _ = f.post("/portal/keys/revoke", url.Values{"csrf": {token}, "key_id": {aliceRec.ID}})
		if resp.StatusCode != http.StatusSeeOther {
			t.Errorf("forged cookie revoking: %d", resp.StatusCode)
		}
	}
	if k := e.keyByID(aliceRec.ID); !k.RevokedAt.IsZero() {
		t.Fatal("a forged session revoked a key")
	}

	// A sign-in posted without the sign-in page's token (from another
	// site) is refused.
	f := newClient(t)
	resp, _ = f.post("/portal/signin", url.Values{"key": {aliceKey}})
	if resp.StatusCode != http.StatusForbidden || f.cookie(sessionCookie) != nil {
		t.Errorf("sign-in without the page's token: %d", resp.StatusCode)
	}
}

// TestPortalKeyManagement: with allow_key_management a caller creates a
// key, shown once, that works at the gateway, and revokes it, after which
// the gateway refuses it.
func TestPortalKeyManagement(t *testing.T) {
	e := start(t, "sign_in_limit 1000\nallow_key_management")
	key, rec := e.user("dana", "basic")
	c := newClient(t)
	page := c.signIn(key)
	resp, body := c.post("/portal/keys", keyForm(t, page, "ci <runner>"))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d\n%s", resp.StatusCode, body)
	}
	m := newKeyField.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("the new key is not shown:\n%s", body)
	}
	newKey := m[1]
	if !strings.Contains(body, "ci &lt;runner&gt;") {
		t.Error("the label is not shown escaped")
	}
	keys, _ := e.store().ListKeys(context.Background(), "dana")
	if len(keys) != 2 {
		t.Fatalf("%d keys after create", len(keys))
	}
	var created string
	for _, k := range keys {
		if k.ID != rec.ID {
			created = k.ID
		}
	}
	if st, _ := invoke(t, newKey); st != http.StatusOK {
		t.Fatalf("the created key at the gateway: %d", st)
	}
	_, page = c.get("/portal/")
	if strings.Contains(page, newKey) {
		t.Error("the created key is shown again")
	}
	resp, _ = c.post("/portal/keys/revoke", url.Values{"csrf": {csrf(t, page)}, "key_id": {created}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	if k := e.keyByID(created); k.RevokedAt.IsZero() {
		t.Fatal("not revoked")
	}
	if st, _ := invoke(t, newKey); st != http.StatusUnauthorized {
		t.Errorf("the revoked key at the gateway: %d", st)
	}
}

// TestPortalKeyManagementOff: by default a caller can neither create nor
// revoke keys, and the page offers no form for it.
func TestPortalKeyManagementOff(t *testing.T) {
	e := local(t, "sign_in_limit 1000")
	key, rec := e.user("erin", "basic")
	c := e.newClient()
	page := c.signIn(key)
	if strings.Contains(page, `action="/portal/keys"`) || strings.Contains(page, "/portal/keys/revoke") {
		t.Error("key forms shown with key management off")
	}
	token := csrf(t, page)
	if resp, _ := c.post("/portal/keys", url.Values{"csrf": {token}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("create: %d", resp.StatusCode)
	}
	if resp, _ := c.post("/portal/keys/revoke", url.Values{"csrf": {token}, "key_id": {rec.ID}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("revoke: %d", resp.StatusCode)
	}
	if keys, _ := e.store().ListKeys(context.Background(), "erin"); len(keys) != 1 || !keys[0].RevokedAt.IsZero() {
		t.Errorf("keys changed: %+v", keys)
	}
}

// TestPortalRevokedKeyEndsSession: a session ends at the next request once
// its key is revoked (by the operator here) or expires.
func TestPortalRevokedKeyEndsSession(t *testing.T) {
	e := local(t, "sign_in_limit 1000")
	key, rec := e.user("frank", "basic")
	c := e.newClient()
	c.signIn(key)
	before := sessions.count()
	if _, err := e.store().RevokeKey(context.Background(), rec.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, _ := c.get("/portal/")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/portal/?m=ended" {
		t.Fatalf("after revocation: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if sessions.count() != before-1 {
		t.Error("the session is still held")
	}
	if _, body := c.get("/portal/?m=ended"); !strings.Contains(body, "Sign in") || strings.Contains(body, rec.ID) {
		t.Errorf("after revocation the page is not the sign-in:\n%s", body)
	}
	// Signing in again with the revoked key is refused.
	_, page := c.get("/portal/")
	resp, body := c.post("/portal/signin", url.Values{"csrf": {csrf(t, page)}, "key": {key}})
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "revoked") {
		t.Errorf("sign-in with a revoked key: %d", resp.StatusCode)
	}
}

// TestPortalSessionExpiry: a session ends after session_ttl.
func TestPortalSessionExpiry(t *testing.T) {
	e := local(t, "sign_in_limit 1000\nsession_ttl 1m")
	key, _ := e.user("gina", "basic")
	c := e.newClient()
	c.signIn(key)
	e.setClock(func() time.Time { return time.Now().Add(2 * time.Minute) })
	resp, _ := c.get("/portal/jobs/x")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/portal/?m=expired" {
		t.Fatalf("after the TTL: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestPortalSignOut: signing out ends the session; its cookie replayed is
// no session.
func TestPortalSignOut(t *testing.T) {
	e := local(t, "sign_in_limit 1000")
	key, _ := e.user("hank", "basic")
	c := e.newClient()
	page := c.signIn(key)
	old := c.cookie(sessionCookie).Value
	resp, _ := c.post("/portal/signout", url.Values{"csrf": {csrf(t, page)}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", resp.StatusCode)
	}
	f := e.newClient()
	u, _ := url.Parse(e.base + "/portal/")
	f.c.Jar.SetCookies(u, []*http.Cookie{{Name: sessionCookie, Value: old, Path: "/portal/"}})
	if _, body := f.get("/portal/"); !strings.Contains(body, "Sign in") || strings.Contains(body, "hank") {
		t.Error("the old session cookie still works")
	}
}

// TestPortalSignInRateLimit: sign-in attempts past sign_in_limit per
// minute from one address are refused with 429, even with a good key.
func TestPortalSignInRateLimit(t *testing.T) {
	e := local(t, "sign_in_limit 3")
	key, _ := e.user("ivan", "basic")
	c := e.newClient()
	for i := range 3 {
		_, page := c.get("/portal/")
		resp, _ := c.post("/portal/signin", url.Values{"csrf": {csrf(t, page)}, "key": {"pk_wrong"}})
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %d", i+1, resp.StatusCode)
		}
	}
	_, page := c.get("/portal/")
	resp, body := c.post("/portal/signin", url.Values{"csrf": {csrf(t, page)}, "key": {key}})
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || c.cookie(sessionCookie) != nil {
		t.Fatalf("fourth attempt: %d %q\n%s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// TestPortalSignInLimitPerIPv6Network: sign-in attempts were counted
// per client address, and an IPv6 client has a /64 of them (2^64
// addresses, what one home connection gets): each address was a fresh
// bucket, a fresh sign_in_limit of attempts, so the limit limited nothing
// over IPv6 (and each address was one more bucket in memory). Attempts
// are counted per /64 for IPv6, per address for IPv4, an IPv4-mapped IPv6
// address counting as its IPv4 address.
func TestPortalSignInLimitPerIPv6Network(t *testing.T) {
	e := startSiteWith(t, "servers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}", "sign_in_limit 3", false)
	c := e.newClient()
	attempt := func(from string) int {
		t.Helper()
		_, page := c.get("/portal/")
		req, _ := http.NewRequest(http.MethodPost, c.base+"/portal/signin",
			strings.NewReader(url.Values{"csrf": {csrf(t, page)}, "key": {"pk_wrong"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Forwarded-For", from)
		resp, _ := c.do(req)
		return resp.StatusCode
	}
	steps := []struct {
		from string
		want int
	}{
		{"2001:db8:5e1:64::1", http.StatusUnauthorized},
		{"2001:db8:5e1:64::2", http.StatusUnauthorized},
		{"2001:db8:5e1:64:ffff:ffff:ffff:fffe", http.StatusUnauthorized},
		{"2001:db8:5e1:64:1234::5", http.StatusTooManyRequests}, // same /64
		{"2001:db8:5e1:65::1", http.StatusUnauthorized},         // the next /64
		{"192.0.2.64", http.StatusUnauthorized},
		{"192.0.2.64", http.StatusUnauthorized},
		{"::ffff:192.0.2.64", http.StatusUnauthorized}, // the same IPv4 address
		{"192.0.2.64", http.StatusTooManyRequests},
		{"192.0.2.65", http.StatusUnauthorized}, // IPv4: per address
	}
	for i, s := range steps {
		if got := attempt(s.from); got != s.want {
			t.Errorf("attempt %d from %s: %d, want %d", i+1, s.from, got, s.want)
		}
	}
}

// TestPortalRoutes: unknown paths, wrong methods and the stylesheet.
func TestPortalRoutes(t *testing.T) {
	e := local(t, "")
	c := e.newClient()
	if resp, _ := c.get("/portal/nope"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown path: %d", resp.StatusCode)
	}
	if resp, _ := c.get("/portal/signin"); resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /signin: %d %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	resp, body := c.get("/portal/assets/portal.css")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/css; charset=utf-8" || !strings.Contains(body, "body") {
		t.Errorf("stylesheet: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if resp, _ := c.get("/portal/assets/../portal.go"); resp.StatusCode == http.StatusOK {
		t.Error("a source file is served")
	}
}

var newKeyFieldPattern = `id="newkey" class="secret" type="text" readonly value="([^"]+)"`

func TestCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ok   bool
		want Handler
	}{
		{"platform_portal", true, Handler{}},
		{"platform_portal {\n allow_key_management\n session_ttl 10m\n sign_in_limit 5\n allow_plain_http\n}", true,
			Handler{AllowKeyManagement: true, SessionTTL: caddyDuration(10 * time.Minute), SignInLimit: 5, AllowPlainHTTP: true}},
		{"platform_portal x", false, Handler{}},
		{"platform_portal {\n session_ttl 5s\n}", false, Handler{}},
		{"platform_portal {\n sign_in_limit 0\n}", false, Handler{}},
		{"platform_portal {\n allow_key_management yes\n}", false, Handler{}},
		{"platform_portal {\n bogus\n}", false, Handler{}},
		{"platform_portal {\n session_ttl 10m\n session_ttl 20m\n}", false, Handler{}},
		{"platform_portal {\n sign_in_limit 5 6\n}", false, Handler{}},
		{"platform_portal {\n minted_keys independent\n max_active_keys 3\n key_create_limit 2\n}", true,
			Handler{MintedKeys: MintedIndependent, MaxActiveKeys: 3, KeyCreateLimit: 2}},
		{"platform_portal {\n minted_keys follow_parent\n}", true, Handler{MintedKeys: MintedFollowParent}},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if (err == nil) != tc.ok {
			t.Errorf("%q: error %v", tc.in, err)
			continue
		}
		if tc.ok && h != tc.want {
			t.Errorf("%q: got %+v", tc.in, h)
		}
	}
	// The new options' mistakes are refused with the line they are on.
	for _, tc := range []struct{ in, line string }{
		{"platform_portal {\n minted_keys\n}", ":2"},
		{"platform_portal {\n minted_keys follow-parent\n}", ":2"},
		{"platform_portal {\n minted_keys FOLLOW_PARENT\n}", ":2"},
		{"platform_portal {\n minted_keys independent follow_parent\n}", ":2"},
		{"platform_portal {\n minted_keys independent\n minted_keys follow_parent\n}", ":3"},
		{"platform_portal {\n max_active_keys 0\n}", ":2"},
		{"platform_portal {\n max_active_keys 1001\n}", ":2"},
		{"platform_portal {\n max_active_keys ten\n}", ":2"},
		{"platform_portal {\n max_active_keys\n}", ":2"},
		{"platform_portal {\n max_active_keys 5 6\n}", ":2"},
		{"platform_portal {\n max_active_keys 5\n max_active_keys 6\n}", ":3"},
		{"platform_portal {\n key_create_limit 0\n}", ":2"},
		{"platform_portal {\n key_create_limit -1\n}", ":2"},
		{"platform_portal {\n key_create_limit 1001\n}", ":2"},
		{"platform_portal {\n key_create_limit\n}", ":2"},
		{"platform_portal {\n session_ttl 10m\n key_create_limit 2\n key_create_limit 2\n}", ":4"},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if err == nil || !strings.Contains(err.Error(), "Testfile"+tc.line) {
			t.Errorf("%q: error %v, want one at line %s", tc.in, err, tc.line)
		}
	}
}

// TestPortalExpiredKeyEndsSession: a session ends at the first request
// after its key's expiry, even within the session's own TTL.
func TestPortalExpiredKeyEndsSession(t *testing.T) {
	e := local(t, "sign_in_limit 1000\nsession_ttl 24h")
	key, hash, err := servicekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: "jane", Created: now, ExpiresAt: now.Add(time.Hour)}
	if err := e.store().CreateKey(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	c := e.newClient()
	c.signIn(key)
	e.setClock(func() time.Time { return time.Now().Add(2 * time.Hour) })
	resp, _ := c.get("/portal/")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/portal/?m=ended" {
		t.Fatalf("after the key's expiry: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestPortalPlainHTTPOnlyOnLoopback: over plain HTTP the portal answers a
// client that is not on loopback with 403, and sets no cookie, unless
// allow_plain_http says TLS ends in front of it.
func TestPortalPlainHTTPOnlyOnLoopback(t *testing.T) {
	pages, err := parsePages()
	if err != nil {
		t.Fatal(err)
	}
	h := &Handler{pages: pages, logger: zap.NewNop()}
	for _, addr := range []string{"203.0.113.7:5000", "[2001:db8::1]:443", "10.0.0.1:1"} {
		req := httptest.NewRequest(http.MethodGet, "http://portal.example/", nil)
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, req, nil); err != nil {
			t.Fatal(err)
		}
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "HTTPS required") || rec.Header().Get("Set-Cookie") != "" {
			t.Errorf("%s over plain HTTP: %d %q", addr, rec.Code, rec.Header().Get("Set-Cookie"))
		}
		if rec.Header().Get("Content-Security-Policy") != contentSecurityPolicy {
			t.Error("no CSP on the refusal")
		}
	}
}

// TestPortalEarlierPeriods: usage of a past billing period is shown in its
// own row, read by the admin API's summary code at that period's time, and
// not counted in the current one.
func TestPortalEarlierPeriods(t *testing.T) {
	e := start(t, "sign_in_limit 1000")
	key, _ := e.user("kim", "basic")
	for range 3 {
		if st, _ := invoke(t, key); st != http.StatusOK {
			t.Fatalf("call: %d", st)
		}
	}
	// A month and a bit later (the product's period is a month).
	e.setClock(func() time.Time { return time.Now().Add(35 * 24 * time.Hour) })
	page := newClient(t).signIn(key)
	for _, want := range []string{"Used this period</dt><dd>0", "Earlier periods", `<td data-label="Used">3 requests</td><td data-label="Quota">100 requests</td>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if n := strings.Count(page, `<td data-label="Quota">100 requests</td>`); n != 1 {
		t.Errorf("%d earlier periods, want 1 (the subscription is a month old)", n)
	}
}

// TestPortalShowsRefusedCalls: a call the running gateway refuses (a
// spending cap reached) is on the caller's dashboard with why and the
// fix, right away (the page adds this node's unflushed counts); another
// user's refused calls are not.
func TestPortalShowsRefusedCalls(t *testing.T) {
	e := start(t, "sign_in_limit 1000")
	aliceKey, _ := e.user("alice", "capped")
	bobKey, _ := e.user("bob", "basic")
	// capped: 0.5 a call up to a cap of 10, so the 21st call is refused.
	for i := range 20 {
		if st, _ := invoke(t, aliceKey); st != http.StatusOK {
			t.Fatalf("alice's call %d: %d", i+1, st)
		}
	}
	if st, _ := invoke(t, aliceKey); st != http.StatusTooManyRequests && st != http.StatusPaymentRequired && st != http.StatusForbidden {
		t.Fatalf("alice's call past the cap: %d", st)
	}
	if _, err := e.store().PutSubscription(context.Background(), store.Subscription{
		UserID: "bob", ServiceID: "echo", ProductID: "basic", Status: "SUSPENDED", UpdatedAt: time.Now().UTC(),
	}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if st, _ := invoke(t, bobKey); st == http.StatusOK {
			t.Fatal("bob's call on a suspended subscription was answered")
		}
	}

	page := newClient(t).signIn(aliceKey)
	for _, want := range []string{
		`<td data-label="Outcome">Charged</td><td data-label="Calls">20</td>`,
		`<td data-label="Outcome">Refused: quota used up or spending cap reached</td><td data-label="Calls">1</td>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("alice's dashboard lacks %q", want)
		}
	}
	if strings.Contains(page, "refusals-note") || strings.Contains(page, "subscription not active") {
		t.Error("alice's dashboard says refusals are not recorded, or shows bob's refusals")
	}
	page = newClient(t).signIn(bobKey)
	if !strings.Contains(page, `<td data-label="Outcome">Refused: subscription not active</td><td data-label="Calls">3</td>`) ||
		strings.Contains(page, "spending cap reached") {
		t.Error("bob's dashboard lacks his refusals, or shows alice's")
	}
}

// TestSignInNetwork: what sign-in attempts are counted against, from the
// client address Caddy determined (or the peer's).
func TestSignInNetwork(t *testing.T) {
	for _, c := range []struct{ addr, want string }{
		{"192.0.2.1", "192.0.2.1"},
		{"::ffff:192.0.2.1", "192.0.2.1"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"fe80::1%eth0", "fe80::/64"},
		{"::1", "::/64"},
		{"not-an-address", "not-an-address"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/signin", nil)
		r.RemoteAddr = net.JoinHostPort(c.addr, "5000")
		if got := signInNetwork(r); got != c.want {
			t.Errorf("%s: %q, want %q", c.addr, got, c.want)
		}
	}
}
