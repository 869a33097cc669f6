package e2e

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/platformgw/gateway/internal/e2etest"
)

// The wire hardening tests: what an attack run and callers using other
// platforms' SDKs found at the edges of the wire contract (logs, async
// URLs, slow clients, paths outside the API, h2c offers, rate-limit
// headers, async-only endpoints).

// startWireGateway loads a Caddyfile whose global options get extra lines
// (log, servers) and whose one site has the given address(es) ("" for
// ":<port>") and the standard handlers.
func startWireGateway(t *testing.T, dir, global, platformBlock, site string) *gateway {
	t.Helper()
	if site == "" {
		site = fmt.Sprintf(":%d", gwPort)
	}
	cfg := fmt.Sprintf(`{
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
%s {
	bind 127.0.0.1
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform
	}
}
`, adminPort, gwPort, global, dir, platformBlock, site)
	tester := newTester(t)
	tester.InitServer(cfg, "caddyfile")
	return &gateway{t: t, tester: tester, dir: dir}
}

// stopServer loads an empty config, which flushes and closes the log file.
func stopServer(g *gateway) {
	g.tester.InitServer(fmt.Sprintf("{\n\tadmin localhost:%d\n}\n", adminPort), "caddyfile")
}

// abortBackend verifies each call's v3 signature with its own code,
// records every signature it was sent, and can end its answers badly:
// /cut promises 1000 bytes and sends 10, /trickle sends one chunk and then
// waits for the caller to go away.
type abortBackend struct {
	*httptest.Server
	secret string

	mu    sync.Mutex
	sigs  []string
	bad   int
	saw   []http.Header
	calls int
}

