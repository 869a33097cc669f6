package console

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestConsolePlainHTTPOnlyOnLoopback: over plain HTTP the console answers
// a client that is not on loopback with 403 "HTTPS required", the same
// answer with or without a signed-in operator (so the refusal says
// nothing of the credentials sent), with no cookie and nothing changed by
// a POST. Loopback over plain HTTP, any client over TLS, and any client
// with allow_plain_http (TLS ended in a proxy in front) are served.
func TestConsolePlainHTTPOnlyOnLoopback(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	for _, addr := range []string{"203.0.113.7:5000", "[2001:db8::1]:443", "10.0.0.1:1", "192.168.1.20:8080"} {
		var bodies []string
		for _, who := range []string{"", "alice"} {
			for _, path := range []string{"/console/", "/console/users", "/console/assets/console.css"} {
				r := httptest.NewRequest("GET", path, nil)
				r.RemoteAddr = addr
				r.Header.Set("X-Forwarded-For", "127.0.0.1")
				w := serveFrom(h, r, who)
				if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "HTTPS required") {
					t.Errorf("GET %s from %s as %q over plain HTTP: %d %q", path, addr, who, w.Code, w.Body)
				}
				if c := w.Header().Values("Set-Cookie"); len(c) != 0 {
					t.Errorf("GET %s from %s: cookies %q on the refusal", path, addr, c)
				}
				if w.Header().Get("WWW-Authenticate") != "" || !strings.Contains(w.Header().Get("Content-Security-Policy"), "default-src 'none'") {
					t.Errorf("GET %s from %s: headers %v", path, addr, w.Header())
				}
				bodies = append(bodies, w.Body.String())
			}
		}
		for _, b := range bodies[1:] {
			if b != bodies[0] {
				t.Errorf("from %s the refusals differ: %q and %q", addr, bodies[0], b)
			}
		}
	}

	// A POST from afar changes nothing, even with a good CSRF token.
	c, tok := session(t, h, "/console/users/u-far?new=1", "alice")
	form := url.Values{"csrf": {tok}, "serviceId": {"weather"}, "productId": {"basic"}, "status": {"ACTIVE"}}
	r := httptest.NewRequest("POST", "/console/users/u-far/subscription", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.AddCookie(c)
	r.RemoteAddr = "198.51.100.9:4444"
	if w := serveFrom(h, r, "alice"); w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "HTTPS required") {
		t.Fatalf("POST from afar: %d %q", w.Code, w.Body)
	}
	if subs, _, err := e.rt.Store().ListSubscriptions(context.Background(), "u-far", "", 10); err != nil || len(subs) != 0 {
		t.Fatalf("POST from afar made subscriptions %v (%v)", subs, err)
	}
	// The same POST from loopback is made.
	if w := post(h, "/console/users/u-far/subscription", form, c, "alice"); w.Code != http.StatusSeeOther {
		t.Fatalf("POST from loopback: %d %q", w.Code, w.Body)
	}

	// Served: loopback over plain HTTP, anyone over TLS, anyone with
	// allow_plain_http. Without an operator each is still refused, as
	// before: the HTTPS rule opens nothing. The CSRF cookie is Secure
	// except over plain HTTP on loopback: behind a proxy that terminates
	// TLS (allow_plain_http) too, where it was not (a review of security
	// by default).
	open := direct(t, e, false)
	open.AllowPlainHTTP = true
	for _, tc := range []struct {
		name   string
		h      *Handler
		addr   string
		tls    bool
		secure bool
	}{
		{"loopback v4", h, "127.0.0.1:5555", false, false},
		{"loopback v6", h, "[::1]:5555", false, false},
		{"TLS from afar", h, "203.0.113.7:5000", true, true},
		{"TLS on loopback", h, "127.0.0.1:5555", true, true},
		{"allow_plain_http from afar", open, "203.0.113.7:5000", false, true},
	} {
		r := httptest.NewRequest("GET", "/console/users", nil)
		r.RemoteAddr = tc.addr
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
		}
		w := serveFrom(tc.h, r, "alice")
		if w.Code != http.StatusOK {
			t.Errorf("%s: %d %q", tc.name, w.Code, w.Body)
		}
		var csrf *http.Cookie
		for _, c := range w.Result().Cookies() {
			if c.Name == csrfCookie {
				csrf = c
			}
		}
		if csrf == nil || csrf.Secure != tc.secure {
			t.Errorf("%s: CSRF cookie %v, want Secure %v", tc.name, csrf, tc.secure)
		}
		r = httptest.NewRequest("GET", "/console/users", nil)
		r.RemoteAddr = tc.addr
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
		}
		if w := serveFrom(tc.h, r, ""); w.Code != http.StatusForbidden || strings.Contains(w.Body.String(), "HTTPS required") {
			t.Errorf("%s without an operator: %d %q", tc.name, w.Code, w.Body)
		}
	}
}

// TestConsolePlainHTTPOverCaddy: through the real Caddy of start (plain
// HTTP on 127.0.0.1, basic_auth in front), the loopback client the demo
// is meant for still signs in and is served.
func TestConsolePlainHTTPOverCaddy(t *testing.T) {
	e := start(t)
	r, _ := http.NewRequest("GET", e.base+"/console/users", nil)
	r.SetBasicAuth(testOperator, testPassword)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("loopback over plain HTTP: %d", resp.StatusCode)
	}
}

// TestCaddyfileExampleConsoleAuthOnlyWhereServed: Caddyfile.example's
// basic_auth in front of the console applies over HTTPS and to loopback
// clients only. A browser across the network on plain HTTP is never asked
// for the operator's password (it would send it in the clear); the
// console answers it "HTTPS required" (TestConsolePlainHTTPOnlyOnLoopback).
func TestCaddyfileExampleConsoleAuthOnlyWhereServed(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "Caddyfile.example"))
	if err != nil {
		t.Fatal(err)
	}
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatal(err)
	}
	var cfg any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	// The routes whose handlers include basic_auth's "authentication".
	var authRoutes []json.RawMessage
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if hs, ok := x["handle"].([]any); ok {
				for _, hd := range hs {
					if m, ok := hd.(map[string]any); ok && m["handler"] == "authentication" {
						b, _ := json.Marshal(x)
						authRoutes = append(authRoutes, b)
					}
				}
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(cfg)
	if len(authRoutes) != 1 {
		t.Fatalf("%d routes with basic_auth in Caddyfile.example, want 1", len(authRoutes))
	}
	var route caddyhttp.Route
	if err := json.Unmarshal(authRoutes[0], &route); err != nil {
		t.Fatal(err)
	}
	route.HandlersRaw = nil // only its matchers are looked at
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := route.ProvisionMatchers(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		tls  bool
		want bool
	}{
		{"127.0.0.1:5555", false, true},
		{"[::1]:5555", false, true},
		{"203.0.113.7:5000", true, true},
		{"[2001:db8::1]:443", true, true},
		{"203.0.113.7:5000", false, false},
		{"192.168.1.20:40000", false, false},
		{"[2001:db8::1]:443", false, false},
	} {
		r := httptest.NewRequest("GET", "http://gateway.example:8080/console/users", nil)
		r.RemoteAddr = tc.addr
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
		}
		caddyhttp.NewTestReplacer(r) // puts the replacer in r's context
		got, err := route.MatcherSets.AnyMatchWithError(r)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("basic_auth applies to %s (TLS %v): %v, want %v", tc.addr, tc.tls, got, tc.want)
		}
	}
}
