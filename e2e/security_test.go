package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
)

// The security suite runs the real server with its default log level and no
// log filters, Caddy's global log going to a file, and proves:
//
//   - a caller cannot reach a backend as anyone else: X-<Brand>-* headers it
//     sends (any case, '_' for '-', repeated, as trailers) never arrive, the
//     gateway's own always do, Connection cannot make the proxy drop them,
//     Upgrade/h2c is refused, and Authorization never arrives;
//   - signed usage requests cannot be replayed outside their window, nor
//     tampered with, nor made by another service;
//   - another user's job is indistinguishable from no job;
//   - the caller never sees a signature;
//   - keys cannot be recovered from the store file;
//   - no key, secret or signature appears in any log line.

const (
	secSecret      = "security-secret-security-000001"
	secOtherSecret = "security-other-secret-0000000002"
)

func secCatalog(syncBackend, asyncBackend, trailerBackend string) string {
	return fmt.Sprintf(`
		job_ttl 1h
		service sec {
			backend %s
			secret %s
			endpoint echo {
				path /echo
			}
			endpoint ws {
				path /echo
				allow_upgrade
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 1000
			}
		}
		service secjob {
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
				quota 1000
			}
		}
		service intruder {
			backend %s
			secret %s
			endpoint echo
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
			}
		}
		service trailers {
			backend %s
			secret %s
			endpoint echo
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
			}
		}`, syncBackend, secSecret, asyncBackend, usageSecret, syncBackend, secOtherSecret, trailerBackend, secSecret)
}