func newAbortBackend(t *testing.T, secret string) *abortBackend {
	b := &abortBackend{secret: secret}
	tb := &testBackend{secret: secret, brand: "Platform"}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		want := v3Signature(secret, body, r.Header.Get("X-Platform-Timestamp"), tb.contextString(r.Header))
		got := r.Header.Get("X-Platform-Signature")
		b.mu.Lock()
		b.calls++
		b.sigs = append(b.sigs, got)
		b.saw = append(b.saw, r.Header.Clone())
		if got == "" || !hmac.Equal([]byte(want), []byte(got)) {
			b.bad++
		}
		b.mu.Unlock()
		switch {
		case strings.HasSuffix(r.URL.Path, "/cut"):
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(200)
			w.Write([]byte("0123456789"))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection is closed mid-body
		case strings.HasSuffix(r.URL.Path, "/slowstream"):
			// Five events half a second apart: longer than the test
			// server's read_header and idle timeouts.
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 5 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				w.(http.Flusher).Flush()
				time.Sleep(500 * time.Millisecond)
			}
			io.WriteString(w, "data: end\n\n")
		case strings.HasSuffix(r.URL.Path, "/trickle"):
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"ok":true}`)
		}
	}))
	t.Cleanup(b.Close)
	return b
}

func (b *abortBackend) signatures() (sigs []string, bad, calls int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.sigs...), b.bad, b.calls
}

func (b *abortBackend) lastHeader(t *testing.T) http.Header {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.saw) == 0 {
		t.Fatal("backend saw no request")
	}
	return b.saw[len(b.saw)-1]
}

const wireSecret = "wire-secret-wire-secret-0001"

func wireCatalog(backend, asyncBackend string) string {
	return fmt.Sprintf(`
		service wire {
			backend %s
			secret %s
			endpoint echo {
				path /echo
			}
			endpoint cut {
				path /cut
			}
			endpoint trickle {
				path /trickle
				streaming
			}
			endpoint slowstream {
				path /slowstream
				streaming
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
			}
		}
		service wirejob {
			backend %s
			secret %s
			endpoint job {
				async
				path /job
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
			}
		}`, backend, wireSecret, asyncBackend, usageSecret)
}

// rawRequest writes a request on a fresh TCP connection and returns the
// connection and a reader on it.
func rawRequest(t *testing.T, req string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", gwPort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// webSocketRequest asks for a WebSocket upgrade of an endpoint with the
// caller's key, on a fresh connection (rawRequest).
func webSocketRequest(t *testing.T, service, endpoint, key string) (net.Conn, *bufio.Reader) {
	t.Helper()
	return rawRequest(t, "GET /api/service/"+service+"/endpoint/"+endpoint+"/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "+key+
		"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
}

// mustSwitch reads the answer to an upgrade and fails the test unless it
// is 101 Switching Protocols.
func mustSwitch(t *testing.T, rd *bufio.Reader) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("upgrade: %d %s", resp.StatusCode, body)
	}
	return resp
}

// TestWireNoSignatureInDebugOrAbortLogs runs the gateway with Caddy's log at
// DEBUG and without filters, forwards calls that end normally, that the
// backend cuts short and that the caller hangs up on, and an async job,
// then greps every log line for the signatures the backends received, the
// service key and the secrets. reverse_proxy logs the request it hands its
// transport, headers included, at DEBUG ("upstream roundtrip") and on an
// abort ("aborting with incomplete response", WARN): the signed headers
// used to be on it.
func TestWireNoSignatureInDebugOrAbortLogs(t *testing.T) {
	be := newAbortBackend(t, wireSecret)
	jobs := newUsageBackend(t, usageSecret)
	dir := t.TempDir()
	g := startWireGateway(t, dir, fmt.Sprintf("\tlog {\n\t\toutput file %s/caddy.log\n\t\tlevel DEBUG\n\t}", dir),
		wireCatalog(be.URL, jobs.URL), "")
	key, _ := g.newKey("u-wire")
	g.subscribe("u-wire", "wire", "basic", "ACTIVE")
	g.subscribe("u-wire", "wirejob", "basic", "ACTIVE")

	// A normal call.
	if resp, body := call(t, "POST", invokeURL("wire", "echo"), key, `{"a":1}`); resp.StatusCode != 200 {
		t.Fatalf("echo: %d %s", resp.StatusCode, body)
	}
	// The backend cuts its body short.
	func() {
		conn, rd := rawRequest(t, "GET /api/service/wire/endpoint/cut/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "+key+"\r\n\r\n")
		defer conn.Close()
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatalf("cut: %v", err)
		}
		io.Copy(io.Discard, resp.Body) // ends early: the gateway aborts the response
		resp.Body.Close()
	}()
	// The caller hangs up in the middle of a stream.
	func() {
		conn, rd := rawRequest(t, "GET /api/service/wire/endpoint/trickle/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "+key+"\r\n\r\n")
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatalf("trickle: %v", err)
		}
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		if !strings.HasPrefix(line, "data: first") {
			t.Errorf("trickle: first line %q", line)
		}
		conn.Close()
	}()
	// An async job: its signature is in the forwarded headers and the
	// envelope's URLs.
	_, env := usageStart(t, jobs, asyncURL("/api", "wirejob", "job"), key, "x")
	if !env.SigOK {
		t.Error("async envelope signature")
	}
	// The backend completes it through its callback URL, whose query
	// carries the forward's signature, signing its own body.
	ts := usageURLTimestamp(t, env.CallbackURL)
	complete := fmt.Sprintf(`{"status":"completed","result":"X","timestamp":%d}`, time.Now().UnixMilli())
	if resp, body := usagePost(t, usageSigned{URL: env.CallbackURL, Body: complete, Secret: usageSecret, Timestamp: ts}); resp.StatusCode != 200 {
		t.Errorf("complete: %d %s", resp.StatusCode, body)
	}
	completionSig := e2etest.UsageSign(usageSecret, []byte(complete), ts)

	// Every forward reached the backend signed, and the log gets its abort
	// lines before it is closed.
	sigs, bad, calls := be.signatures()
	if calls != 3 || bad != 0 {
		t.Errorf("backend saw %d calls, %d badly signed", calls, bad)
	}
	logPath := filepath.Join(dir, "caddy.log")
	waitForLog(t, logPath, "aborting with incomplete response", 2)
	stopServer(g)

	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"upstream roundtrip"`, `"aborting with incomplete response"`} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("the log has no %s line: the paths under test were not logged", want)
		}
	}
	var needles secrets
	needles.add(sigs...)
	needles.add(env.Header.Get("X-Platform-Signature"), completionSig, key, wireSecret, usageSecret)
	if found := secretsIn(t, logPath, needles.list); len(found) > 0 {
		t.Errorf("the log holds %d keys, secrets or signatures, e.g. %q", len(found), found[0])
	}
	t.Logf("%d log lines checked for %d needles", bytes.Count(data, []byte("\n")), len(needles.list))
}

