package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/store"
)

// The bad-input table: malformed requests to every route, each of which
// must be refused with the documented JSON error (status, code, and the
// field for invalid_request) and must change nothing. "Nothing" is checked
// twice: after each case through the app (ledger, job, subscription,
// counters, keys), and once around the whole table on the bbolt file itself,
// read with bbolt after the store was closed, whose every bucket, key, value
// and sequence must be the same.

const badSecret = "badinput-secret-badinput-000001"

func badCatalog(backend string) string {
	return fmt.Sprintf(`
		max_body_bytes 64KiB
		usage_max_body_bytes 4KiB
		job_ttl 1h
		service bad {
			backend %s
			secret %s
			endpoint echo {
				methods GET POST
				path /echo
			}
			endpoint job {
				async
				methods POST
				path /job
			}
			product quota {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
			}
		}
		service other {
			backend %s
			secret %s
			endpoint echo
			product p {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
			}
		}`, backend, badSecret, backend, usageSecret2)
}

// badCase is one malformed request and the refusal it must get.
type badCase struct {
	name   string
	method string
	url    string
	key    string   // Bearer key, if any
	header []string // name, value pairs
	body   string
	// sign: "" sends no signature; "ok" signs body+now with the service
	// secret; anything else is sent as the signature as is.
	sign string
	ts   string // the Timestamp header when signed ("" = now)
	raw  string // a raw HTTP/1.1 request instead of the above
	// toAdmin sends raw to Caddy's admin endpoint instead of the site.
	toAdmin bool
	// The refusal. status 0 means net/http itself refuses the request
	// before any handler runs (a plain 400): not ours to shape, but it
	// must still change nothing.
	status int
	code   string
	field  string
	// chunked sends the body without a Content-Length.
	chunked bool
}

// badState is what any refusal must leave as it was, read through the app.
type badState struct {
	Ledger []store.LedgerEntry
	Job    store.Job
	Sub    store.Subscription
	State  billing.State
	Keys   []store.KeyRecord
}