// startLoggedGateway is startGateway with Caddy's global log, at its
// default level and without any filter, written to dir/caddy.log.
func startLoggedGateway(t *testing.T, dir, platformBlock string) *gateway {
	t.Helper()
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	https_port 9443
	grace_period 10s
	log {
		output file %s/caddy.log
	}
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
		transport platform
	}
}
`, adminPort, gwPort, dir, dir, platformBlock, gwPort)
	tester := newTester(t)
	tester.InitServer(cfg, "caddyfile")
	return &gateway{t: t, tester: tester, dir: dir}
}

// secrets collects every key, secret and signature the suite handles, to
// grep the logs for at the end.
type secrets struct {
	mu   sync.Mutex
	list []string
}

func (s *secrets) add(vs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range vs {
		if len(v) >= 8 {
			// Also as it would appear in a logged URL.
			s.list = append(s.list, v, url.QueryEscape(v))
		}
	}
}

func TestSecurity(t *testing.T) {
	be := newTestBackend(t, secSecret, "Platform")
	jobs := newUsageBackend(t, usageSecret)
	// The trailers backend keeps what arrives after the body too.
	var trailerMu sync.Mutex
	var gotTrailer, gotHeader http.Header
	tb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		trailerMu.Lock()
		gotHeader, gotTrailer = r.Header.Clone(), r.Trailer.Clone()
		trailerMu.Unlock()
	}))
	defer tb.Close()
	dir := t.TempDir()
	catalog := secCatalog(be.URL, jobs.URL, tb.URL)
	g := startLoggedGateway(t, dir, catalog)
	ctx := context.Background()
	var seen secrets
	seen.add(secSecret, secOtherSecret, usageSecret)

	key, krec := g.newKey("u-sec", "reader")
	g.subscribe("u-sec", "sec", "basic", "ACTIVE")
	g.subscribe("u-sec", "secjob", "basic", "ACTIVE")
	otherKey, _ := g.newKey("u-other")
	g.subscribe("u-other", "secjob", "basic", "ACTIVE")
	seen.add(key, key[len("psk_"):], otherKey, otherKey[len("psk_"):])

	// backendSaw checks the headers a backend got: the gateway's context,
	// once each, nothing of the caller's, no credentials.
	backendSaw := func(t *testing.T, h http.Header, user string) {
		t.Helper()
		want := map[string]string{
			"X-Platform-User-Id":             user,
			"X-Platform-Roles":               "reader",
			"X-Platform-Subscription-Status": "ACTIVE",
			"X-Platform-Service-Product-Id":  "basic",
			"X-Platform-Signing-Version":     "3",
		}
		for name, v := range want {
			if got := h.Values(name); len(got) != 1 || got[0] != v {
				t.Errorf("%s = %q, want exactly %q", name, got, v)
			}
		}
		for name, vs := range h {
			lower := strings.ToLower(name)
			if strings.Contains(lower, "x_platform") || strings.Contains(lower, "x-platform_") || lower == "authorization" {
				t.Errorf("%s: %q reached the backend", name, vs)
			}
			if strings.HasPrefix(lower, "x-platform-") && len(vs) != 1 {
				t.Errorf("%s sent %d times: %q", name, len(vs), vs)
			}
			for _, v := range vs {
				if strings.Contains(v, "evil") || strings.Contains(v, key) {
					t.Errorf("%s: %q reached the backend", name, v)
				}
			}
		}
		seen.add(h.Get("X-Platform-Signature"))
	}

	spoof := []string{
		"X-Platform-User-ID", "evil-1",
		"X-PLATFORM-USER-ID", "evil-2",
		"x-platform-roles", "evil-admin",
		"X_Platform_User_ID", "evil-3",
		"x_platform_subscription_status", "evil-ACTIVE",
		"X-Platform_Service-Product-ID", "evil-premium",
		"X-Platform-Signature", "evil-signature",
		"X-Platform-Timestamp", "evil-ts",
		"X-Platform-Signing-Version", "evil-2",
		"X-Platform-Request-ID", "evil-request",
		"X-Platform-Units", "evil-0",
		"X-Platform-Billing-Model", "evil-FREE",
	}

	t.Run("spoofed identity headers never reach a backend", func(t *testing.T) {
		hdr := append(append([]string{}, spoof...), "X-Platform-User-ID", "evil-twice")
		resp, body := call(t, "POST", invokeURL("sec", "echo"), key, "hi", hdr...)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		got := be.last(t)
		if !got.SigOK {
			t.Error("the backend's own check of the v3 signature failed")
		}
		backendSaw(t, got.Header, "u-sec")
	})

	t.Run("Connection naming our headers cannot make the proxy drop them", func(t *testing.T) {
		for _, conn := range []string{
			"X-Platform-Signature, X-Platform-User-ID, X-Platform-Timestamp",
			"keep-alive, x_platform_signature, X-PLATFORM-SUBSCRIPTION-STATUS",
			"X-Platform-Signing-Version,X-Platform-Roles,X-Platform-Service-Product-ID,X-Platform-Request-ID",
		} {
			resp, body := call(t, "GET", invokeURL("sec", "echo"), key, "", "Connection", conn)
			if resp.StatusCode != 200 {
				t.Fatalf("Connection %q: %d %s", conn, resp.StatusCode, body)
			}
			got := be.last(t)
			if !got.SigOK || got.Header.Get("X-Platform-Signature") == "" || got.Header.Get("X-Platform-Request-Id") == "" {
				t.Errorf("Connection %q dropped a header the gateway added: %v", conn, got.Header)
			}
			backendSaw(t, got.Header, "u-sec")
		}
	})

	t.Run("spoofed trailers never reach a backend", func(t *testing.T) {
		g.subscribe("u-sec", "trailers", "basic", "ACTIVE")
		raw := "POST /api/service/trailers/endpoint/echo/invoke HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key +
			"\r\nTransfer-Encoding: chunked\r\nTrailer: X-Platform-User-ID, X_Platform_Roles, Authorization\r\nConnection: close\r\n\r\n" +
			"2\r\nhi\r\n0\r\nX-Platform-User-ID: evil-trailer\r\nX_Platform_Roles: evil-admin\r\nAuthorization: Bearer evil\r\n\r\n"
		resp, body := sendRaw(t, strings.TrimPrefix(gwBase, "http://"), raw)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		trailerMu.Lock()
		defer trailerMu.Unlock()
		if gotHeader.Get("X-Platform-User-Id") != "u-sec" {
			t.Errorf("backend headers %v", gotHeader)
		}
		for _, h := range []http.Header{gotHeader, gotTrailer} {
			for name, vs := range h {
				for _, v := range vs {
					if strings.Contains(v, "evil") {
						t.Errorf("%s: %q reached the backend (trailers %v)", name, v, gotTrailer)
					}
				}
			}
		}
	})

	t.Run("async: spoofed headers and the key never reach the backend, nor a signature the caller", func(t *testing.T) {
		resp, body := call(t, "POST", asyncURL("/api", "secjob", "job"), key, "work", spoof...)
		if resp.StatusCode != 202 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		env := jobs.next(t)
		if !env.SigOK {
			t.Error("the backend's own check of the async signature failed")
		}
		seen.add(env.Header.Get("X-Platform-Signature"))
		h := env.Header.Clone()
		h.Del("X-Platform-Roles") // secjob's forward carries the key's roles too
		for name, vs := range h {
			lower := strings.ToLower(name)
			if strings.Contains(lower, "x_platform") || lower == "authorization" {
				t.Errorf("%s: %q reached the backend", name, vs)
			}
			for _, v := range vs {
				if strings.Contains(v, "evil") || strings.Contains(v, key) {
					t.Errorf("%s: %q reached the backend", name, v)
				}
			}
		}
		// The caller's answer carries no signature: the URLs in it have
		// no query, and no header names one.
		sig := env.Header.Get("X-Platform-Signature")
		if bytes.Contains(body, []byte(sig)) || bytes.Contains(body, []byte(url.QueryEscape(sig))) || bytes.Contains(body, []byte("signature")) {
			t.Errorf("the 202 body carries a signature: %s", body)
		}
		for name, vs := range resp.Header {
			for _, v := range vs {
				if strings.Contains(v, sig) || strings.Contains(strings.ToLower(name), "signature") {
					t.Errorf("the 202 carries a signature in %s: %q", name, v)
				}
			}
		}
	})

	t.Run("Upgrade is refused unless the endpoint allows it", func(t *testing.T) {
		// h2c offers are ignored, not refused: TestWireH2COfferIsIgnored.
		before := be.count()
		for _, hdr := range [][]string{
			{"Upgrade", "websocket", "Connection", "Upgrade"},
			{"Upgrade", "h2c, websocket", "Connection", "Upgrade, HTTP2-Settings", "HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"},
		} {
			resp, body := call(t, "GET", invokeURL("sec", "echo"), key, "", hdr...)
			if resp.StatusCode != 400 || errorCode(t, resp, body) != "invalid_request" {
				t.Errorf("%v: %d %s", hdr, resp.StatusCode, body)
			}
			resp, body = call(t, "POST", asyncURL("/api", "secjob", "job"), key, "x", hdr...)
			if resp.StatusCode != 400 || errorCode(t, resp, body) != "invalid_request" {
				t.Errorf("async %v: %d %s", hdr, resp.StatusCode, body)
			}
		}
		if be.count() != before {
			t.Error("a refused upgrade reached the backend")
		}
		// An endpoint declared allow_upgrade takes it.
		resp, body := call(t, "GET", invokeURL("sec", "ws"), key, "", "Upgrade", "websocket", "Connection", "Upgrade")
		if resp.StatusCode != 200 || be.last(t).Header.Get("Upgrade") != "websocket" {
			t.Errorf("allow_upgrade endpoint: %d %s, backend saw Upgrade %q", resp.StatusCode, body, be.last(t).Header.Get("Upgrade"))
		}
	})

	t.Run("HTTP/2 with prior knowledge goes through the same checks", func(t *testing.T) {
		// Caddy answers cleartext HTTP/2 on an HTTP/1 port (its listener
		// hands such connections to the HTTP/2 server). That is Caddy
		// parsing the frames, not a tunnel to the backend: every request
		// still passes platform_gateway.
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		defer tr.CloseIdleConnections()
		h2c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		do := func(key string, hdr ...string) (*http.Response, []byte, error) {
			req, _ := http.NewRequest("GET", invokeURL("sec", "echo"), nil)
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Add(hdr[i], hdr[i+1])
			}
			resp, err := h2c.Do(req)
			if err != nil {
				return nil, nil, err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp, b, nil
		}
		before := be.count()
		resp, body, err := do("")
		if err != nil {
			t.Logf("h2c refused: %v", err)
			return
		}
		if resp.ProtoMajor != 2 || resp.StatusCode != 401 || errorCode(t, resp, body) != "missing_key" || be.count() != before {
			t.Errorf("h2c without a key: %s %d %s", resp.Proto, resp.StatusCode, body)
		}
		resp, body, err = do(key, spoof...)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("h2c with a key: %v %v %s", err, resp, body)
		}
		got := be.last(t)
		if !got.SigOK {
			t.Error("signature")
		}
		backendSaw(t, got.Header, "u-sec")
	})

	t.Run("signed usage requests: replay outside the window, tampering, another signer", func(t *testing.T) {
		acc, env := usageStart(t, jobs, asyncURL("/api", "secjob", "job"), key, "x")
		seen.add(env.Header.Get("X-Platform-Signature"))
		ledgerBefore := len(g.ledger(""))
		job, _ := g.store().GetJob(ctx, acc.RequestID)
		now := time.Now().Unix()
		report := usageReportBody("u-sec", "secjob", "1", now)
		type attempt struct {
			name, url, body, signed, secret, ts string
			status                              int
			code                                string
		}
		old := strconv.FormatInt(now-int64((6*time.Minute).Seconds()), 10)
		beforeJob := strconv.FormatInt(job.CreatedAt.Add(-6*time.Minute).Unix(), 10)
		complete := gwBase + "/api/usage/complete/" + acc.RequestID
		progress := gwBase + "/api/usage/progress/" + acc.RequestID
		done := fmt.Sprintf(`{"status":"COMPLETED","units":2,"timestamp":%d}`, now)
		for _, a := range []attempt{
			{"report replayed 6 minutes later", usageReportURL, report, report, usageSecret, old, 401, "stale_timestamp"},
			{"report from the future", usageReportURL, report, report, usageSecret, strconv.FormatInt(now+600, 10), 401, "stale_timestamp"},
			{"report with a tampered body", usageReportURL, strings.Replace(report, `"unitsUsed":1`, `"unitsUsed":1000`, 1), report, usageSecret, "", 401, "invalid_signature"},
			{"report with a tampered user", usageReportURL, strings.Replace(report, "u-sec", "u-other", 1), report, usageSecret, "", 401, "invalid_signature"},
			{"report signed by another service", usageReportURL, report, report, secOtherSecret, "", 401, "invalid_signature"},
			{"report signed over a re-serialised body", usageReportURL, report, strings.ReplaceAll(report, ",", ", "), usageSecret, "", 401, "invalid_signature"},
			{"completion from before the job", complete, done, done, usageSecret, beforeJob, 401, "stale_timestamp"},
			{"completion with a tampered body", complete, strings.Replace(done, `"units":2`, `"units":0`, 1), done, usageSecret, "", 401, "invalid_signature"},
			{"completion signed by another service", complete, done, done, secOtherSecret, "", 401, "invalid_signature"},
			{"progress from before the job", progress, `{"stage":"x","percentageComplete":5,"timestamp":1}`, `{"stage":"x","percentageComplete":5,"timestamp":1}`, usageSecret, beforeJob, 401, "stale_timestamp"},
		} {
			ts := a.ts
			if ts == "" {
				ts = strconv.FormatInt(now, 10)
			}
			sig := e2etest.UsageSign(a.secret, []byte(a.signed), ts)
			seen.add(sig)
			resp, body := call(t, "POST", a.url, "", a.body, "X-Platform-Signature", sig, "X-Platform-Timestamp", ts, "Content-Type", "application/json")
			if resp.StatusCode != a.status || errorCode(t, resp, body) != a.code {
				t.Errorf("%s: %d %s, want %d %s", a.name, resp.StatusCode, body, a.status, a.code)
			}
		}
		if n := len(g.ledger("")); n != ledgerBefore {
			t.Errorf("refused requests wrote %d ledger entries", n-ledgerBefore)
		}
		if j, _ := g.store().GetJob(ctx, acc.RequestID); j.Status != "PENDING" {
			t.Errorf("job %s after refused requests", j.Status)
		}
		// The real completion, then the same bytes replayed: answered 200
		// and charged once.
		sig := e2etest.UsageSign(usageSecret, []byte(done), strconv.FormatInt(now, 10))
		seen.add(sig)
		for i := range 3 {
			resp, body := call(t, "POST", complete, "", done, "X-Platform-Signature", sig, "X-Platform-Timestamp", strconv.FormatInt(now, 10))
			if resp.StatusCode != 200 {
				t.Fatalf("completion %d: %d %s", i, resp.StatusCode, body)
			}
		}
		var charged billing.Units
		for _, e := range g.ledger("u-sec") {
			if e.RequestID == acc.RequestID {
				charged += e.Units
			}
		}
		if charged != billing.Whole(2) {
			t.Errorf("a replayed completion charged %s in all, want 2", charged)
		}
	})

	t.Run("another user's job is invisible", func(t *testing.T) {
		acc, _ := usageStart(t, jobs, asyncURL("/api", "secjob", "job"), key, "mine")
		for _, u := range []string{
			gwBase + "/api/requests/" + acc.RequestID + "/status",
			gwBase + "/api/requests/" + acc.RequestID + "/result",
			gwBase + "/gateway/api/v1/requests/" + acc.RequestID + "/status",
			gwBase + "/api/usage/progress/" + acc.RequestID,
			gwBase + "/usage/api/v1/progress/" + acc.RequestID,
		} {
			resp, body := call(t, "GET", u, otherKey, "")
			unknown := strings.Replace(u, acc.RequestID, "00000000-0000-4000-8000-000000000000", 1)
			resp2, body2 := call(t, "GET", unknown, otherKey, "")
			if resp.StatusCode != 404 || errorCode(t, resp, body) != "request_not_found" {
				t.Errorf("%s with another user's key: %d %s", u, resp.StatusCode, body)
			}
			// Indistinguishable from a job that does not exist, but for
			// the id the caller sent.
			if strings.Replace(string(body), acc.RequestID, "ID", 1) != strings.Replace(string(body2), "00000000-0000-4000-8000-000000000000", "ID", 1) ||
				resp.StatusCode != resp2.StatusCode {
				t.Errorf("another user's job answers differently from no job:\n%s\n%s", body, body2)
			}
			if bytes.Contains(body, []byte("mine")) || bytes.Contains(body, []byte("u-sec")) {
				t.Errorf("the answer reveals the job: %s", body)
			}
		}
		// Its owner sees it.
		resp, body := call(t, "GET", acc.ProgressURL, key, "")
		if resp.StatusCode != 200 {
			t.Errorf("owner: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("keys cannot be recovered from the store file", func(t *testing.T) {
		adminKey := func(user string) string {
			var k struct {
				Key string `json:"key"`
			}
			e2etest.AdminJSON(t, "POST", fmt.Sprintf("http://localhost:%d/platform/keys", adminPort), map[string]any{"userId": user, "label": "scan me"}, 201, &k)
			seen.add(k.Key, k.Key[len("psk_"):])
			return k.Key
		}
		keys := []string{key, otherKey, adminKey("u-scan-1"), adminKey("u-scan-2")}
		// Listing keys never shows one again.
		resp, body := call(t, "GET", fmt.Sprintf("http://localhost:%d/platform/keys", adminPort), "", "")
		for _, k := range keys {
			if resp.StatusCode != 200 || bytes.Contains(body, []byte(k[len("psk_"):])) {
				t.Errorf("the key list shows a key: %d %s", resp.StatusCode, body)
			}
		}
		// Close the store and read the file's bytes.
		g.tester.InitServer(fmt.Sprintf("{\n\tadmin localhost:%d\n}\n", adminPort), "caddyfile")
		data, err := os.ReadFile(filepath.Join(dir, "platform.db"))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			body := k[len("psk_"):]
			for _, needle := range []string{k, body, body[:20], body[len(body)-20:]} {
				if bytes.Contains(data, []byte(needle)) {
					t.Errorf("the store file holds %q of a key", needle)
				}
			}
			// What is there is the hash: the scan read the right file.
			if h := sha256.Sum256([]byte(k)); !bytes.Contains(data, h[:]) {
				t.Errorf("the store file does not hold the hash of a key; wrong file?")
			}
		}
		for _, s := range []string{secSecret, secOtherSecret, usageSecret} {
			if bytes.Contains(data, []byte(s)) {
				t.Error("the store file holds a service secret")
			}
		}
		if krec.ID == "" || !bytes.Contains(data, []byte(krec.ID)) {
			t.Error("the key id should be in the store")
		}
		g = startLoggedGateway(t, dir, catalog)
	})

	t.Run("no key, secret or signature in any log line", func(t *testing.T) {
		// Refusals are logged with their path and request id: make some
		// that carry secrets in every place a client might put them.
		call(t, "GET", invokeURL("sec", "echo")+"?key="+url.QueryEscape(key), "", "")
		call(t, "GET", invokeURL("sec", "echo"), key+"x", "")
		call(t, "POST", usageReportURL+"?signature="+url.QueryEscape(e2etest.UsageSign(usageSecret, []byte("x"), "1")), "", "x",
			"X-Platform-Signature", e2etest.UsageSign(usageSecret, []byte("x"), "1"), "X-Platform-Timestamp", "1")
		seen.add(e2etest.UsageSign(usageSecret, []byte("x"), "1"))
		g.tester.InitServer(fmt.Sprintf("{\n\tadmin localhost:%d\n}\n", adminPort), "caddyfile") // flush and close the log
		logPath := filepath.Join(dir, "caddy.log")
		data, _ := os.ReadFile(logPath)
		lines := bytes.Count(data, []byte("\n"))
		if lines < 20 {
			t.Fatalf("only %d log lines: the log was not captured", lines)
		}
		if found := secretsIn(t, logPath, seen.list); len(found) > 0 {
			t.Errorf("the log holds %d keys, secrets or signatures, e.g. %q", len(found), found[0])
		}
		t.Logf("%d log lines checked for %d keys, secrets and signatures", lines, len(seen.list))
	})
}