// waitForLog waits (bounded) until the log has n lines containing s: an
// abort is logged by the request's goroutine after the caller saw the
// connection end.
func waitForLog(t *testing.T, path, s string, n int) {
	t.Helper()
	for range 200 {
		data, _ := os.ReadFile(path)
		if bytes.Count(data, []byte(s)) >= n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("the log never got %d lines with %q", n, s)
}

// TestWireAsyncOnlyEndpointRefusesSync: a sync invoke of an endpoint
// declared `async only` is refused by the gateway (400 invalid_request)
// before anything is reserved or forwarded; it used to reach the backend,
// which refused it with a 4xx the caller was charged for.
func TestWireAsyncOnlyEndpointRefusesSync(t *testing.T) {
	jobs := newUsageBackend(t, usageSecret)
	dir := t.TempDir()
	g := startWireGateway(t, dir, "", fmt.Sprintf(`
		service batch {
			backend %s
			secret %s
			endpoint job {
				path /job
				async only
			}
			endpoint both {
				path /job
				async
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
				rate_limit 1/m
			}
		}`, jobs.URL, usageSecret), "")
	key, _ := g.newKey("u-batch")
	g.subscribe("u-batch", "batch", "basic", "ACTIVE")

	for _, method := range []string{"POST", "GET"} {
		resp, body := call(t, method, invokeURL("batch", "job"), key, "")
		if resp.StatusCode != 400 || errorCode(t, resp, body) != "invalid_request" ||
			!strings.Contains(string(body), "/invoke/async") || resp.Header.Get("X-Platform-Request-ID") == "" {
			t.Errorf("sync %s on an async-only endpoint: %d %s", method, resp.StatusCode, body)
		}
	}
	select {
	case env := <-jobs.jobs:
		t.Errorf("the refused call reached the backend: %s", env.Path)
	default:
	}
	if es := g.ledger("u-batch"); len(es) != 0 {
		t.Errorf("the refused calls were charged: %+v", es)
	}
	if st := usageSnapshot(t, g, "", "u-batch", "batch").Usage; st.Used != 0 || st.Reserved != 0 {
		t.Errorf("after refusals: used %v, reserved %v", st.Used, st.Reserved)
	}
	// The refusals took no rate-limit token: the one call a minute is
	// still there, asynchronously.
	acc, env := usageStart(t, jobs, asyncURL("/api", "batch", "job"), key, "x")
	if acc.Status != "ACCEPTED" || !env.SigOK {
		t.Errorf("async invoke of the async-only endpoint: %+v, signature ok %v", acc, env.SigOK)
	}
}

// TestWireStrayPathsGetJSON404: paths outside the API end at the platform
// proxy with no backend to go to. They used to get an empty 503 and two
// ERROR log lines each; now a JSON 404 not_found, nothing forwarded, and no
// ERROR line.
func TestWireStrayPathsGetJSON404(t *testing.T) {
	be := newAbortBackend(t, wireSecret)
	jobs := newUsageBackend(t, usageSecret)
	dir := t.TempDir()
	g := startWireGateway(t, dir, fmt.Sprintf("\tlog {\n\t\toutput file %s/caddy.log\n\t}", dir),
		wireCatalog(be.URL, jobs.URL), "")
	key, _ := g.newKey("u-wire")
	g.subscribe("u-wire", "wire", "basic", "ACTIVE")

	paths := []string{
		"/", "/favicon.ico", "/API/service/wire/endpoint/echo/invoke",
		"//api/service/wire/endpoint/echo/invoke", "/api", "/api/",
		"/api/servce/wire/endpoint/echo/invoke", "/gateway/api/v2/service/wire/endpoint/echo/invoke",
	}
	for _, p := range paths {
		for _, k := range []string{"", key} {
			for _, method := range []string{"GET", "POST"} {
				resp, body := call(t, method, gwBase+p, k, "")
				if resp.StatusCode != 404 || errorCode(t, resp, body) != "not_found" || resp.Header.Get("X-Platform-Request-ID") == "" {
					t.Errorf("%s %s (key %v): %d %q", method, p, k != "", resp.StatusCode, body)
				}
			}
		}
	}
	// A raw request line the Go client would clean up.
	conn, rd := rawRequest(t, "GET //api/service/wire/endpoint/echo/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "+key+"\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	conn.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(body), `"not_found"`) {
		t.Errorf("raw //api: %d %s", resp.StatusCode, body)
	}
	if _, _, calls := be.signatures(); calls != 0 {
		t.Errorf("%d stray requests reached the backend", calls)
	}
	// The API itself still works next to it.
	if resp, body := call(t, "GET", invokeURL("wire", "echo"), key, ""); resp.StatusCode != 200 {
		t.Errorf("echo: %d %s", resp.StatusCode, body)
	}
	stopServer(g)
	data, err := os.ReadFile(filepath.Join(dir, "caddy.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(data, []byte(`"level":"error"`)); n > 0 {
		t.Errorf("%d ERROR log lines for stray paths, e.g. %s", n, firstLineWith(data, `"level":"error"`))
	}
	if n := bytes.Count(data, []byte(`"msg":"invoke refused"`)); n < len(paths)*4 {
		t.Errorf("%d refusal lines for %d stray requests: the log was not captured", n, len(paths)*4)
	}
}

func firstLineWith(data []byte, s string) string {
	for _, l := range bytes.Split(data, []byte("\n")) {
		if bytes.Contains(l, []byte(s)) {
			return string(l)
		}
	}
	return ""
}

// javaH2CHeaders are what java.net.http.HttpClient (HTTP/2 by default)
// adds to every plain-http request.
const javaH2CHeaders = "Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAEAAEAAAAIAAAABAAMAAABkAAQBAAAAAAUAAEAA\r\nUpgrade: h2c\r\nUser-Agent: Java-http-client/21.0.5\r\n"

// TestWireH2COfferIsIgnored: an offer to upgrade to h2c is ignored (RFC
// 9110 section 7.8), sync and async, over raw TCP with exactly Java's
// headers and with Go's client: the call is answered over HTTP/1.1 and the
// backend sees no Upgrade, HTTP2-Settings or Connection option for them. A
// WebSocket upgrade is still refused on an endpoint without allow_upgrade.
// Every such invoke used to be 400 invalid_request.
func TestWireH2COfferIsIgnored(t *testing.T) {
	be := newAbortBackend(t, wireSecret)
	jobs := newUsageBackend(t, usageSecret)
	g := startWireGateway(t, t.TempDir(), "", wireCatalog(be.URL, jobs.URL), "")
	key, _ := g.newKey("u-wire")
	g.subscribe("u-wire", "wire", "basic", "ACTIVE")
	g.subscribe("u-wire", "wirejob", "basic", "ACTIVE")
	host := fmt.Sprintf("127.0.0.1:%d", gwPort)
	noUpgrade := func(what string, h http.Header) {
		t.Helper()
		for _, name := range []string{"Upgrade", "Http2-Settings"} {
			if v := h.Values(name); len(v) > 0 {
				t.Errorf("%s: the backend received %s: %q", what, name, v)
			}
		}
		for _, v := range h.Values("Connection") {
			if l := strings.ToLower(v); strings.Contains(l, "upgrade") || strings.Contains(l, "http2-settings") {
				t.Errorf("%s: the backend received Connection: %q", what, v)
			}
		}
	}

	// Sync, raw TCP, Java's headers.
	conn, rd := rawRequest(t, "POST /api/service/wire/endpoint/echo/invoke HTTP/1.1\r\n"+javaH2CHeaders+
		"Host: "+host+"\r\nAuthorization: Bearer "+key+"\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}")
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	conn.Close()
	if resp.StatusCode != 200 || resp.Proto != "HTTP/1.1" || string(body) != `{"ok":true}` {
		t.Errorf("sync with Java's h2c offer: %s %d %s", resp.Proto, resp.StatusCode, body)
	}
	if _, bad, calls := be.signatures(); calls != 1 || bad != 0 {
		t.Errorf("backend: %d calls, %d badly signed", calls, bad)
	}
	noUpgrade("sync raw", be.lastHeader(t))

	// Async, raw TCP, Java's headers.
	conn, rd = rawRequest(t, "POST /api/service/wirejob/endpoint/job/invoke/async HTTP/1.1\r\n"+javaH2CHeaders+
		"Host: "+host+"\r\nAuthorization: Bearer "+key+"\r\nContent-Length: 5\r\n\r\nhello")
	resp, err = http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	conn.Close()
	if resp.StatusCode != 202 || resp.Proto != "HTTP/1.1" {
		t.Fatalf("async with Java's h2c offer: %s %d %s", resp.Proto, resp.StatusCode, body)
	}
	env := jobs.next(t)
	if !env.SigOK || env.Payload != "hello" {
		t.Errorf("async envelope: signature ok %v, payload %q", env.SigOK, env.Payload)
	}
	noUpgrade("async raw", env.Header)

	// Go's client with the same headers, sync and async.
	h2c := []string{"Connection", "Upgrade, HTTP2-Settings", "Upgrade", "h2c", "HTTP2-Settings", "AAEAAEAAAAIAAAABAAMAAABkAAQBAAAAAAUAAEAA"}
	if resp, body := call(t, "GET", invokeURL("wire", "echo"), key, "", h2c...); resp.StatusCode != 200 {
		t.Errorf("Go client, sync: %d %s", resp.StatusCode, body)
	}
	noUpgrade("sync Go", be.lastHeader(t))
	_, env = usageStart(t, jobs, asyncURL("/api", "wirejob", "job"), key, "x")
	noUpgrade("async Go (headers of usageStart)", env.Header)
	resp, body = call(t, "POST", asyncURL("/api", "wirejob", "job"), key, "x", h2c...)
	if resp.StatusCode != 202 {
		t.Errorf("Go client, async: %d %s", resp.StatusCode, body)
	}
	noUpgrade("async Go", jobs.next(t).Header)

	// A real protocol switch is still refused, also when offered with h2c.
	_, _, before := be.signatures()
	for _, hdr := range [][]string{
		{"Connection", "Upgrade", "Upgrade", "websocket"},
		{"Connection", "Upgrade, HTTP2-Settings", "Upgrade", "h2c, websocket", "HTTP2-Settings", "AAEA"},
	} {
		resp, body := call(t, "GET", invokeURL("wire", "echo"), key, "", hdr...)
		if resp.StatusCode != 400 || errorCode(t, resp, body) != "invalid_request" {
			t.Errorf("%v: %d %s", hdr, resp.StatusCode, body)
		}
	}
	if _, _, after := be.signatures(); after != before {
		t.Error("a refused WebSocket upgrade reached the backend")
	}
}

// TestWireRateLimitHeadersWithBurst: with `rate_limit 1/m burst 2` the
// headers describe the bucket: q=2 (the burst) over w=120 (its refill
// time), remaining never above the limit, t until the next token. The
// gateway used to say X-RateLimit-Remaining 1 with X-RateLimit-Limit 1
// and Reset 0. Exact t values are in platform's TestAllowBurstSequence,
// on an injected clock; here they are only bounded.
func TestWireRateLimitHeadersWithBurst(t *testing.T) {
	be := newAbortBackend(t, wireSecret)
	g := startWireGateway(t, t.TempDir(), "", fmt.Sprintf(`
		service burst {
			backend %s
			secret %s
			endpoint echo {
				path /echo
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				rate_limit 1/m burst 2
			}
		}`, be.URL, wireSecret), "")
	key, _ := g.newKey("u-burst")
	g.subscribe("u-burst", "burst", "basic", "ACTIVE")

	for i, want := range []struct {
		status int
		left   string
	}{{200, "1"}, {200, "0"}, {429, "0"}} {
		resp, body := call(t, "GET", invokeURL("burst", "echo"), key, "")
		h := resp.Header
		if resp.StatusCode != want.status {
			t.Fatalf("call %d: %d %s", i+1, resp.StatusCode, body)
		}
		if h.Get("RateLimit-Policy") != `"rate";q=2;w=120` || h.Get("X-RateLimit-Limit") != "2" || h.Get("X-RateLimit-Remaining") != want.left {
			t.Errorf("call %d: RateLimit-Policy %q, X-RateLimit-Limit %q, X-RateLimit-Remaining %q (want %s)",
				i+1, h.Get("RateLimit-Policy"), h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), want.left)
		}
		var r, tt int
		if _, err := fmt.Sscanf(h.Get("RateLimit"), `"rate";r=%d;t=%d`, &r, &tt); err != nil || fmt.Sprint(r) != want.left || tt < 1 || tt > 60 {
			t.Errorf("call %d: RateLimit %q", i+1, h.Get("RateLimit"))
		}
		if h.Get("X-RateLimit-Reset") != fmt.Sprint(tt) {
			t.Errorf("call %d: X-RateLimit-Reset %q, t=%d", i+1, h.Get("X-RateLimit-Reset"), tt)
		}
		if want.status == 429 && (errorCode(t, resp, body) != "rate_limited" || h.Get("Retry-After") != fmt.Sprint(tt)) {
			t.Errorf("call %d: Retry-After %q, t=%d, %s", i+1, h.Get("Retry-After"), tt, body)
		}
	}
}

// invokeWithHost sends an async invoke to the loopback listener with the
// given Host header.
func invokeWithHost(t *testing.T, host, key, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("POST", asyncURL("/api", "wirejob", "job"), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// TestWireAsyncURLsNeverFollowACallersHost: without public_url, a caller's
// Host decided where the backend posted its signed completion
// (callback_url=http://attacker.example:9999/...). Now async URLs are
// built on public_url, else only on a Host the server is configured for
// (a site address, or the address the connection arrived on); any other
// Host is refused with 400 before anything is reserved, rate-limited,
// stored or forwarded.
func TestWireAsyncURLsNeverFollowACallersHost(t *testing.T) {
	be := newAbortBackend(t, wireSecret)
	jobs := newUsageBackend(t, usageSecret)
	catalog := strings.Replace(wireCatalog(be.URL, jobs.URL), "unit request\n\t\t\t}\n\t\t}", "unit request\n\t\t\t\trate_limit 1/h\n\t\t\t}\n\t\t}", 1)
	if !strings.Contains(catalog, "rate_limit 1/h") {
		t.Fatal("catalog edit failed")
	}
	local := fmt.Sprintf("127.0.0.1:%d", gwPort)
	noJob := func(g *gateway, what string) {
		t.Helper()
		select {
		case env := <-jobs.jobs:
			t.Errorf("%s: the backend got a job with callback %s", what, env.CallbackURL)
		default:
		}
		if st := usageSnapshot(t, g, "", "u-wire", "wirejob"); st.Usage.Reserved != 0 || st.Usage.Used != 0 || len(st.Ledger) != 0 {
			t.Errorf("%s: the refusal took something: %+v", what, st.Usage)
		}
	}

	t.Run("catch-all site without public_url", func(t *testing.T) {
		g := startWireGateway(t, t.TempDir(), "", catalog, "")
		key, _ := g.newKey("u-wire")
		g.subscribe("u-wire", "wirejob", "basic", "ACTIVE")
		for _, host := range []string{"attacker.example:9999", "attacker.example", "127.0.0.2:" + fmt.Sprint(gwPort), "127.0.0.1:1", "localhost:" + fmt.Sprint(gwPort)} {
			resp, body := invokeWithHost(t, host, key, "x")
			if resp.StatusCode != 400 || errorCode(t, resp, body) != "invalid_request" || !strings.Contains(string(body), `"field":"Host"`) {
				t.Errorf("Host %s: %d %s", host, resp.StatusCode, body)
			}
			if strings.Contains(resp.Header.Get("RateLimit"), "r=0") {
				t.Errorf("Host %s: the refusal took the rate-limit token: %s", host, resp.Header.Get("RateLimit"))
			}
		}
		noJob(g, "foreign Host")
		// The address the caller connected to is this server: accepted,
		// and the one call an hour is still there.
		resp, body := invokeWithHost(t, local, key, "x")
		if resp.StatusCode != 202 {
			t.Fatalf("Host %s: %d %s", local, resp.StatusCode, body)
		}
		env := jobs.next(t)
		if !strings.HasPrefix(env.CallbackURL, "http://"+local+"/api/usage/complete/") {
			t.Errorf("callback %s", env.CallbackURL)
		}
	})

	t.Run("site with a host name, without public_url", func(t *testing.T) {
		site := fmt.Sprintf("http://localhost:%d", gwPort)
		g := startWireGateway(t, t.TempDir(), "", catalog, site)
		key, _ := g.newKey("u-wire")
		g.subscribe("u-wire", "wirejob", "basic", "ACTIVE")
		// The site's host name with a port other than the one the caller
		// connected to (or none, which means 80) named another port of
		// that host: the caller chose where the completion went
		// (callback http://localhost:1/...).
		for _, host := range []string{"localhost:1", "LOCALHOST:1", "localhost", "localhost:0" + fmt.Sprint(gwPort)} {
			resp, body := invokeWithHost(t, host, key, "x")
			if resp.StatusCode != 400 || errorCode(t, resp, body) != "invalid_request" || !strings.Contains(string(body), `"field":"Host"`) {
				t.Errorf("Host %s: %d %s", host, resp.StatusCode, body)
			}
		}
		noJob(g, "site host name on another port")
		resp, body := invokeWithHost(t, fmt.Sprintf("localhost:%d", gwPort), key, "x")
		if resp.StatusCode != 202 {
			t.Fatalf("Host localhost: %d %s", resp.StatusCode, body)
		}
		env := jobs.next(t)
		if !strings.HasPrefix(env.CallbackURL, site+"/api/usage/complete/") || !strings.Contains(string(body), site+"/api/requests/") {
			t.Errorf("callback %s, answer %s", env.CallbackURL, body)
		}
	})

	t.Run("public_url set", func(t *testing.T) {
		public := "https://gw.example.test"
		g := startWireGateway(t, t.TempDir(), "", "\t\tpublic_url "+public+"/\n"+catalog, "")
		key, _ := g.newKey("u-wire")
		g.subscribe("u-wire", "wirejob", "basic", "ACTIVE")
		resp, body := invokeWithHost(t, "attacker.example:9999", key, "x")
		if resp.StatusCode != 202 {
			t.Fatalf("public_url: %d %s", resp.StatusCode, body)
		}
		env := jobs.next(t)
		if !strings.HasPrefix(env.CallbackURL, public+"/api/usage/complete/") || !strings.HasPrefix(env.ProgressURL, public+"/api/usage/progress/") ||
			strings.Contains(string(body), "attacker") || !strings.HasPrefix(resp.Header.Get("Location"), public+"/api/requests/") {
			t.Errorf("callback %s, progress %s, answer %s", env.CallbackURL, env.ProgressURL, body)
		}
	})
}

// TestWireCaddyfileExampleTimeouts: Caddyfile.example cuts off slow and
// idle clients (1,000 slowloris connections and 1,000 idle keep-alives held
// for 20 s were never cut off under Caddy's defaults of 1m and 5m), and
// sets no timeout that would cut a long streaming response.
func TestWireCaddyfileExampleTimeouts(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "Caddyfile.example"))
	if err != nil {
		t.Fatal(err)
	}
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]map[string]any `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Apps.HTTP.Servers) == 0 {
		t.Fatal("no servers in the adapted Caddyfile.example")
	}
	for name, srv := range cfg.Apps.HTTP.Servers {
		dur := func(k string) time.Duration {
			v, _ := srv[k].(float64)
			return time.Duration(v)
		}
		if d := dur("read_header_timeout"); d <= 0 || d > 10*time.Second {
			t.Errorf("%s: read_header_timeout %v, want at most 10s", name, d)
		}
		if d := dur("idle_timeout"); d <= 0 || d > 2*time.Minute {
			t.Errorf("%s: idle_timeout %v, want at most 2m", name, d)
		}
		for _, k := range []string{"read_timeout", "write_timeout"} {
			if _, ok := srv[k]; ok {
				t.Errorf("%s: %s is set: it would cut long streaming responses", name, k)
			}
		}
	}
}

// TestWireSlowClientsAreCutOff runs the server with the timeouts of
// Caddyfile.example scaled down (read_header 1s, idle 1s): a client
// trickling its headers a byte at a time is disconnected before it
// finishes, an idle keep-alive connection is closed, and a streaming
// response longer than both timeouts still arrives whole.
func TestWireSlowClientsAreCutOff(t *testing.T) {
	be := newAbortBackend(t, wireSecret)
	jobs := newUsageBackend(t, usageSecret)
	g := startWireGateway(t, t.TempDir(), "\tservers {\n\t\ttimeouts {\n\t\t\tread_header 1s\n\t\t\tidle 1s\n\t\t}\n\t}",
		wireCatalog(be.URL, jobs.URL), "")
	key, _ := g.newKey("u-wire")
	g.subscribe("u-wire", "wire", "basic", "ACTIVE")
	addr := fmt.Sprintf("127.0.0.1:%d", gwPort)

	slowClientsCutOff(t, addr, key)

	t.Run("a stream longer than the timeouts arrives whole", func(t *testing.T) {
		resp, body := call(t, "GET", invokeURL("wire", "slowstream"), key, "")
		if resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: end\n\n") || strings.Count(string(body), "data: ") != 6 {
			t.Errorf("stream: %d %q", resp.StatusCode, body)
		}
	})
}