func TestBadInput(t *testing.T) {
	var backendHits atomic.Int64
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		backendHits.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusAccepted)
	}))
	defer be.Close()
	dir := t.TempDir()
	g := startGateway(t, dir, badCatalog(be.URL))
	ctx := context.Background()

	key, _ := g.newKey("u-bad", "reader")
	g.subscribe("u-bad", "bad", "quota", "ACTIVE")
	otherKey, _ := g.newKey("u-intruder")
	g.subscribe("u-intruder", "bad", "quota", "ACTIVE")
	nosubKey, _ := g.newKey("u-nosub")
	revoked, rrec := g.newKey("u-bad")
	if _, err := g.store().RevokeKey(ctx, rrec.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	// A job to aim progress, completion, status and result at.
	resp, body := call(t, "POST", asyncURL("/api", "bad", "job"), key, "x")
	if resp.StatusCode != 202 {
		t.Fatalf("async invoke: %d %s", resp.StatusCode, body)
	}
	var acc usageAccepted
	json.Unmarshal(body, &acc)
	job := acc.RequestID
	jobCreated := time.Now()
	p, _ := usageProduct(g, "u-bad", "bad")

	snapshot := func(t *testing.T) badState {
		t.Helper()
		var s badState
		s.Ledger = g.ledger("")
		var err error
		if s.Job, err = g.store().GetJob(ctx, job); err != nil {
			t.Fatal(err)
		}
		if s.Sub, err = g.store().GetSubscription(ctx, "u-bad", "bad"); err != nil {
			t.Fatal(err)
		}
		if s.State, err = g.store().State(ctx, store.Account{UserID: "u-bad", ServiceID: "bad", Product: p}, time.Now()); err != nil {
			t.Fatal(err)
		}
		if s.Keys, err = g.store().ListKeys(ctx, ""); err != nil {
			t.Fatal(err)
		}
		return s
	}

	// The file before: stop the platform so the store closes, read it,
	// start again on the same file.
	stopPlatform := func() {
		g.tester.InitServer(fmt.Sprintf("{\n\tadmin localhost:%d\n}\n", adminPort), "caddyfile")
	}
	dbPath := filepath.Join(dir, "platform.db")
	stopPlatform()
	fileBefore := readStoreFile(t, dbPath)
	g = startGateway(t, dir, badCatalog(be.URL))

	cases := badCases(key, otherKey, nosubKey, revoked, job)
	admin := fmt.Sprintf("http://localhost:%d", adminPort)
	refused := map[string]int{}
	for _, tc := range cases {
		tc.url = strings.ReplaceAll(strings.ReplaceAll(tc.url, "{gw}", gwBase), "{admin}", admin)
		t.Run(tc.name, func(t *testing.T) {
			before := snapshot(t)
			hits := backendHits.Load()
			resp, body := sendBad(t, tc, jobCreated)
			if tc.status == 0 {
				if resp.StatusCode != 400 {
					t.Errorf("net/http should refuse: got %d %s", resp.StatusCode, body)
				}
			} else {
				if resp.StatusCode != tc.status {
					t.Errorf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("content type %q: %s", ct, body)
				}
				var e struct {
					Code, Message, Field string
				}
				if err := json.Unmarshal(body, &e); err != nil || e.Code == "" || e.Message == "" {
					t.Fatalf("not a JSON error: %q", body)
				}
				if e.Code != tc.code || tc.field != "" && e.Field != tc.field {
					t.Errorf("code %q field %q, want %q %q: %s", e.Code, e.Field, tc.code, tc.field, body)
				}
				refused[e.Code]++
			}
			for name := range resp.Header {
				if strings.HasPrefix(strings.ToLower(name), "x-evil") {
					t.Errorf("a header was injected into the response: %s", name)
				}
			}
			if backendHits.Load() != hits {
				t.Error("a refused request reached the backend")
			}
			if after := snapshot(t); !reflect.DeepEqual(before, after) {
				t.Errorf("a refused request changed the store:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}

	stopPlatform()
	fileAfter := readStoreFile(t, dbPath)
	if fileBefore.Digest != fileAfter.Digest {
		t.Errorf("the store file changed under %d refused requests: digest %s before, %s after", len(cases), fileBefore.Digest, fileAfter.Digest)
	}
	t.Logf("%d malformed requests refused, store file digest unchanged (%s…); codes %v", len(cases), fileBefore.Digest[:12], refused)
	if len(cases) < 100 {
		t.Errorf("only %d cases", len(cases))
	}
}

// sendBad sends one case and returns the answer.
func sendBad(t *testing.T, tc badCase, jobCreated time.Time) (*http.Response, []byte) {
	t.Helper()
	if tc.raw != "" {
		addr := strings.TrimPrefix(gwBase, "http://")
		if tc.toAdmin {
			addr = fmt.Sprintf("localhost:%d", adminPort)
		}
		return sendRaw(t, addr, tc.raw)
	}
	var rd io.Reader
	if tc.body != "" {
		rd = strings.NewReader(tc.body)
		if tc.chunked {
			rd = io.MultiReader(rd) // unknown length: sent chunked
		}
	}
	req, err := http.NewRequest(tc.method, tc.url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if tc.key != "" {
		req.Header.Set("Authorization", "Bearer "+tc.key)
	}
	if tc.sign != "" {
		ts := tc.ts
		if ts == "" {
			ts = strconv.FormatInt(time.Now().Unix(), 10)
		}
		sig := tc.sign
		if sig == "ok" {
			sig = e2etest.UsageSign(badSecret, []byte(tc.body), ts)
		}
		req.Header.Set("X-Platform-Signature", sig)
		req.Header.Set("X-Platform-Timestamp", ts)
	}
	for i := 0; i+1 < len(tc.header); i += 2 {
		req.Header.Set(tc.header[i], tc.header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// sendRaw writes a request byte for byte, for what an HTTP client library
// refuses to send.
func sendRaw(t *testing.T, addr, raw string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// badCases is the table. Usage bodies that are meant to reach the body
// checks are signed correctly ("ok"): the signature is checked first.
func badCases(key, otherKey, nosubKey, revoked, job string) []badCase {
	now := time.Now().Unix()
	invoke := "{gw}/api/service/bad/endpoint/echo/invoke"
	async := "{gw}/api/service/bad/endpoint/job/invoke/async"
	report := "{gw}/api/usage/report"
	progress := "{gw}/api/usage/progress/" + job
	complete := "{gw}/api/usage/complete/" + job
	status := "{gw}/api/requests/" + job + "/status"
	result := "{gw}/api/requests/" + job + "/result"
	jsonCT := []string{"Content-Type", "application/json"}
	rep := func(units string) string {
		return fmt.Sprintf(`{"userId":"u-bad","serviceId":"bad","unitsUsed":%s,"timestamp":%d}`, units, now)
	}
	prog := func(pct string) string {
		return fmt.Sprintf(`{"stage":"s","percentageComplete":%s,"timestamp":%d}`, pct, now)
	}
	done := func(fields string) string {
		return fmt.Sprintf(`{"status":"COMPLETED",%s"timestamp":%d}`, fields, now)
	}
	big := strings.Repeat("x", 65*1024)
	bigUsage := `{"userId":"u-bad","serviceId":"bad","unitsUsed":1,"timestamp":1,"pad":"` + strings.Repeat("p", 5000) + `"}`
	stale := strconv.FormatInt(now-3600, 10)
	future := strconv.FormatInt(now+3600, 10)
	otherSig := func(body string) string {
		return e2etest.UsageSign(usageSecret2, []byte(body), strconv.FormatInt(now, 10))
	}

	cases := []badCase{
		// Sync invoke: keys.
		{name: "invoke/no key", method: "GET", url: invoke, status: 401, code: "missing_key"},
		{name: "invoke/empty bearer", method: "GET", url: invoke, header: []string{"Authorization", "Bearer "}, status: 401, code: "missing_key"},
		{name: "invoke/basic auth", method: "GET", url: invoke, header: []string{"Authorization", "Basic dTpw"}, status: 401, code: "missing_key"},
		{name: "invoke/not a key", method: "GET", url: invoke, key: "hello", status: 401, code: "invalid_key"},
		{name: "invoke/key with bad checksum", method: "GET", url: invoke, key: key[:len(key)-1] + flip(key[len(key)-1]), status: 401, code: "invalid_key"},
		{name: "invoke/key too long", method: "GET", url: invoke, key: key + "0", status: 401, code: "invalid_key"},
		{name: "invoke/key in lower case", method: "GET", url: invoke, key: strings.ToLower(key), status: 401, code: "invalid_key"},
		{name: "invoke/key of 10k bytes", method: "GET", url: invoke, key: "psk_" + strings.Repeat("A", 10000), status: 401, code: "invalid_key"},
		{name: "invoke/revoked key", method: "GET", url: invoke, key: revoked, status: 401, code: "key_revoked"},
		{name: "invoke/no subscription", method: "GET", url: invoke, key: nosubKey, status: 403, code: "no_subscription"},
		// Sync invoke: route.
		{name: "invoke/unknown service", method: "GET", url: "{gw}/api/service/nope/endpoint/echo/invoke", key: key, status: 404, code: "service_not_found"},
		{name: "invoke/unknown endpoint", method: "GET", url: "{gw}/api/service/bad/endpoint/nope/invoke", key: key, status: 404, code: "endpoint_not_found"},
		{name: "invoke/dot-dot service", method: "GET", url: "{gw}/api/service/../endpoint/echo/invoke", key: key, status: 404, code: "service_not_found"},
		{name: "invoke/encoded dot-dot endpoint", method: "GET", url: "{gw}/api/service/bad/endpoint/%2e%2e/invoke", key: key, status: 404, code: "endpoint_not_found"},
		{name: "invoke/encoded slash in service", method: "GET", url: "{gw}/api/service/bad%2Fecho/endpoint/echo/invoke", key: key, status: 404, code: "not_found"},
		{name: "invoke/encoded traversal to admin", method: "GET", url: "{gw}/api/service/..%2F..%2Fplatform/endpoint/keys/invoke", key: key, status: 404, code: "not_found"},
		{name: "invoke/encoded CRLF in service", method: "GET", url: "{gw}/api/service/bad%0d%0aX-Evil:%201/endpoint/echo/invoke", key: key, status: 404, code: "service_not_found"},
		{name: "invoke/encoded NUL in endpoint", method: "GET", url: "{gw}/api/service/bad/endpoint/echo%00/invoke", key: key, status: 404, code: "endpoint_not_found"},
		{name: "invoke/invalid UTF-8 in service", method: "GET", url: "{gw}/api/service/%ff%fe/endpoint/echo/invoke", key: key, status: 404, code: "service_not_found"},
		{name: "invoke/service id of 5000 bytes", method: "GET", url: "{gw}/api/service/" + strings.Repeat("s", 5000) + "/endpoint/echo/invoke", key: key, status: 404, code: "service_not_found"},
		{name: "invoke/empty service", method: "GET", url: "{gw}/api/service//endpoint/echo/invoke", key: key, status: 404, code: "not_found"},
		{name: "invoke/trailing slash", method: "GET", url: invoke + "/", key: key, status: 404, code: "not_found"},
		{name: "invoke/sync suffix", method: "GET", url: invoke + "/sync", key: key, status: 404, code: "not_found"},
		{name: "invoke/upper-case INVOKE", method: "GET", url: "{gw}/api/service/bad/endpoint/echo/INVOKE", key: key, status: 404, code: "not_found"},
		// Sync invoke: method, protocol, body.
		{name: "invoke/PUT not allowed", method: "PUT", url: invoke, key: key, body: "x", status: 405, code: "method_not_allowed"},
		{name: "invoke/DELETE not allowed", method: "DELETE", url: invoke, key: key, status: 405, code: "method_not_allowed"},
		{name: "invoke/PATCH not allowed", method: "PATCH", url: invoke, key: key, body: "x", status: 405, code: "method_not_allowed"},
		{name: "invoke/unknown method", method: "BREW", url: invoke, key: key, status: 405, code: "method_not_allowed"},
		{name: "invoke/Upgrade websocket beside h2c", method: "GET", url: invoke, key: key, header: []string{"Upgrade", "h2c, websocket", "Connection", "Upgrade, HTTP2-Settings", "HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"}, status: 400, code: "invalid_request", field: "Upgrade"},
		{name: "invoke/Upgrade websocket", method: "GET", url: invoke, key: key, header: []string{"Upgrade", "websocket", "Connection", "Upgrade"}, status: 400, code: "invalid_request", field: "Upgrade"},
		{name: "invoke/body over the limit", method: "POST", url: invoke, key: key, body: big, status: 413, code: "payload_too_large"},
		{name: "invoke/chunked body over the limit", method: "POST", url: invoke, key: key, body: big, chunked: true, status: 413, code: "payload_too_large"},
		{name: "invoke/async on a sync endpoint", method: "POST", url: invoke + "/async", key: key, body: "x", status: 404, code: "endpoint_not_found"},
		// Async invoke.
		{name: "async/no key", method: "POST", url: async, body: "x", status: 401, code: "missing_key"},
		{name: "async/revoked key", method: "POST", url: async, key: revoked, body: "x", status: 401, code: "key_revoked"},
		{name: "async/no subscription", method: "POST", url: async, key: nosubKey, body: "x", status: 403, code: "no_subscription"},
		{name: "async/GET not allowed", method: "GET", url: async, key: key, status: 405, code: "method_not_allowed"},
		{name: "async/body over the limit", method: "POST", url: async, key: key, body: big, status: 413, code: "payload_too_large"},
		{name: "async/chunked body over the limit", method: "POST", url: async, key: key, body: big, chunked: true, status: 413, code: "payload_too_large"},
		{name: "async/sync endpoint", method: "POST", url: "{gw}/api/service/bad/endpoint/echo/invoke/async", key: key, body: "x", status: 404, code: "endpoint_not_found"},
		{name: "async/unknown service", method: "POST", url: "{gw}/api/service/zzz/endpoint/job/invoke/async", key: key, body: "x", status: 404, code: "service_not_found"},
		{name: "async/double async", method: "POST", url: async + "/async", key: key, body: "x", status: 404, code: "not_found"},

		// Report: the body is read before the signature (the signer is the
		// serviceId in it).
		{name: "report/GET", method: "GET", url: report, status: 405, code: "method_not_allowed"},
		{name: "report/PUT", method: "PUT", url: report, body: rep("1"), sign: "ok", status: 405, code: "method_not_allowed"},
		{name: "report/empty body", method: "POST", url: report, sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "report/not JSON", method: "POST", url: report, body: "hello", sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "report/truncated JSON", method: "POST", url: report, body: `{"userId":"u-bad",`, sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "report/JSON array", method: "POST", url: report, body: `[` + rep("1") + `]`, sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "report/JSON null", method: "POST", url: report, body: `null`, sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "report/trailing garbage", method: "POST", url: report, body: rep("1") + `}`, sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "report/NaN units", method: "POST", url: report, body: rep("NaN"), sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "report/Infinity units", method: "POST", url: report, body: rep("Infinity"), sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "report/invalid UTF-8 outside strings", method: "POST", url: report, body: "{\xff}", sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "report/form body", method: "POST", url: report, body: "userId=u-bad&serviceId=bad&unitsUsed=1", sign: "ok", header: []string{"Content-Type", "application/x-www-form-urlencoded"}, status: 400, code: "invalid_request", field: "body"},
		{name: "report/serviceId missing", method: "POST", url: report, body: `{"userId":"u-bad","unitsUsed":1,"timestamp":1}`, sign: "ok", status: 400, code: "invalid_request", field: "serviceId"},
		{name: "report/serviceId a number", method: "POST", url: report, body: `{"userId":"u-bad","serviceId":7,"unitsUsed":1,"timestamp":1}`, sign: "ok", status: 400, code: "invalid_request", field: "serviceId"},
		{name: "report/serviceId with NUL", method: "POST", url: report, body: `{"userId":"u-bad","serviceId":"bad\u0000","unitsUsed":1,"timestamp":1}`, sign: "ok", status: 400, code: "invalid_request", field: "serviceId"},
		{name: "report/unknown service", method: "POST", url: report, body: `{"userId":"u-bad","serviceId":"nope","unitsUsed":1,"timestamp":1}`, sign: "ok", status: 401, code: "invalid_signature"},
		{name: "report/unsigned", method: "POST", url: report, body: rep("1"), status: 401, code: "invalid_signature"},
		{name: "report/signature of another service", method: "POST", url: report, body: rep("1"), sign: otherSig(rep("1")), ts: strconv.FormatInt(now, 10), status: 401, code: "invalid_signature"},
		{name: "report/signature not base64", method: "POST", url: report, body: rep("1"), sign: "%%%not-base64%%%", status: 401, code: "invalid_signature"},
		{name: "report/signature of 10k bytes", method: "POST", url: report, body: rep("1"), sign: strings.Repeat("A", 10000), status: 401, code: "invalid_signature"},
		{name: "report/tampered body", method: "POST", url: report, body: rep("1"), sign: e2etest.UsageSign(badSecret, []byte(rep("2")), strconv.FormatInt(now, 10)), ts: strconv.FormatInt(now, 10), status: 401, code: "invalid_signature"},
		{name: "report/stale timestamp", method: "POST", url: report, body: rep("1"), sign: "ok", ts: stale, status: 401, code: "stale_timestamp"},
		{name: "report/future timestamp", method: "POST", url: report, body: rep("1"), sign: "ok", ts: future, status: 401, code: "stale_timestamp"},
		{name: "report/timestamp not a number", method: "POST", url: report, body: rep("1"), sign: "ok", ts: "yesterday", status: 401, code: "stale_timestamp"},
		{name: "report/negative timestamp", method: "POST", url: report, body: rep("1"), sign: "ok", ts: "-1", status: 401, code: "stale_timestamp"},
		{name: "report/units negative", method: "POST", url: report, body: rep("-1"), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units zero", method: "POST", url: report, body: rep("0"), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units negative zero", method: "POST", url: report, body: rep("-0"), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units huge", method: "POST", url: report, body: rep("1e400"), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units past int64", method: "POST", url: report, body: rep("99999999999999999999999"), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units 7 decimals", method: "POST", url: report, body: rep("0.0000001"), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units a word", method: "POST", url: report, body: rep(`"lots"`), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units a boolean", method: "POST", url: report, body: rep("true"), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units an object", method: "POST", url: report, body: rep(`{"n":1}`), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units hex", method: "POST", url: report, body: rep(`"0x10"`), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units missing", method: "POST", url: report, body: fmt.Sprintf(`{"userId":"u-bad","serviceId":"bad","timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/units null", method: "POST", url: report, body: rep("null"), sign: "ok", status: 400, code: "invalid_request", field: "unitsUsed"},
		{name: "report/userId missing", method: "POST", url: report, body: fmt.Sprintf(`{"serviceId":"bad","unitsUsed":1,"timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "userId"},
		{name: "report/userId an array", method: "POST", url: report, body: fmt.Sprintf(`{"userId":["u-bad"],"serviceId":"bad","unitsUsed":1,"timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "userId"},
		{name: "report/userId with CRLF", method: "POST", url: report, body: fmt.Sprintf(`{"userId":"u-bad\r\nX-Evil: 1","serviceId":"bad","unitsUsed":1,"timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "userId"},
		{name: "report/userId of 300 bytes", method: "POST", url: report, body: fmt.Sprintf(`{"userId":"%s","serviceId":"bad","unitsUsed":1,"timestamp":%d}`, strings.Repeat("u", 300), now), sign: "ok", status: 400, code: "invalid_request", field: "userId"},
		{name: "report/userId invalid UTF-8", method: "POST", url: report, body: fmt.Sprintf("{\"userId\":\"u-\xff\",\"serviceId\":\"bad\",\"unitsUsed\":1,\"timestamp\":%d}", now), sign: "ok", status: 400, code: "invalid_request", field: "userId"},
		{name: "report/userId a lone surrogate", method: "POST", url: report, body: fmt.Sprintf(`{"userId":"u-\ud800","serviceId":"bad","unitsUsed":1,"timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "userId"},
		{name: "report/user without subscription", method: "POST", url: report, body: fmt.Sprintf(`{"userId":"u-nosub","serviceId":"bad","unitsUsed":1,"timestamp":%d}`, now), sign: "ok", status: 403, code: "no_subscription"},
		{name: "report/timestamp missing", method: "POST", url: report, body: `{"userId":"u-bad","serviceId":"bad","unitsUsed":1}`, sign: "ok", status: 400, code: "invalid_request", field: "timestamp"},
		{name: "report/timestamp garbage", method: "POST", url: report, body: `{"userId":"u-bad","serviceId":"bad","unitsUsed":1,"timestamp":"soon"}`, sign: "ok", status: 400, code: "invalid_request", field: "timestamp"},
		{name: "report/timestamp in the future", method: "POST", url: report, body: `{"userId":"u-bad","serviceId":"bad","unitsUsed":1,"timestamp":"2999-01-01T00:00:00Z"}`, sign: "ok", status: 400, code: "invalid_request", field: "timestamp"},
		{name: "report/timestamp an object", method: "POST", url: report, body: `{"userId":"u-bad","serviceId":"bad","unitsUsed":1,"timestamp":{}}`, sign: "ok", status: 400, code: "invalid_request", field: "timestamp"},
		{name: "report/timestamp negative", method: "POST", url: report, body: `{"userId":"u-bad","serviceId":"bad","unitsUsed":1,"timestamp":-5}`, sign: "ok", status: 400, code: "invalid_request", field: "timestamp"},
		{name: "report/timestamp 1e400", method: "POST", url: report, body: `{"userId":"u-bad","serviceId":"bad","unitsUsed":1,"timestamp":1e400}`, sign: "ok", status: 400, code: "invalid_request", field: "timestamp"},
		{name: "report/Idempotency-Key of 300 bytes", method: "POST", url: report, body: rep("1"), sign: "ok", header: []string{"Idempotency-Key", strings.Repeat("k", 300)}, status: 400, code: "invalid_request", field: "Idempotency-Key"},
		{name: "report/Idempotency-Key with UTF-8", method: "POST", url: report, body: rep("1"), sign: "ok", header: []string{"Idempotency-Key", "clé"}, status: 400, code: "invalid_request", field: "Idempotency-Key"},
		{name: "report/body over the limit", method: "POST", url: report, body: bigUsage, sign: "ok", status: 413, code: "payload_too_large"},
		{name: "report/chunked body over the limit", method: "POST", url: report, body: bigUsage, sign: "ok", chunked: true, status: 413, code: "payload_too_large"},
		{name: "report/ECS prefix, unsigned", method: "POST", url: "{gw}/usage/api/v1/report", body: rep("1"), status: 401, code: "invalid_signature"},
		{name: "report/trailing slash", method: "POST", url: report + "/", body: rep("1"), sign: "ok", status: 404, code: "not_found"},

		// Progress: the job is looked up first, then the signature.
		{name: "progress/unknown job", method: "POST", url: "{gw}/api/usage/progress/no-such-job", body: prog("5"), sign: "ok", status: 404, code: "request_not_found"},
		{name: "progress/dot-dot id", method: "POST", url: "{gw}/api/usage/progress/..", body: prog("5"), sign: "ok", status: 404, code: "request_not_found"},
		{name: "progress/encoded dot-dot id", method: "POST", url: "{gw}/api/usage/progress/%2e%2e", body: prog("5"), sign: "ok", status: 404, code: "request_not_found"},
		{name: "progress/encoded slash traversal", method: "POST", url: "{gw}/api/usage/progress/..%2f..%2freport", body: rep("1"), sign: "ok", status: 404, code: "not_found"},
		{name: "progress/traversal to report", method: "POST", url: "{gw}/api/usage/progress/../report", body: rep("1"), sign: "ok", status: 404, code: "not_found"},
		{name: "progress/id of 200 bytes", method: "POST", url: "{gw}/api/usage/progress/" + strings.Repeat("j", 200), body: prog("5"), sign: "ok", status: 404, code: "not_found"},
		{name: "progress/empty id", method: "POST", url: "{gw}/api/usage/progress/", body: prog("5"), sign: "ok", status: 404, code: "not_found"},
		{name: "progress/PUT", method: "PUT", url: progress, body: prog("5"), sign: "ok", status: 405, code: "method_not_allowed"},
		{name: "progress/DELETE", method: "DELETE", url: progress, status: 405, code: "method_not_allowed"},
		{name: "progress/unsigned", method: "POST", url: progress, body: prog("5"), status: 401, code: "invalid_signature"},
		{name: "progress/signed by another service", method: "POST", url: progress, body: prog("5"), sign: otherSig(prog("5")), ts: strconv.FormatInt(now, 10), status: 401, code: "invalid_signature"},
		{name: "progress/tampered body", method: "POST", url: progress, body: prog("6"), sign: e2etest.UsageSign(badSecret, []byte(prog("5")), strconv.FormatInt(now, 10)), ts: strconv.FormatInt(now, 10), status: 401, code: "invalid_signature"},
		{name: "progress/timestamp before the job", method: "POST", url: progress, body: prog("5"), sign: "ok", ts: stale, status: 401, code: "stale_timestamp"},
		{name: "progress/timestamp in the future", method: "POST", url: progress, body: prog("5"), sign: "ok", ts: future, status: 401, code: "stale_timestamp"},
		{name: "progress/percentage 101", method: "POST", url: progress, body: prog("101"), sign: "ok", status: 400, code: "invalid_request", field: "percentageComplete"},
		{name: "progress/percentage negative", method: "POST", url: progress, body: prog("-1"), sign: "ok", status: 400, code: "invalid_request", field: "percentageComplete"},
		{name: "progress/percentage 1e400", method: "POST", url: progress, body: prog("1e400"), sign: "ok", status: 400, code: "invalid_request", field: "percentageComplete"},
		{name: "progress/percentage a string", method: "POST", url: progress, body: prog(`"50"`), sign: "ok", status: 400, code: "invalid_request", field: "percentageComplete"},
		{name: "progress/percentage NaN", method: "POST", url: progress, body: prog("NaN"), sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "progress/percentage missing", method: "POST", url: progress, body: fmt.Sprintf(`{"stage":"s","timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "percentageComplete"},
		{name: "progress/stage missing", method: "POST", url: progress, body: fmt.Sprintf(`{"percentageComplete":5,"timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "stage"},
		{name: "progress/stage blank", method: "POST", url: progress, body: fmt.Sprintf(`{"stage":"  ","percentageComplete":5,"timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "stage"},
		{name: "progress/stage a number", method: "POST", url: progress, body: fmt.Sprintf(`{"stage":3,"percentageComplete":5,"timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "stage"},
		{name: "progress/stage over 1 KiB", method: "POST", url: progress, body: fmt.Sprintf(`{"stage":"%s","percentageComplete":5,"timestamp":%d}`, strings.Repeat("s", 1100), now), sign: "ok", status: 400, code: "invalid_request", field: "stage"},
		{name: "progress/errorMessage a number", method: "POST", url: progress, body: fmt.Sprintf(`{"stage":"s","percentageComplete":5,"errorMessage":500,"timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "errorMessage"},
		{name: "progress/timestamp missing", method: "POST", url: progress, body: `{"stage":"s","percentageComplete":5}`, sign: "ok", status: 400, code: "invalid_request", field: "timestamp"},
		{name: "progress/body over the limit", method: "POST", url: progress, body: usageBig, sign: "ok", status: 413, code: "payload_too_large"},
		{name: "progress/not JSON", method: "POST", url: progress, body: "stage=s", sign: "ok", header: []string{"Content-Type", "text/plain"}, status: 400, code: "invalid_request", field: "body"},
		{name: "progress/status URL, unsigned", method: "POST", url: status, body: prog("5"), status: 401, code: "invalid_signature"},

		// Completion.
		{name: "complete/unknown job", method: "POST", url: "{gw}/api/usage/complete/nope", body: done(""), sign: "ok", status: 404, code: "request_not_found"},
		{name: "complete/encoded dot-dot id", method: "POST", url: "{gw}/api/usage/complete/%2E%2E", body: done(""), sign: "ok", status: 404, code: "request_not_found"},
		{name: "complete/encoded slash", method: "POST", url: "{gw}/api/usage/complete/" + job + "%2Fx", body: done(""), sign: "ok", status: 404, code: "not_found"},
		{name: "complete/NUL in id", method: "POST", url: "{gw}/api/usage/complete/" + job + "%00", body: done(""), sign: "ok", status: 404, code: "not_found"},
		{name: "complete/GET", method: "GET", url: complete, key: key, status: 405, code: "method_not_allowed"},
		{name: "complete/unsigned", method: "POST", url: complete, body: done(""), status: 401, code: "invalid_signature"},
		{name: "complete/signed by another service", method: "POST", url: complete, body: done(""), sign: otherSig(done("")), ts: strconv.FormatInt(now, 10), status: 401, code: "invalid_signature"},
		{name: "complete/tampered units", method: "POST", url: complete, body: done(`"units":1000,`), sign: e2etest.UsageSign(badSecret, []byte(done(`"units":1,`)), strconv.FormatInt(now, 10)), ts: strconv.FormatInt(now, 10), status: 401, code: "invalid_signature"},
		{name: "complete/replayed from before the job", method: "POST", url: complete, body: done(""), sign: "ok", ts: stale, status: 401, code: "stale_timestamp"},
		{name: "complete/timestamp in milliseconds, stale", method: "POST", url: complete, body: done(""), sign: "ok", ts: stale + "000", status: 401, code: "stale_timestamp"},
		{name: "complete/units negative", method: "POST", url: complete, body: done(`"units":-3,`), sign: "ok", status: 400, code: "invalid_request", field: "units"},
		{name: "complete/units huge", method: "POST", url: complete, body: done(`"units":1e400,`), sign: "ok", status: 400, code: "invalid_request", field: "units"},
		{name: "complete/units 7 decimals", method: "POST", url: complete, body: done(`"units":"1.0000001",`), sign: "ok", status: 400, code: "invalid_request", field: "units"},
		{name: "complete/units an array", method: "POST", url: complete, body: done(`"units":[1],`), sign: "ok", status: 400, code: "invalid_request", field: "units"},
		{name: "complete/units Infinity", method: "POST", url: complete, body: done(`"units":Infinity,`), sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "complete/status a number", method: "POST", url: complete, body: fmt.Sprintf(`{"status":1,"timestamp":%d}`, now), sign: "ok", status: 400, code: "invalid_request", field: "status"},
		{name: "complete/resultUrl javascript", method: "POST", url: complete, body: done(`"resultUrl":"javascript:alert(1)",`), sign: "ok", status: 400, code: "invalid_request", field: "resultUrl"},
		{name: "complete/resultUrl file", method: "POST", url: complete, body: done(`"resultUrl":"file:///etc/passwd",`), sign: "ok", status: 400, code: "invalid_request", field: "resultUrl"},
		{name: "complete/resultUrl relative", method: "POST", url: complete, body: done(`"resultUrl":"/out.json",`), sign: "ok", status: 400, code: "invalid_request", field: "resultUrl"},
		{name: "complete/resultUrl with user info", method: "POST", url: complete, body: done(`"resultUrl":"https://u:p@example.com/x",`), sign: "ok", status: 400, code: "invalid_request", field: "resultUrl"},
		{name: "complete/resultUrl a number", method: "POST", url: complete, body: done(`"resultUrl":7,`), sign: "ok", status: 400, code: "invalid_request", field: "resultUrl"},
		{name: "complete/contentType garbage", method: "POST", url: complete, body: done(`"contentType":"not a media type",`), sign: "ok", status: 400, code: "invalid_request", field: "contentType"},
		{name: "complete/contentType with CRLF", method: "POST", url: complete, body: done(`"contentType":"text/html\r\nX-Evil: 1",`), sign: "ok", status: 400, code: "invalid_request", field: "contentType"},
		{name: "complete/timestamp missing", method: "POST", url: complete, body: `{"status":"COMPLETED"}`, sign: "ok", status: 400, code: "invalid_request", field: "timestamp"},
		{name: "complete/body a string", method: "POST", url: complete, body: `"COMPLETED"`, sign: "ok", status: 400, code: "invalid_request", field: "body"},
		{name: "complete/body over the limit", method: "POST", url: complete, body: done(`"result":"` + strings.Repeat("r", 5000) + `",`), sign: "ok", status: 413, code: "payload_too_large"},

		// Status and result (callers, with their key).
		{name: "status/no key", method: "GET", url: status, status: 401, code: "missing_key"},
		{name: "status/not a key", method: "GET", url: status, key: "psk_nope", status: 401, code: "invalid_key"},
		{name: "status/revoked key", method: "GET", url: status, key: revoked, status: 401, code: "key_revoked"},
		{name: "status/another user's job", method: "GET", url: status, key: otherKey, status: 404, code: "request_not_found"},
		{name: "status/unknown job", method: "GET", url: "{gw}/api/requests/nope/status", key: key, status: 404, code: "request_not_found"},
		{name: "status/dot-dot id", method: "GET", url: "{gw}/api/requests/../status", key: key, status: 404, code: "request_not_found"},
		{name: "status/encoded traversal", method: "GET", url: "{gw}/api/requests/..%2F..%2Fusage%2Freport/status", key: key, status: 404, code: "not_found"},
		{name: "status/PUT", method: "PUT", url: status, key: key, body: "{}", status: 405, code: "method_not_allowed"},
		{name: "result/no key", method: "GET", url: result, status: 401, code: "missing_key"},
		{name: "result/another user's job", method: "GET", url: result, key: otherKey, status: 404, code: "request_not_found"},
		{name: "result/POST", method: "POST", url: result, key: key, body: "{}", status: 405, code: "method_not_allowed"},
		{name: "result/unknown job", method: "GET", url: "{gw}/gateway/api/v1/requests/" + strings.Repeat("0", 128) + "/result", key: key, status: 404, code: "request_not_found"},
		{name: "requests/unknown route", method: "GET", url: "{gw}/api/requests/" + job + "/cancel", key: key, status: 404, code: "not_found"},

		// Raw requests an HTTP library would not send.
		{name: "raw/Idempotency-Key with obs-text", raw: rawSigned(report, rep("1"), "Idempotency-Key: k\xff\xfe"), status: 400, code: "invalid_request", field: "Idempotency-Key"},
		{name: "raw/CR in a header value", raw: "GET /api/service/bad/endpoint/echo/invoke HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key + "\rX-Evil: 1\r\n\r\n", status: 0},
		// net/http joins a folded line to the one before (RFC 9112 5.2): the
		// smuggled header ends up inside the key, which no longer checks.
		{name: "raw/obs-fold smuggling a header into the key", raw: "GET /api/service/bad/endpoint/echo/invoke HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key + "\r\n X-Platform-User-ID: admin\r\n\r\n", status: 401, code: "invalid_key"},
		{name: "raw/NUL in a header value", raw: "GET /api/service/bad/endpoint/echo/invoke HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key + "\x00\r\n\r\n", status: 0},
		{name: "raw/space in the path", raw: "GET /api/service/bad/endpoint/echo /invoke HTTP/1.1\r\nHost: x\r\n\r\n", status: 0},
		{name: "raw/invalid UTF-8 in the path", raw: "GET /api/service/\xff\xfe/endpoint/echo/invoke HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key + "\r\n\r\n", status: 404, code: "service_not_found"},
		{name: "raw/two Content-Lengths", raw: "POST /api/usage/report HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", status: 0},
		{name: "raw/chunked and Content-Length", raw: "POST /api/usage/report HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", status: 0},
	}
	// The admin API, on Caddy's admin endpoint: nothing an operator sends
	// wrongly may write anything.
	a := "{admin}/platform"
	cases = append(cases, []badCase{
		{name: "admin/keys: not JSON", method: "POST", url: a + "/keys", body: "userId=u", header: []string{"Content-Type", "application/x-www-form-urlencoded"}, status: 400, code: "invalid_request", field: "body"},
		{name: "admin/keys: empty body", method: "POST", url: a + "/keys", header: jsonCT, status: 400, code: "invalid_request", field: "body"},
		{name: "admin/keys: array", method: "POST", url: a + "/keys", body: `[{"userId":"u"}]`, header: jsonCT, status: 400, code: "invalid_request", field: "body"},
		{name: "admin/keys: two objects", method: "POST", url: a + "/keys", body: `{"userId":"u"}{"userId":"v"}`, header: jsonCT, status: 400, code: "invalid_request", field: "body"},
		{name: "admin/keys: unknown field", method: "POST", url: a + "/keys", body: `{"userId":"u","admin":true}`, header: jsonCT, status: 400, code: "invalid_request", field: "admin"},
		{name: "admin/keys: userId missing", method: "POST", url: a + "/keys", body: `{"roles":["a"]}`, header: jsonCT, status: 400, code: "invalid_request", field: "userId"},
		{name: "admin/keys: userId a number", method: "POST", url: a + "/keys", body: `{"userId":42}`, header: jsonCT, status: 400, code: "invalid_request", field: "userId"},
		{name: "admin/keys: userId with a slash", method: "POST", url: a + "/keys", body: `{"userId":"../u"}`, header: jsonCT, status: 400, code: "invalid_request", field: "userId"},
		{name: "admin/keys: userId with CRLF", method: "POST", url: a + "/keys", body: `{"userId":"u\r\nX-Evil: 1"}`, header: jsonCT, status: 400, code: "invalid_request", field: "userId"},
		{name: "admin/keys: userId invalid UTF-8", method: "POST", url: a + "/keys", body: "{\"userId\":\"u\xff\"}", header: jsonCT, status: 400, code: "invalid_request", field: "body"},
		{name: "admin/keys: userId a lone surrogate", method: "POST", url: a + "/keys", body: `{"userId":"u\udfff"}`, header: jsonCT, status: 400, code: "invalid_request", field: "userId"},
		{name: "admin/keys: userId of 200 bytes", method: "POST", url: a + "/keys", body: `{"userId":"` + strings.Repeat("u", 200) + `"}`, header: jsonCT, status: 400, code: "invalid_request", field: "userId"},
		{name: "admin/keys: role with a comma", method: "POST", url: a + "/keys", body: `{"userId":"u","roles":["a,b"]}`, header: jsonCT, status: 400, code: "invalid_request", field: "roles"},
		{name: "admin/keys: roles a string", method: "POST", url: a + "/keys", body: `{"userId":"u","roles":"admin"}`, header: jsonCT, status: 400, code: "invalid_request", field: "roles"},
		{name: "admin/keys: 40 roles", method: "POST", url: a + "/keys", body: `{"userId":"u","roles":["r` + strings.Repeat(`","r`, 39) + `"]}`, header: jsonCT, status: 400, code: "invalid_request", field: "roles"},
		{name: "admin/keys: label with a control character", method: "POST", url: a + "/keys", body: `{"userId":"u","label":"a\u0007b"}`, header: jsonCT, status: 400, code: "invalid_request", field: "label"},
		{name: "admin/keys: expiresAt garbage", method: "POST", url: a + "/keys", body: `{"userId":"u","expiresAt":"tomorrow"}`, header: jsonCT, status: 400, code: "invalid_request", field: "expiresAt"},
		{name: "admin/keys: expiresAt in the past", method: "POST", url: a + "/keys", body: `{"userId":"u","expiresAt":"2000-01-01T00:00:00Z"}`, header: jsonCT, status: 400, code: "invalid_request", field: "expiresAt"},
		{name: "admin/keys: body over 1 MiB", method: "POST", url: a + "/keys", body: `{"userId":"u","label":"` + strings.Repeat("l", 1<<20) + `"}`, header: jsonCT, status: 413, code: "payload_too_large"},
		{name: "admin/keys: PUT", method: "PUT", url: a + "/keys", body: `{"userId":"u"}`, header: jsonCT, status: 405, code: "method_not_allowed"},
		{name: "admin/keys: repeated query", method: "GET", url: a + "/keys?userId=a&userId=b", status: 400, code: "invalid_request", field: "userId"},
		{name: "admin/keys: unknown query", method: "GET", url: a + "/keys?user=a", status: 400, code: "invalid_request", field: "user"},
		{name: "admin/keys: revoke an unknown key", method: "DELETE", url: a + "/keys/key_nope", status: 404, code: "not_found"},
		{name: "admin/keys: revoke by traversal", method: "DELETE", url: a + "/keys/..%2F..%2Fconfig", status: 404, code: "not_found"},
		{name: "admin/keys: bad escape", raw: "DELETE /platform/keys/%zz HTTP/1.1\r\nHost: localhost\r\n\r\n", toAdmin: true, status: 0},
		{name: "admin/subscriptions: unknown product", method: "PUT", url: a + "/subscriptions/u-bad/bad", body: `{"productId":"gold"}`, header: jsonCT, status: 400, code: "invalid_request", field: "productId"},
		{name: "admin/subscriptions: unknown service", method: "PUT", url: a + "/subscriptions/u-bad/nope", body: `{"productId":"quota"}`, header: jsonCT, status: 400, code: "invalid_request", field: "serviceId"},
		{name: "admin/subscriptions: bad status", method: "PUT", url: a + "/subscriptions/u-bad/bad", body: `{"productId":"quota","status":"ROOT"}`, header: jsonCT, status: 400, code: "invalid_request", field: "status"},
		{name: "admin/subscriptions: productId a number", method: "PUT", url: a + "/subscriptions/u-bad/bad", body: `{"productId":1}`, header: jsonCT, status: 400, code: "invalid_request", field: "productId"},
		{name: "admin/subscriptions: productId missing", method: "PUT", url: a + "/subscriptions/u-bad/bad", body: `{"status":"ACTIVE"}`, header: jsonCT, status: 400, code: "invalid_request", field: "productId"},
		{name: "admin/subscriptions: NUL in user id", method: "PUT", url: a + "/subscriptions/u%00bad/bad", body: `{"productId":"quota"}`, header: jsonCT, status: 400, code: "invalid_request", field: "userId"},
		{name: "admin/subscriptions: DELETE", method: "DELETE", url: a + "/subscriptions/u-bad/bad", status: 405, code: "method_not_allowed"},
		{name: "admin/credits: amount a word", method: "POST", url: a + "/subscriptions/u-bad/bad/credits", body: `{"amount":"many"}`, header: jsonCT, status: 400, code: "invalid_request", field: "amount"},
		{name: "admin/credits: amount zero", method: "POST", url: a + "/subscriptions/u-bad/bad/credits", body: `{"amount":0}`, header: jsonCT, status: 400, code: "invalid_request", field: "amount"},
		{name: "admin/credits: amount 1e400", method: "POST", url: a + "/subscriptions/u-bad/bad/credits", body: `{"amount":1e400}`, header: jsonCT, status: 400, code: "invalid_request", field: "amount"},
		{name: "admin/credits: amount past the maximum", method: "POST", url: a + "/subscriptions/u-bad/bad/credits", body: `{"amount":"9223372036854775807"}`, header: jsonCT, status: 400, code: "invalid_request", field: "amount"},
		{name: "admin/credits: amount NaN", method: "POST", url: a + "/subscriptions/u-bad/bad/credits", body: `{"amount":NaN}`, header: jsonCT, status: 400, code: "invalid_request", field: "body"},
		{name: "admin/credits: amount 7 decimals", method: "POST", url: a + "/subscriptions/u-bad/bad/credits", body: `{"amount":0.0000001}`, header: jsonCT, status: 400, code: "invalid_request", field: "amount"},
		{name: "admin/credits: amount double negative", method: "POST", url: a + "/subscriptions/u-bad/bad/credits", body: `{"amount":"--5"}`, header: jsonCT, status: 400, code: "invalid_request", field: "amount"},
		{name: "admin/credits: amount missing", method: "POST", url: a + "/subscriptions/u-bad/bad/credits", body: `{}`, header: jsonCT, status: 400, code: "invalid_request", field: "amount"},
		{name: "admin/credits: amount true", method: "POST", url: a + "/subscriptions/u-bad/bad/credits", body: `{"amount":true}`, header: jsonCT, status: 400, code: "invalid_request", field: "amount"},
		{name: "admin/credits: no subscription", method: "POST", url: a + "/subscriptions/u-nosub/bad/credits", body: `{"amount":5}`, header: jsonCT, status: 404, code: "not_found"},
		{name: "admin/usage: bad format", method: "GET", url: a + "/usage?format=xml", status: 400, code: "invalid_request", field: "format"},
		{name: "admin/usage: bad from", method: "GET", url: a + "/usage?from=yesterday", status: 400, code: "invalid_request", field: "from"},
		{name: "admin/usage: to before from", method: "GET", url: a + "/usage?from=2026-02-01&to=2026-01-01", status: 400, code: "invalid_request", field: "to"},
		{name: "admin/jobs: unknown", method: "GET", url: a + "/jobs/nope", status: 404, code: "request_not_found"},
		{name: "admin/jobs: POST", method: "POST", url: a + "/jobs/" + job, body: "{}", header: jsonCT, status: 405, code: "method_not_allowed"},
		{name: "admin/unknown route", method: "GET", url: a + "/secrets", status: 404, code: "not_found"},
	}...)
	return cases
}

// rawSigned is a raw signed POST with one extra header line.
func rawSigned(url, body, extra string) string {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	path := strings.TrimPrefix(url, "{gw}")
	return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
		"X-Platform-Signature: " + e2etest.UsageSign(badSecret, []byte(body), ts) + "\r\nX-Platform-Timestamp: " + ts + "\r\n" +
		extra + "\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body
}

// flip changes a base62 character into another.
func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}
