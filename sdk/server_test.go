package sdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/sdk"
)

// fault is what the usage server does to one request instead of, or
// after, answering it normally.
type fault int

const (
	noFault          fault = iota
	fail503                // answer 503 without recording anything
	dropAfterRecord        // record, then close the connection unanswered
	fail400                // refuse as invalid_request
	fail429                // answer 429 with Retry-After
	fail500                // answer 500 internal_error
	dropBeforeRecord       // close the connection without recording
)

// usageServer implements the usage service and core routes of the wire
// contract over real HTTP, written independently of the SDK: it checks
// X-Platform-Signature = Base64(HMAC(secret, raw body + timestamp header))
// by hand, counts a report once per Idempotency-Key (answering a repeat
// with the first answer), and completes a job once (the same completion
// again is 200, charged nothing).
type usageServer struct {
	t       *testing.T
	secrets []string // verify with any; sign answers with the first
	brand   string
	clock   func() time.Time
	// faults, when set, decides the fault of the n-th request (1-based)
	// on a route ("report", "progress", "complete", "validate",
	// "estimate").
	faults     func(route string, n int) fault
	retryAfter string // Retry-After of fail429

	// Pre-flight answers, set by a test: status and body, signed unless
	// unsigned; tamper changes the body after signing; signedAt
	// overrides the answer's timestamp.
	preflightStatus   int
	preflightBody     string
	preflightUnsigned bool
	preflightTamper   bool
	preflightSignedAt time.Time

	mu       sync.Mutex
	requests map[string]int             // requests per route
	reports  map[string][]byte          // Idempotency-Key → first answer
	units    map[string]sdk.Units       // user → units counted
	jobs     map[string]string          // request id → digest of its completion
	jobUnits map[string]sdk.Units       // request id → units charged
	seen     map[string][]*http.Request // route → requests (headers, URL)
	bodies   map[string][][]byte        // route → raw bodies

	srv *httptest.Server
}

func newUsageServer(t *testing.T) *usageServer {
	s := &usageServer{
		t: t, secrets: []string{secret}, brand: "Platform", clock: fixedClock,
		faults:   func(string, int) fault { return noFault },
		requests: map[string]int{}, reports: map[string][]byte{}, units: map[string]sdk.Units{},
		jobs: map[string]string{}, jobUnits: map[string]sdk.Units{},
		seen: map[string][]*http.Request{}, bodies: map[string][][]byte{},
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *usageServer) h(name string) string { return "X-" + s.brand + "-" + name }

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	b, _ := json.Marshal(map[string]string{"code": code, "message": msg, "requestId": "srv-req-1"})
	writeJSON(w, status, b)
}

// drop closes the connection without an answer.
func drop(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

func (s *usageServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var route, id string
	switch p := r.URL.Path; {
	case p == "/api/usage/report" || p == "/usage/api/v1/report":
		route = "report"
	case strings.HasPrefix(p, "/api/usage/progress/"):
		route, id = "progress", strings.TrimPrefix(p, "/api/usage/progress/")
	case strings.HasPrefix(p, "/api/usage/complete/"):
		route, id = "complete", strings.TrimPrefix(p, "/api/usage/complete/")
	case p == "/api/v1/service-keys/validate" || p == "/core/api/v1/service-keys/validate":
		route = "validate"
	case p == "/api/v1/service-keys/estimate-usage":
		route = "estimate"
	default:
		writeError(w, http.StatusNotFound, "not_found", "no route "+p)
		return
	}
	s.mu.Lock()
	s.requests[route]++
	n := s.requests[route]
	s.seen[route] = append(s.seen[route], r.Clone(r.Context()))
	s.bodies[route] = append(s.bodies[route], body)
	s.mu.Unlock()

	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "POST only")
		return
	}
	f := s.faults(route, n)
	switch f {
	case fail503:
		writeError(w, http.StatusServiceUnavailable, "unavailable", "try again")
		return
	case fail429:
		w.Header().Set("Retry-After", s.retryAfter)
		writeError(w, http.StatusTooManyRequests, "rate_limited", "slow down")
		return
	case fail400:
		b, _ := json.Marshal(map[string]string{"code": "invalid_request", "message": "unitsUsed is wrong", "field": "unitsUsed"})
		writeJSON(w, http.StatusBadRequest, b)
		return
	case fail500:
		writeError(w, http.StatusInternalServerError, "internal_error", "store down")
		return
	case dropBeforeRecord:
		drop(w)
		return
	}
	if !s.signedBy(r, body) {
		writeError(w, http.StatusUnauthorized, "invalid_signature", "the signature does not match the body and timestamp")
		return
	}
	if route != "progress" && route != "complete" && !s.fresh(r) {
		writeError(w, http.StatusUnauthorized, "stale_timestamp", "outside the window")
		return
	}
	switch route {
	case "report":
		s.report(w, r, body, f)
	case "progress":
		writeJSON(w, http.StatusOK, []byte(`{"requestId":"`+id+`","status":"RUNNING"}`))
	case "complete":
		s.complete(w, id, body, f)
	case "validate", "estimate":
		s.preflight(w)
	}
}

func (s *usageServer) signedBy(r *http.Request, body []byte) bool {
	sig, ts := r.Header.Get(s.h("Signature")), r.Header.Get(s.h("Timestamp"))
	if sig == "" || ts == "" {
		return false
	}
	for _, k := range s.secrets {
		if hmac := hmacBase64(k, string(body)+ts); hmac == sig {
			return true
		}
	}
	return false
}

