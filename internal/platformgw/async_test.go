package platformgw

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/signing"
)

func TestAsyncEnvelope(t *testing.T) {
	payload := "{\"q\":\"<b> & \\\"x\\\"\"}\n\u2028é\x01"
	var env envelope
	urls := jobURLs{progress: "http://h/p", callback: "http://h/c\"é"}
	canonical := string(env.start("id-1", payload, urls))
	// The payload is written with the canonical string's escaping, so the
	// bytes a backend signs over can be cut straight out of the envelope.
	if want := string(signing.AsyncCanonical(payload, "id-1")); canonical != want {
		t.Fatalf("canonical string\n%q\nwant signing.AsyncCanonical's\n%q", canonical, want)
	}
	body := env.finish(urls, "a+b/=", "1")
	var got struct {
		RequestID   string `json:"request_id"`
		Payload     string `json:"payload"`
		ProgressURL string `json:"progress_url"`
		CallbackURL string `json:"callback_url"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("envelope is not JSON: %v\n%s", err, body)
	}
	if got.RequestID != "id-1" || got.Payload != payload || got.ProgressURL != "http://h/p?signature=a%2Bb%2F%3D&timestamp=1" ||
		got.CallbackURL != "http://h/c\"é?signature=a%2Bb%2F%3D&timestamp=1" {
		t.Errorf("round trip %+v", got)
	}
	inner := strings.TrimSuffix(strings.TrimPrefix(canonical, `{"payload":`), `,"request_id":"id-1"}`)
	if !strings.Contains(string(body), `"payload":`+inner+`,`) {
		t.Errorf("payload escaped differently from the canonical string:\n%s\n%s", body, canonical)
	}
	if !strings.HasPrefix(string(body), `{"request_id":"id-1","payload":`) {
		t.Errorf("key order: %s", body)
	}
}

func TestJobURLs(t *testing.T) {
	p := engine.DefaultPrefixes()
	tests := []struct {
		public, prefix, host string
		tls                  bool
		status, callback     string
	}{
		{"", "/api", "gw.example:8080", false,
			"http://gw.example:8080/api/requests/r1/status", "http://gw.example:8080/api/usage/complete/r1"},
		{"", "/gateway/api/v1", "gw.example", true,
			"https://gw.example/gateway/api/v1/requests/r1/status", "https://gw.example/usage/api/v1/complete/r1"},
		{"https://public.example/base", "/api", "internal:80", false,
			"https://public.example/base/api/requests/r1/status", "https://public.example/base/api/usage/complete/r1"},
	}
	// The server's sites answer gw.example (and *.wild.example); without
	// public_url only those Hosts, or the address the connection arrived
	// on, get URLs.
	srv := &caddyhttp.Server{Routes: caddyhttp.RouteList{
		{MatcherSets: caddyhttp.MatcherSets{{caddyhttp.MatchPath{"/x"}, caddyhttp.MatchHost{"gw.example", "*.wild.example"}}}},
	}}
	// The connection arrived on port 8080, or 443 over TLS.
	request := func(host string, secure bool) *http.Request {
		r := httptest.NewRequest("POST", "/x", nil)
		r.Host = host
		if secure {
			r.TLS = &tls.ConnectionState{}
		}
		ctx := context.WithValue(r.Context(), caddyhttp.ServerCtxKey, srv)
		ctx = context.WithValue(ctx, caddy.ReplacerCtxKey, caddy.NewReplacer())
		port := 8080
		if secure {
			port = 443
		}
		ctx = context.WithValue(ctx, http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		return r.WithContext(ctx)
	}
	for _, tt := range tests {
		h := &Handler{rt: &engine.Runtime{PublicURL: tt.public, Prefixes: p}, logger: zap.NewNop()}
		urls, e := h.jobURLs(request(tt.host, tt.tls), &call{requestID: "r1", route: invokeRoute{prefix: tt.prefix}})
		if e != nil || urls.status != tt.status || urls.callback != tt.callback ||
			urls.progress != strings.Replace(tt.callback, "/complete/", "/progress/", 1) {
			t.Errorf("%+v: %+v %v", tt, urls, e)
		}
	}
	// A site host name on another port than the connection's (none means
	// 80) is another server: host matchers ignore the port, and
	// GW.EXAMPLE:9999 used to get URLs on port 9999.
	h0 := &Handler{rt: &engine.Runtime{Prefixes: p}, logger: zap.NewNop()}
	for host, ok := range map[string]bool{
		"a.wild.example:8080": true, "127.0.0.1:8080": true, "GW.EXAMPLE:8080": true, "[::ffff:127.0.0.1]:8080": true,
		"attacker.example:9999": false, "127.0.0.1:8081": false, "127.0.0.1": false, "localhost:8080": false, "wild.example:8080": false, "": false,
		"GW.EXAMPLE:9999": false, "gw.example": false, "a.wild.example": false, "gw.example:08080": false, "gw.example:": false,
	} {
		_, e := h0.jobURLs(request(host, false), &call{requestID: "r1", route: invokeRoute{prefix: "/api"}})
		if (e == nil) != ok || (e != nil && (e.Code != "invalid_request" || e.Field != "Host")) {
			t.Errorf("Host %q without public_url: %v, want accepted %v", host, e, ok)
		}
	}
	// No server in the context (not a Caddy request): only public_url.
	if _, e := h0.jobURLs(httptest.NewRequest("POST", "/x", nil), &call{requestID: "r1", route: invokeRoute{prefix: "/api"}}); e == nil {
		t.Error("a request without a server: want a refusal")
	}
	h := &Handler{rt: &engine.Runtime{Prefixes: engine.Prefixes{Gateway: []string{"/api"}}}, logger: zap.NewNop()}
	if _, e := h.jobURLs(httptest.NewRequest("POST", "/x", nil), &call{route: invokeRoute{prefix: "/api"}}); e == nil {
		t.Error("no usage prefix: want an error")
	}
}

func TestBackendAnswer(t *testing.T) {
	b := &backendAnswer{header: make(http.Header)}
	b.WriteHeader(http.StatusEarlyHints)
	b.WriteHeader(http.StatusAccepted)
	b.WriteHeader(http.StatusInternalServerError)
	if b.status != http.StatusAccepted {
		t.Errorf("status %d", b.status)
	}
	if _, err := b.Write(make([]byte, maxBackendAnswer)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write([]byte("x")); !errors.Is(err, errAnswerTooLong) {
		t.Errorf("past the cap: %v", err)
	}
	implicit := &backendAnswer{header: make(http.Header)}
	implicit.Write([]byte("ok"))
	if implicit.status != http.StatusOK {
		t.Errorf("implicit status %d", implicit.status)
	}
}

func TestServeCaptured(t *testing.T) {
	aborting := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusOK)
		panic(http.ErrAbortHandler)
	})
	b := &backendAnswer{header: make(http.Header)}
	if err := serveCaptured(aborting, b, httptest.NewRequest("POST", "/", nil)); !errors.Is(err, errAborted) || b.status != 200 {
		t.Errorf("abort after the status: %v, status %d", err, b.status)
	}
	defer func() {
		if v := recover(); v != "boom" {
			t.Errorf("other panics must propagate, got %v", v)
		}
	}()
	serveCaptured(caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { panic("boom") }), b, httptest.NewRequest("POST", "/", nil))
}

// The 202's body written by hand is byte for byte json.Marshal's, and so
// is the signed query of the forwarded envelope url.Values' Encode.
func TestAcceptedBodyMatchesJSON(t *testing.T) {
	for _, u := range []jobURLs{
		{status: "http://gw.example/api/requests/0123abcd/status", callback: "http://gw.example/usage/complete/0123abcd"},
		{status: "https://h/a?x=1&y=<2>", callback: "https://h/\"q\"\\\u00e9\n"},
		{},
	} {
		for _, id := range []string{"0123456789abcdef", "a<b>&c", ""} {
			want, _ := json.Marshal(accepted{Status: "ACCEPTED", RequestID: id, ProgressURL: u.status, CallbackURL: u.callback})
			if got := acceptedBody(id, u); string(got) != string(want) {
				t.Errorf("by hand:\n%s\njson.Marshal:\n%s", got, want)
			}
		}
	}
	for _, p := range [][2]string{{"abc+/=", "1795467718"}, {"a b&c", "x?y"}} {
		want := "?" + url.Values{"signature": {p[0]}, "timestamp": {p[1]}}.Encode()
		if got := string(appendSignedQuery(nil, p[0], p[1])); got != want {
			t.Errorf("query %q, url.Values: %q", got, want)
		}
	}
}
