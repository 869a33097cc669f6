package console

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/platformgw/gateway/internal/onceform"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/platform"
)

// ssoToken is the single sign-on cookie the test's auth service takes as
// alice's.
const ssoToken = "good-sso-token"

// ssoService is a small forward_auth service on 127.0.0.1: /verify
// answers 200 with Remote-User: alice for a request carrying the cookie
// sso=ssoToken and 401 otherwise; /verify-nouser answers 200 to anyone
// without naming a user (a misconfigured service).
func ssoService(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/verify", func(w http.ResponseWriter, r *http.Request) {
		if c, err := r.Cookie("sso"); err == nil && c.Value == ssoToken {
			w.Header().Set("Remote-User", "alice")
			w.WriteHeader(http.StatusOK)
			return
		}
		http.Error(w, "sso: sign in first", http.StatusUnauthorized)
	})
	mux.HandleFunc("/verify-nouser", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// docForwardAuthSite is the forward_auth site block of docs/console.md,
// as an operator would copy it.
func docForwardAuthSite(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "console.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range regexp.MustCompile("(?s)```caddyfile\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		if strings.Contains(block[1], "forward_auth") {
			return block[1]
		}
	}
	t.Fatal("docs/console.md has no caddyfile block with forward_auth")
	return ""
}

// startSite runs the platform app (the weather service of start) and
// site, a site block whose address is :8080 and whose single sign-on
// service is 127.0.0.1:9091, both replaced by the test's.
func startSite(t *testing.T, site, sso string) (*platform.App, string) {
	t.Helper()
	site = strings.Replace(site, ":8080 {", fmt.Sprintf("http://127.0.0.1:%d {", httpPort), 1)
	site = strings.ReplaceAll(site, "127.0.0.1:9091", sso)
	config := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	platform {
		store %s
		public_url http://127.0.0.1:%d
		service weather {
			backend http://127.0.0.1:9
			secret %s
			endpoint hello {
				methods GET
				path /hello
			}
			product credits {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 0.5
			}
		}
	}
}
%s`, adminPort, httpPort, filepath.Join(t.TempDir(), "platform.db"), httpPort, testSecret, site)
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(config, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		req, _ := http.NewRequest("POST", fmt.Sprintf("http://localhost:%d/load", adminPort),
			strings.NewReader(fmt.Sprintf(`{"admin": {"listen": "localhost:%d"}}`, adminPort)))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	a, err := caddy.ActiveContext().App("platform")
	if err != nil {
		t.Fatal(err)
	}
	return a.(*platform.App), fmt.Sprintf("http://127.0.0.1:%d", httpPort)
}

// fwdGet GETs url with the given cookies and extra request headers.
func fwdGet(t *testing.T, u string, cookies []*http.Cookie, hdr map[string]string) (int, string, *http.Response) {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	for _, c := range cookies {
		req.AddCookie(c)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp
}

var onceRE = regexp.MustCompile(`name="` + onceform.Field + `" value="([^"]+)"`)

// The console behind forward_auth, with the Caddyfile of docs/console.md:
// the operator the single sign-on names gets the console under that name
// and changes are audited under it; a caller without the sign-on gets the
// sign-on's refusal; a caller who names himself in Remote-User never gets
// in, with or without a sign-on; a sign-on that answers 200 without a
// user gets the console's 403. It also shows why the doc's block is as it
// is: forward_auth alone leaves {http.auth.user.id} empty (everyone gets
// 403), and without route Caddy runs vars before forward_auth, so the
// user id would be the caller's own header.
func TestConsoleBehindForwardAuth(t *testing.T) {
	sso := ssoService(t)
	site := docForwardAuthSite(t)
	for _, line := range []string{"route {", "copy_headers Remote-User", "vars http.auth.user.id {http.request.header.Remote-User}", "platform_console {"} {
		if !strings.Contains(site, line) {
			t.Fatalf("docs/console.md's forward_auth block lacks %q:\n%s", line, site)
		}
	}
	good := []*http.Cookie{{Name: "sso", Value: ssoToken}}
	forged := map[string]string{"Remote-User": "mallory"}

	t.Run("doc", func(t *testing.T) {
		app, base := startSite(t, site, sso)
		ctx := context.Background()
		if _, err := app.Ops().PutSubscription(ctx, "test", "bob", "weather", "credits", ""); err != nil {
			t.Fatal(err)
		}
		code, body, resp := fwdGet(t, base+"/console/users/bob", good, nil)
		if code != 200 || !strings.Contains(body, "Signed in as alice") {
			t.Fatalf("signed-in operator: %d %.300s", code, body)
		}
		// A change is audited under the sign-on's user.
		var csrfC *http.Cookie
		for _, c := range resp.Cookies() {
			if c.Name == csrfCookie {
				csrfC = c
			}
		}
		tok, once := tokenRE.FindStringSubmatch(body), onceRE.FindStringSubmatch(body)
		if csrfC == nil || tok == nil || once == nil {
			t.Fatal("no CSRF cookie, token or one-time value on the user page")
		}
		form := url.Values{"serviceId": {"weather"}, "amount": {"5"}, "csrf": {tok[1]}, onceform.Field: {once[1]}}
		req, _ := http.NewRequest("POST", base+"/console/users/bob/credits", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(good[0])
		req.AddCookie(csrfC)
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		pr, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		pr.Body.Close()
		if pr.StatusCode != http.StatusSeeOther {
			t.Fatalf("POST credits: %d", pr.StatusCode)
		}
		entries, _, _ := app.Ops().AuditLog(ctx, "", 10)
		if len(entries) == 0 || entries[0].Actor != "console:alice" || entries[0].Action != ops.AuditCreditsAdd {
			t.Fatalf("audit %+v, want credits.add by console:alice", entries)
		}

		// The good sign-on with a forged Remote-User: still alice.
		if code, body, _ := fwdGet(t, base+"/console/", good, forged); code != 200 || !strings.Contains(body, "Signed in as alice") || strings.Contains(body, "mallory") {
			t.Fatalf("good sign-on, forged Remote-User: %d %.300s", code, body)
		}
		// No sign-on: the sign-on service's refusal, with or without a
		// forged Remote-User.
		for name, hdr := range map[string]map[string]string{"no token": nil, "forged Remote-User": forged, "forged alice": {"Remote-User": "alice"}} {
			code, body, _ := fwdGet(t, base+"/console/", nil, hdr)
			if code != http.StatusUnauthorized || !strings.Contains(body, "sso: sign in first") {
				t.Errorf("%s: %d %.200s, want the sign-on's 401", name, code, body)
			}
		}
		bad := []*http.Cookie{{Name: "sso", Value: "guessed"}}
		if code, _, _ := fwdGet(t, base+"/console/", bad, map[string]string{"Remote-User": "alice"}); code != http.StatusUnauthorized {
			t.Errorf("bad token, forged alice: %d, want 401", code)
		}
	})

	t.Run("sign-on names no user", func(t *testing.T) {
		_, base := startSite(t, strings.ReplaceAll(site, "uri /verify", "uri /verify-nouser"), sso)
		for name, hdr := range map[string]map[string]string{"no header": nil, "forged Remote-User": {"Remote-User": "alice"}} {
			code, body, _ := fwdGet(t, base+"/console/", nil, hdr)
			if code != http.StatusForbidden || strings.Contains(body, "Signed in") {
				t.Errorf("%s: %d %.200s, want the console's 403", name, code, body)
			}
		}
	})

	// The advice docs/console.md gave before: forward_auth (with
	// copy_headers) in front of platform_console and nothing else. Caddy's
	// forward_auth does not set {http.auth.user.id}, so the console refuses
	// the signed-in operator too.
	t.Run("forward_auth alone", func(t *testing.T) {
		alone := strings.Replace(site, "vars http.auth.user.id {http.request.header.Remote-User}", "", 1)
		_, base := startSite(t, alone, sso)
		if code, _, _ := fwdGet(t, base+"/console/", good, nil); code != http.StatusForbidden {
			t.Errorf("forward_auth without vars, signed in: %d, want 403 (no user id)", code)
		}
	})

	// Without route, the Caddyfile's directive order puts vars before
	// forward_auth: the user id is then read from the caller's own
	// Remote-User before forward_auth replaces it.
	t.Run("without route", func(t *testing.T) {
		unrouted := strings.Replace(site, "route {", "handle {", 1)
		_, base := startSite(t, unrouted, sso)
		code, body, _ := fwdGet(t, base+"/console/", good, forged)
		if code != 200 || !strings.Contains(body, "Signed in as mallory") {
			t.Fatalf("without route, forged Remote-User: %d %.200s; the doc's reason for route no longer holds", code, body)
		}
	})
}
