package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// startAccessLoggedGateway is startGateway's site with Caddy's logs written as
// JSON to files under dir: the gateway's own lines (the default logger)
// to gateway.log, the access log to access.log, with the placeholders
// platform_gateway publishes appended by log_append as the operator's
// example in docs/operations.md does.
func startAccessLoggedGateway(t *testing.T, dir, platformBlock string) *gateway {
	t.Helper()
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	https_port 9443
	grace_period 10s
	log {
		output file %s/gateway.log
		format json
		level INFO
	}
	platform {
		store %s/platform.db
%s
	}
}
:%d {
	bind 127.0.0.1
	log {
		output file %s/access.log
		format json
	}
	log_append key_id {http.platform.key_id}
	log_append service_id {http.platform.service_id}
	log_append endpoint_id {http.platform.endpoint_id}
	log_append product_id {http.platform.product_id}
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform
	}
}
`, adminPort, gwPort, dir, dir, platformBlock, gwPort, dir)
	tester := testerFor(t, filepath.Join(dir, "platform.db"))
	tester.InitServer(cfg, "caddyfile")
	return &gateway{t: t, tester: tester, dir: dir}
}

// logLines returns the JSON lines of a log file whose field field equals
// value, waiting a bounded while for at least one: Caddy writes the access
// log line after the answer has gone out.
func logLines(t *testing.T, file, field, value string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for range 100 {
		out = out[:0]
		f, err := os.Open(file)
		if err == nil {
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				var m map[string]any
				if json.Unmarshal(sc.Bytes(), &m) == nil && m[field] == value {
					out = append(out, m)
				}
			}
			f.Close()
		}
		if len(out) > 0 {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no line with %s=%q in %s", field, value, file)
	return nil
}

// TestPlaceholdersInAccessLog: once its key is checked, a call's caller
// and route are Caddy placeholders ({http.auth.user.id},
// {http.platform.key_id}, …) that the access log carries, and the gateway's
// request id is Caddy's {http.request.uuid}: the X-Platform-Request-ID
// header, the JSON error's requestId, the gateway's log line and the access
// log line's uuid are one id. No key is in either log.
func TestPlaceholdersInAccessLog(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	dir := t.TempDir()
	g := startAccessLoggedGateway(t, dir, catalogBlock(be.URL))
	key, rec := g.newKey("u-ph")
	g.subscribe("u-ph", "svc", "sub", "ACTIVE")
	access, gwlog := filepath.Join(dir, "access.log"), filepath.Join(dir, "gateway.log")

	t.Run("a sync call", func(t *testing.T) {
		resp, body := call(t, "POST", invokeURL("svc", "echo"), key, `{"x":1}`)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		id := resp.Header.Get("X-Platform-Request-ID")
		if u, err := uuid.Parse(id); err != nil || u.String() != id || u.Version() != 4 {
			t.Fatalf("request id %q is not a version 4 UUID: %v", id, err)
		}
		if got := be.last(t).Header.Get("X-Platform-Request-ID"); got != id {
			t.Errorf("backend got request id %q, caller %q", got, id)
		}
		lines := logLines(t, access, "uuid", id)
		if len(lines) != 1 {
			t.Fatalf("%d access log lines with uuid %s", len(lines), id)
		}
		l := lines[0]
		want := map[string]string{
			"user_id": "u-ph", "key_id": rec.ID, "service_id": "svc", "endpoint_id": "echo", "product_id": "sub",
		}
		for k, v := range want {
			if l[k] != v {
				t.Errorf("access log %s = %v, want %q", k, l[k], v)
			}
		}
	})

	t.Run("a refused call", func(t *testing.T) {
		// The key is good; the caller has no subscription to down.
		resp, body := call(t, "POST", invokeURL("down", "echo"), key, `{}`)
		if resp.StatusCode < 400 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		errorCode(t, resp, body)
		var e struct {
			RequestID string `json:"requestId"`
		}
		json.Unmarshal(body, &e)
		id := resp.Header.Get("X-Platform-Request-ID")
		if _, err := uuid.Parse(id); err != nil || e.RequestID != id {
			t.Fatalf("header request id %q, body requestId %q", id, e.RequestID)
		}
		gw := logLines(t, gwlog, "request_id", id)
		if gw[0]["msg"] != "invoke refused" {
			t.Errorf("gateway log line %v", gw[0])
		}
		acc := logLines(t, access, "uuid", id)
		if len(acc) != 1 || acc[0]["user_id"] != "u-ph" || acc[0]["key_id"] != rec.ID || acc[0]["service_id"] != "down" {
			t.Errorf("access log line %v", acc)
		}
	})

	t.Run("a usage handler refusal", func(t *testing.T) {
		resp, _ := call(t, "GET", gwBase+"/api/usage/report", "", "")
		id := resp.Header.Get("X-Platform-Request-ID")
		if _, err := uuid.Parse(id); err != nil {
			t.Fatalf("request id %q: %v", id, err)
		}
		if gw := logLines(t, gwlog, "request_id", id); gw[0]["msg"] != "usage request refused" {
			t.Errorf("gateway log line %v", gw[0])
		}
		// Not an invoke: the placeholders are unknown, logged as null.
		acc := logLines(t, access, "uuid", id)
		if v, ok := acc[0]["key_id"]; !ok || v != nil || acc[0]["user_id"] != "" {
			t.Errorf("access log line %v", acc[0])
		}
	})

	t.Run("no key in any log", func(t *testing.T) {
		for _, f := range []string{access, gwlog} {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), key) {
				t.Errorf("%s holds the service key", f)
			}
			// Caddy logs request headers, but redacts Authorization.
			if strings.Contains(string(b), "Bearer") {
				t.Errorf("%s holds an Authorization header", f)
			}
		}
	})
}

// TestAsyncJobIDInAccessLog: an async invoke's id is its job's id, the
// X-Platform-Request-ID of the 202, the requestId of the envelope the
// backend got and the uuid of the call's access log line, one version 4
// UUID. Two calls get two ids.
func TestAsyncJobIDInAccessLog(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	other := newUsageBackend(t, usageSecret2)
	dir := t.TempDir()
	g := startAccessLoggedGateway(t, dir, usageCatalog(be.URL, other.URL))
	key, rec := g.newKey("u-job-id")
	g.subscribe("u-job-id", "svc", "basic", "ACTIVE")
	access := filepath.Join(dir, "access.log")

	seen := map[string]bool{}
	for range 2 {
		acc, env := usageStart(t, be, asyncURL("/api", "svc", "job"), key, `{"n":1}`)
		id := acc.RequestID
		if u, err := uuid.Parse(id); err != nil || u.String() != id || u.Version() != 4 {
			t.Fatalf("job id %q is not a version 4 UUID: %v", id, err)
		}
		if seen[id] {
			t.Fatalf("job id %s given twice", id)
		}
		seen[id] = true
		if env.RequestID != id {
			t.Errorf("backend's envelope names job %q, caller got %q", env.RequestID, id)
		}
		lines := logLines(t, access, "uuid", id)
		if len(lines) != 1 {
			t.Fatalf("%d access log lines with uuid %s", len(lines), id)
		}
		if l := lines[0]; l["key_id"] != rec.ID || l["endpoint_id"] != "job" {
			t.Errorf("access log line %v", l)
		}
		resp, body := call(t, "GET", acc.ProgressURL, key, "")
		if resp.StatusCode != 200 || !strings.Contains(string(body), id) {
			t.Errorf("status poll of %s: %d %s", id, resp.StatusCode, body)
		}
	}
}
