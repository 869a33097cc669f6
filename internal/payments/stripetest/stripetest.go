// Package stripetest starts stripe-mock (github.com/stripe/stripe-mock,
// pinned in tools/stripemock) on a loopback port for tests, puts a
// recording proxy in front of it, and signs webhook events the way Stripe
// does. Nothing reaches the internet.
package stripetest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"
)

// Version is the stripe-mock the tests run (tools/stripemock/go.mod).
const Version = "v0.203.0"

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary builds stripe-mock from tools/stripemock once per test process
// (the Go build cache makes later processes fast) and returns its path.
// STRIPE_MOCK_BIN names a prebuilt binary instead.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("STRIPE_MOCK_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		toolDir := filepath.Join(filepath.Dir(file), "..", "..", "..", "tools", "stripemock")
		dir, err := os.MkdirTemp("", "stripe-mock-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "stripe-mock")
		cmd := exec.Command("go", "build", "-o", binPath, "github.com/stripe/stripe-mock")
		cmd.Dir = toolDir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building stripe-mock in %s: %v\n%s", toolDir, err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Mock is a running stripe-mock with a recording proxy in front.
type Mock struct {
	// URL is the proxy's base URL: give it to the gateway as api_base.
	URL string
	// Direct is stripe-mock's own URL, bypassing the recorder.
	Direct string

	mu       sync.Mutex
	requests []Request
	fail     func(Request) int
	// answers: fields set over stripe-mock's answer to a GET, by path.
	answers map[string]map[string]any
	// prefixAnswers: the same for every path under a prefix (AnswerUnder).
	prefixAnswers map[string]map[string]any
}

// Request is one API request the proxy passed (or failed).
type Request struct {
	Method string
	Path   string
	Form   url.Values
	// IdempotencyKey is the request's Idempotency-Key header.
	IdempotencyKey string
	// Status is what the client got back.
	Status int
}

var listening = regexp.MustCompile(`Listening for HTTP at address: (\S+)`)

// Start runs stripe-mock on 127.0.0.1 and a recording proxy before it;
// both stop when the test ends.
func Start(t testing.TB) *Mock {
	t.Helper()
	// HTTPS on a port of its own too: left alone stripe-mock also binds
	// :12112, and exits at once if another test's stripe-mock has it.
	cmd := exec.Command(Binary(t), "-http-addr", "127.0.0.1:0", "-https-addr", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting stripe-mock: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil && !sent {
				addr <- m[1]
				sent = true
			}
		}
		if !sent {
			close(addr)
		}
	}()
	var a string
	select {
	case got, ok := <-addr:
		if !ok {
			t.Fatal("stripe-mock exited before listening")
		}
		a = got
	case <-time.After(30 * time.Second):
		t.Fatal("stripe-mock did not listen within 30s")
	}
	m := &Mock{Direct: "http://" + a}
	target, _ := url.Parse(m.Direct)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = m.answer
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		form, _ := url.ParseQuery(string(body))
		if r.Method == http.MethodGet {
			form = r.URL.Query()
		}
		req := Request{Method: r.Method, Path: r.URL.Path, Form: form, IdempotencyKey: r.Header.Get("Idempotency-Key")}
		m.mu.Lock()
		fail := m.fail
		m.mu.Unlock()
		if fail != nil {
			if status := fail(req); status != 0 {
				req.Status = status
				m.record(req)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, `{"error":{"type":"api_error","message":"injected by stripetest"}}`)
				return
			}
		}
		// Plain JSON back from stripe-mock, for Answer to set fields over
		// (the proxy's transport decompresses what it asked for itself).
		r.Header.Del("Accept-Encoding")
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		proxy.ServeHTTP(rec, r)
		req.Status = rec.status
		m.record(req)
	}))
	t.Cleanup(srv.Close)
	m.URL = srv.URL
	return m
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (m *Mock) record(r Request) {
	m.mu.Lock()
	m.requests = append(m.requests, r)
	m.mu.Unlock()
}

// Requests returns the requests so far whose path starts with prefix
// ("" for all), in order.
func (m *Mock) Requests(prefix string) []Request {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Request
	for _, r := range m.requests {
		if strings.HasPrefix(r.Path, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// Fail makes the proxy answer with the status fn returns (0 passes the
// request on): a Stripe outage, a rate limit. nil stops failing.
func (m *Mock) Fail(fn func(Request) int) {
	m.mu.Lock()
	m.fail = fn
	m.mu.Unlock()
}

// Answer makes the proxy set fields over stripe-mock's answer to a GET
// of path (its top-level keys), for what stripe-mock cannot say since it
// keeps no state: the status of a subscription read back, say. stripe-mock
// still answers first, which checks the request's shape. nil fields stop
// it.
func (m *Mock) Answer(path string, fields map[string]any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.answers == nil {
		m.answers = map[string]map[string]any{}
	}
	if fields == nil {
		delete(m.answers, path)
		return
	}
	m.answers[path] = fields
}

// AnswerUnder is Answer for every path under prefix, for objects whose
// ids stripe-mock makes up as it creates them (Checkout Sessions). An
// exact path's Answer comes first. nil fields stop it.
func (m *Mock) AnswerUnder(prefix string, fields map[string]any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prefixAnswers == nil {
		m.prefixAnswers = map[string]map[string]any{}
	}
	if fields == nil {
		delete(m.prefixAnswers, prefix)
		return
	}
	m.prefixAnswers[prefix] = fields
}

func (m *Mock) answer(resp *http.Response) error {
	if resp.Request.Method != http.MethodGet || resp.StatusCode != http.StatusOK {
		return nil
	}
	m.mu.Lock()
	fields := m.answers[resp.Request.URL.Path]
	for p, f := range m.prefixAnswers {
		if fields == nil && strings.HasPrefix(resp.Request.URL.Path, p) {
			fields = f
		}
	}
	m.mu.Unlock()
	if fields == nil {
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := json.Unmarshal(body, &obj); err != nil {
		return fmt.Errorf("stripetest: stripe-mock's answer to %s is not an object: %w", resp.Request.URL.Path, err)
	}
	for k, v := range fields {
		obj[k] = v
	}
	out, _ := json.Marshal(obj)
	resp.Body = io.NopCloser(bytes.NewReader(out))
	resp.ContentLength = int64(len(out))
	resp.Header.Set("Content-Length", fmt.Sprint(len(out)))
	resp.Header.Del("Content-Encoding")
	return nil
}

// Event builds a Stripe event of type typ whose data.object is obj, as
// the JSON Stripe posts.
func Event(id, typ string, created time.Time, obj any) []byte {
	raw, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	ev := map[string]any{
		"id": id, "object": "event", "type": typ, "created": created.Unix(),
		"api_version": "2025-03-31.basil", "livemode": false, "pending_webhooks": 1,
		"data": map[string]json.RawMessage{"object": raw},
	}
	b, _ := json.Marshal(ev)
	return b
}

// Sign returns the Stripe-Signature header of payload signed with secret
// at t, as Stripe signs a webhook delivery.
func Sign(payload []byte, secret string, t time.Time) string {
	p := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: secret, Timestamp: t})
	return p.Header
}

// Deliver posts payload to a webhook URL signed with secret at t and
// returns the status and body.
func Deliver(t testing.TB, endpoint string, payload []byte, secret string, at time.Time) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, endpoint, bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("Stripe-Signature", Sign(payload, secret, at))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("delivering webhook: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