func (s *usageServer) fresh(r *http.Request) bool {
	sec, err := strconv.ParseInt(r.Header.Get(s.h("Timestamp")), 10, 64)
	if err != nil {
		return false
	}
	d := s.clock().Sub(time.Unix(sec, 0))
	return d <= 5*time.Minute && d >= -5*time.Minute
}

func (s *usageServer) report(w http.ResponseWriter, r *http.Request, body []byte, f fault) {
	var rep struct {
		UserID    string    `json:"userId"`
		ServiceID string    `json:"serviceId"`
		UnitsUsed sdk.Units `json:"unitsUsed"`
		Timestamp string    `json:"timestamp"`
	}
	if err := json.Unmarshal(body, &rep); err != nil || rep.UserID == "" || rep.ServiceID != "svc-1" || rep.UnitsUsed <= 0 {
		writeError(w, http.StatusBadRequest, "invalid_request", "bad report "+string(body))
		return
	}
	if _, err := time.Parse(time.RFC3339, rep.Timestamp); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "timestamp")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	if first, ok := s.reports[key]; ok && key != "" {
		s.mu.Unlock()
		if f == dropAfterRecord {
			drop(w)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, first)
		return
	}
	s.units[rep.UserID] += rep.UnitsUsed
	answer, _ := json.Marshal(map[string]any{
		"reportSchemaVersion": 2, "status": "ok", "warning": nil,
		"userId": rep.UserID, "serviceId": rep.ServiceID,
		"billingModelType": "SUBSCRIPTION", "measurementType": "PER_TOKEN", "unitLabel": "token",
		"breakdown": map[string]any{"unitsUsed": rep.UnitsUsed, "unitsRemaining": 900, "totalUnitsUsedThisCycle": s.units[rep.UserID],
			"isOverLimit": false, "isOverage": false, "isOverageAllowed": false},
	})
	if key != "" {
		s.reports[key] = answer
	}
	s.mu.Unlock()
	if f == dropAfterRecord {
		drop(w)
		return
	}
	writeJSON(w, http.StatusOK, answer)
}

func (s *usageServer) complete(w http.ResponseWriter, id string, body []byte, f fault) {
	var c map[string]json.RawMessage
	if json.Unmarshal(body, &c) != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "body")
		return
	}
	units := c["units"]
	delete(c, "timestamp") // a retry is the same completion whatever its time
	digest, _ := json.Marshal(c)
	s.mu.Lock()
	if prev, ok := s.jobs[id]; ok {
		s.mu.Unlock()
		if prev != string(digest) {
			writeError(w, http.StatusConflict, "request_already_completed", "already finished")
			return
		}
		if f == dropAfterRecord {
			drop(w)
			return
		}
		writeJSON(w, http.StatusOK, []byte(`{"requestId":"`+id+`","status":"COMPLETED"}`))
		return
	}
	s.jobs[id] = string(digest)
	if units != nil {
		var u sdk.Units
		json.Unmarshal(units, &u)
		s.jobUnits[id] += u
	}
	s.mu.Unlock()
	if f == dropAfterRecord {
		drop(w)
		return
	}
	writeJSON(w, http.StatusOK, []byte(`{"requestId":"`+id+`","status":"COMPLETED"}`))
}

// preflight answers as the core routes do once the calling service is
// authenticated: X-Platform-Signature = Base64(HMAC(secret, body + ts)).
func (s *usageServer) preflight(w http.ResponseWriter) {
	body := []byte(s.preflightBody)
	at := s.clock()
	if !s.preflightSignedAt.IsZero() {
		at = s.preflightSignedAt
	}
	ts := strconv.FormatInt(at.Unix(), 10)
	body = bytes.ReplaceAll(body, []byte("$TS"), []byte(ts))
	if !s.preflightUnsigned {
		w.Header().Set(s.h("Signature"), hmacBase64(s.secrets[0], string(body)+ts))
		w.Header().Set(s.h("Timestamp"), ts)
	}
	if s.preflightTamper {
		body = bytes.Replace(body, []byte(`"valid":true`), []byte(`"valid":true `), 1)
		body = bytes.Replace(body, []byte(`"wouldAllow":false`), []byte(`"wouldAllow":true`), 1)
		body = bytes.Replace(body, []byte(`"userId":"user-1"`), []byte(`"userId":"admin!"`), 1)
	}
	if s.preflightStatus == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "3600")
	}
	writeJSON(w, s.preflightStatus, body)
}

func (s *usageServer) count(route string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[route]
}

func (s *usageServer) unitsOf(user string) sdk.Units {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.units[user]
}

// sleeps records the waits of a Client and returns at once, advancing a
// fake clock by each wait so timestamps move as they would.
type sleeps struct {
	mu    sync.Mutex
	waits []time.Duration
	at    time.Time
}

func newSleeps() *sleeps { return &sleeps{at: now} }

func (s *sleeps) now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waits = append(s.waits, d)
	s.at = s.at.Add(d)
	return ctx.Err()
}

func (s *sleeps) recorded() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.waits...)
}

// sent returns the requests received on a route, in order.
func (s *usageServer) sent(route string) []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.seen[route]...)
}

// body returns the raw body of the i-th request (0-based) on a route.
func (s *usageServer) body(route string, i int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.bodies[route][i])
}

// charged returns the units charged to a job.
func (s *usageServer) charged(id string) sdk.Units {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jobUnits[id]
}

// signatures returns every request signature the server received.
func (s *usageServer) signatures() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, reqs := range s.seen {
		for _, r := range reqs {
			if sig := r.Header.Get(s.h("Signature")); sig != "" {
				out = append(out, sig)
			}
		}
	}
	return out
}
