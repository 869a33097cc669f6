package e2e

import (
	"bytes"
	"compress/gzip"
	"crypto/hmac"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// wrapBackend is a backend for the sync_response tests: it verifies each
// call's v3 signature with the test's own HMAC code and answers by path.
type wrapBackend struct {
	*httptest.Server
}

func newWrapBackend(t *testing.T) *wrapBackend {
	b := &wrapBackend{}
	sig := &testBackend{secret: testSecret, brand: "Platform"}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		want := v3Signature(testSecret, body, r.Header.Get("X-Platform-Timestamp"), sig.contextString(r.Header))
		if !hmac.Equal([]byte(want), []byte(r.Header.Get("X-Platform-Signature"))) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/json", "/raw":
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.Header().Set("ETag", `"v1"`)
			w.Header().Set("Set-Cookie", "s=1")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"msg":"<a&b> \"q\" é`+"\u2028"+`"}`)
		case "/plain":
			w.Header()["Content-Type"] = nil // none at all, not even sniffed
			io.WriteString(w, "line1\nline2\ttab\x01")
		case "/gzip":
			if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
				w.Header().Set("Content-Encoding", "gzip")
				zw := gzip.NewWriter(w)
				io.WriteString(zw, "zipped")
				zw.Close()
				return
			}
			io.WriteString(w, "plain text")
		case "/missing":
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, "no such thing: "+strings.Repeat("x", 600))
		case "/busy":
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, "slow down")
		case "/broken":
			http.Error(w, "backend broke", http.StatusServiceUnavailable)
		case "/big":
			w.Write(bytes.Repeat([]byte("b"), 3000))
		case "/bytes":
			w.Write(bytes.Repeat([]byte("b"), 700))
		case "/cut", "/cutbytes":
			// Declares 1,000 bytes, sends 100 and closes the connection.
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(http.StatusOK)
			w.Write(bytes.Repeat([]byte("c"), 100))
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		case "/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				w.(http.Flusher).Flush()
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(b.Close)
	return b
}

// wrapCatalog: service wrap answers wrapped except its endpoint raw;
// service plain answers raw except its endpoint wrapped. 2KiB is the
// invoke body limit, and so the most a wrapped answer holds.
func wrapCatalog(backend string) string {
	return fmt.Sprintf(`
		max_body_bytes 2KiB
		service wrap {
			backend %[1]s
			secret %[2]s
			sync_response wrapped
			endpoint json
			endpoint plain
			endpoint gzip
			endpoint missing
			endpoint busy
			endpoint broken
			endpoint big
			endpoint bytes
			endpoint cut
			endpoint cutbytes
			endpoint stream {
				streaming
			}
			endpoint raw {
				sync_response raw
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
			}
			product bytes {
				billing USAGE_POSTPAID
				measurement PER_BYTE
				unit byte
				price 0.001
			}
		}
		service plain {
			backend %[1]s
			secret %[2]s
			endpoint bytes
			endpoint json {
				sync_response wrapped
			}
			product bytes {
				billing USAGE_POSTPAID
				measurement PER_BYTE
				unit byte
				price 0.001
			}
		}`, backend, testSecret)
}

var wrappedPattern = regexp.MustCompile(`^\{"requestId":"([0-9a-f-]{36})","status":"COMPLETED","result":(.*),"contentType":(".*"),"resultUrl":null,"size":(\d+),"completedAt":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"\}$`)

func TestCompatSyncResponseWrapped(t *testing.T) {
	be := newWrapBackend(t)
	g := startGateway(t, t.TempDir(), wrapCatalog(be.URL))
	key, _ := g.newKey("u-wrap")
	g.subscribe("u-wrap", "wrap", "basic", "ACTIVE")

	// wrapped checks a wrapped 200 byte for byte and returns its fields.
	wrapped := func(t *testing.T, resp *http.Response, body []byte, result, contentType string, size int) {
		t.Helper()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("status %d, Content-Type %q, body %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		m := wrappedPattern.FindStringSubmatch(string(body))
		if m == nil {
			t.Fatalf("not the wrapped shape: %s", body)
		}
		id := resp.Header.Get("X-Platform-Request-ID")
		want := fmt.Sprintf(`{"requestId":%q,"status":"COMPLETED","result":%s,"contentType":%s,"resultUrl":null,"size":%d,"completedAt":%q}`,
			id, result, contentType, size, m[5])
		if string(body) != want {
			t.Errorf("body\n got %s\nwant %s", body, want)
		}
		at, err := time.Parse(time.RFC3339Nano, m[5])
		if err != nil || time.Since(at) > time.Minute || time.Until(at) > time.Minute {
			t.Errorf("completedAt %s: %v", m[5], err)
		}
		if cl := resp.Header.Get("Content-Length"); cl != fmt.Sprint(len(body)) {
			t.Errorf("Content-Length %q for %d bytes", cl, len(body))
		}
	}

	t.Run("a 2xx JSON answer is wrapped: 200, the body as a string escaped as Jackson does", func(t *testing.T) {
		resp, body := call(t, "POST", invokeURL("wrap", "json"), key, `{"in":1}`)
		backendBody := `{"msg":"<a&b> \"q\" é` + "\u2028" + `"}`
		wrapped(t, resp, body, `"{\"msg\":\"<a&b> \\\"q\\\" é`+"\u2028"+`\"}"`, `"application/json; charset=utf-8"`, len(backendBody))
		if resp.Header.Get("ETag") != "" || resp.Header.Get("Set-Cookie") != "s=1" || resp.Header.Get("RateLimit-Policy") == "" {
			t.Errorf("headers %v: want no ETag (it described the backend's body), the cookie and the allowance", resp.Header)
		}
	})

	t.Run("no Content-Type is text/plain; control characters escaped", func(t *testing.T) {
		resp, body := call(t, "GET", invokeURL("wrap", "plain"), key, "")
		wrapped(t, resp, body, `"line1\nline2\ttab\u0001"`, `"text/plain"`, 16)
	})

	t.Run("the caller's Accept-Encoding is not forwarded: the result is text", func(t *testing.T) {
		resp, body := call(t, "GET", invokeURL("wrap", "gzip"), key, "", "Accept-Encoding", "gzip")
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"result":"`) || strings.Contains(string(body), "\\u001f") {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		m := wrappedPattern.FindStringSubmatch(string(body))
		if m == nil || (m[2] != `"zipped"` && m[2] != `"plain text"`) {
			t.Errorf("result not the decoded text: %s", body)
		}
	})

	t.Run("an endpoint set to raw, and a service set to raw with a wrapped endpoint", func(t *testing.T) {
		resp, body := call(t, "GET", invokeURL("wrap", "raw"), key, "")
		if resp.StatusCode != 201 || string(body) != `{"msg":"<a&b> \"q\" é`+"\u2028"+`"}` || resp.Header.Get("ETag") != `"v1"` {
			t.Errorf("raw endpoint: %d %v %s", resp.StatusCode, resp.Header, body)
		}
		g.subscribe("u-wrap", "plain", "bytes", "ACTIVE")
		resp, body = call(t, "GET", invokeURL("plain", "json"), key, "")
		if resp.StatusCode != 200 || wrappedPattern.FindStringSubmatch(string(body)) == nil {
			t.Errorf("wrapped endpoint of a raw service: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("an event stream is never wrapped", func(t *testing.T) {
		resp, body := call(t, "GET", invokeURL("wrap", "stream"), key, "", "Accept", "text/event-stream")
		if resp.StatusCode != 200 || string(body) != "data: 0\n\ndata: 1\n\ndata: 2\n\n" {
			t.Errorf("asked for SSE: %d %s", resp.StatusCode, body)
		}
		resp, body = call(t, "GET", invokeURL("wrap", "stream"), key, "")
		if resp.StatusCode != 200 || string(body) != "data: 0\n\ndata: 1\n\ndata: 2\n\n" {
			t.Errorf("backend streamed unasked: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("a backend status not 2xx is service_error with that status and the body's start", func(t *testing.T) {
		resp, body := call(t, "GET", invokeURL("wrap", "missing"), key, "")
		id := resp.Header.Get("X-Platform-Request-ID")
		want := `{"code":"service_error","message":"the service answered HTTP 404: no such thing: ` + strings.Repeat("x", 512-len("no such thing: ")) +
			`","requestId":"` + id + `"}` + "\n"
		if resp.StatusCode != 404 || string(body) != want || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("404:\n got %d %s\nwant %s", resp.StatusCode, body, want)
		}
		resp, body = call(t, "GET", invokeURL("wrap", "busy"), key, "")
		id = resp.Header.Get("X-Platform-Request-ID")
		want = `{"code":"service_error","message":"the service answered HTTP 429: slow down","retryAfter":7,"requestId":"` + id + `"}` + "\n"
		if resp.StatusCode != 429 || string(body) != want || resp.Header.Get("Retry-After") != "7" {
			t.Errorf("429:\n got %d %s\nwant %s", resp.StatusCode, body, want)
		}
		resp, body = call(t, "GET", invokeURL("wrap", "broken"), key, "")
		if resp.StatusCode != 503 || errorCode(t, resp, body) != "service_error" || !strings.Contains(string(body), "HTTP 503: backend broke") {
			t.Errorf("503: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("a 2xx body past the limit is service_error 502", func(t *testing.T) {
		resp, body := call(t, "GET", invokeURL("wrap", "big"), key, "")
		if resp.StatusCode != 502 || errorCode(t, resp, body) != "service_error" || !strings.Contains(string(body), "sync_response raw") {
			t.Errorf("%d %s", resp.StatusCode, body)
		}
	})

	t.Run("a 2xx body the backend cuts off is service_error 502", func(t *testing.T) {
		resp, body := call(t, "GET", invokeURL("wrap", "cut"), key, "")
		if resp.StatusCode != 502 || errorCode(t, resp, body) != "service_error" || !strings.Contains(string(body), "ended early") {
			t.Errorf("%d %s", resp.StatusCode, body)
		}
	})

	// Metering is that of a raw answer, but for what never reaches the
	// caller: json, plain, gzip, raw, stream twice, missing and busy (4xx)
	// are charged; broken (5xx), big (too large to wrap) and cut (cut off)
	// are not, as their caller gets an error instead of the answer;
	// plain/json is charged to the other service.
	es := g.ledger("u-wrap")
	var wrapUnits billing.Units
	for _, e := range es {
		if e.ServiceID == "wrap" {
			wrapUnits += e.Units
		}
	}
	if wrapUnits != billing.Whole(8) {
		t.Errorf("charged %s units to wrap in %d entries, want 8", wrapUnits, len(es))
	}
	if st := raceState(t, g, "u-wrap", "wrap"); st.Reserved != 0 {
		t.Errorf("%s units still held", st.Reserved)
	}
}

// TestCompatSyncResponseMeteringSame: a PER_BYTE call is charged the
// backend's bytes, wrapped or raw, not the bytes of the wrapped answer.
func TestCompatSyncResponseMeteringSame(t *testing.T) {
	be := newWrapBackend(t)
	g := startGateway(t, t.TempDir(), wrapCatalog(be.URL))
	key, _ := g.newKey("u-bytes")
	g.subscribe("u-bytes", "wrap", "bytes", "ACTIVE")
	g.subscribe("u-bytes", "plain", "bytes", "ACTIVE")

	resp, body := call(t, "GET", invokeURL("wrap", "bytes"), key, "")
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"size":700,`) {
		t.Fatalf("wrapped: %d %s", resp.StatusCode, body)
	}
	resp, body = call(t, "GET", invokeURL("plain", "bytes"), key, "")
	if resp.StatusCode != 200 || len(body) != 700 {
		t.Fatalf("raw: %d %d bytes", resp.StatusCode, len(body))
	}
	// A PER_BYTE body cut off while it is being wrapped reaches the
	// caller as an error, not as bytes: nothing is charged, nothing held.
	resp, body = call(t, "GET", invokeURL("wrap", "cutbytes"), key, "")
	if resp.StatusCode != 502 || errorCode(t, resp, body) != "service_error" {
		t.Fatalf("cut off: %d %s", resp.StatusCode, body)
	}
	got := map[string]billing.Units{}
	for _, e := range g.ledger("u-bytes") {
		got[e.ServiceID] += e.Units
	}
	if got["wrap"] != billing.Whole(700) || got["plain"] != billing.Whole(700) {
		t.Errorf("charged %v, want 700 bytes each", got)
	}
	if st := raceState(t, g, "u-bytes", "wrap"); st.Reserved != 0 {
		t.Errorf("%s units still held", st.Reserved)
	}
}
