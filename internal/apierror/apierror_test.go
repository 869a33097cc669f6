package apierror

import (
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestWrite(t *testing.T) {
	w := httptest.NewRecorder()
	e := New(QuotaExceeded, "quota used up").WithRetry(1500 * time.Millisecond)
	e.RequestID = "r-1"
	Write(w, e)
	if w.Code != 429 || w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Retry-After") != "2" {
		t.Fatalf("status %d headers %v", w.Code, w.Header())
	}
	var got map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"code": "quota_exceeded", "message": "quota used up", "retryAfter": 2.0, "requestId": "r-1"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if _, ok := got["field"]; ok {
		t.Error("field only on invalid_request")
	}
}

// TestWriteNoHTMLEscapes: '<', '>' and '&' in a message are written as
// they are, not as \u003c, \u003e, \u0026 (json.Marshal's escapes for
// JSON put into HTML); the body is still valid JSON of the same text, and
// Content-Length is its length.
func TestWriteNoHTMLEscapes(t *testing.T) {
	w := httptest.NewRecorder()
	msg := `no service "<a&b>"`
	Write(w, New(ServiceNotFound, msg))
	body := w.Body.String()
	if strings.Contains(body, `\u00`) || !strings.Contains(body, `<a&b>`) {
		t.Errorf("body %s", body)
	}
	var e Error
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Message != msg {
		t.Errorf("decoded %+v, %v", e, err)
	}
	if w.Header().Get("Content-Length") != strconv.Itoa(len(body)) || !strings.HasSuffix(body, "}\n") {
		t.Errorf("Content-Length %s for %d bytes %q", w.Header().Get("Content-Length"), len(body), body)
	}
}

func TestStatuses(t *testing.T) {
	// The table of docs/wire-contract.md, "Errors".
	want := map[string]int{
		MissingKey: 401, InvalidKey: 401, KeyRevoked: 401, KeyExpired: 401, InvalidSignature: 401, StaleTimestamp: 401, InvalidToken: 401,
		NoSubscription: 403, SubscriptionInactive: 403, InsufficientCredits: 403,
		ServiceNotFound: 404, EndpointNotFound: 404, RequestNotFound: 404, MethodNotAllowed: 405,
		RequestAlreadyCompleted: 409, PayloadTooLarge: 413, InvalidRequest: 400, TimeUnitInvocationNotAllowed: 400,
		QuotaExceeded: 429, RateLimited: 429, ServiceError: 502, ServiceTimeout: 504, InternalError: 500, StoreUnavailable: 503,
		"no_such_code": 500,
	}
	for code, status := range want {
		if got := Status(code); got != status {
			t.Errorf("%s: %d, want %d", code, got, status)
		}
	}
	w := httptest.NewRecorder()
	Write(w, Invalid("unitsUsed", "must be positive"))
	if w.Code != 400 || !json.Valid(w.Body.Bytes()) {
		t.Fatal(w.Code)
	}
	var e Error
	json.Unmarshal(w.Body.Bytes(), &e)
	if e.Field != "unitsUsed" || e.Code != InvalidRequest {
		t.Errorf("%+v", e)
	}
}

func TestQuoteID(t *testing.T) {
	long := strings.Repeat("a", 63) + "é" + "tail"
	for in, want := range map[string]string{
		"r-1":                   `"r-1"`,
		"bad\xffid":             `"bad?id"`,
		strings.Repeat("x", 64): `"` + strings.Repeat("x", 64) + `"`,
		strings.Repeat("x", 65): `"` + strings.Repeat("x", 64) + `…"`,
		long:                    `"` + strings.Repeat("a", 63) + `…"`, // not cut inside the é
	} {
		if got := QuoteID(in); got != want {
			t.Errorf("QuoteID(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestRetrySeconds(t *testing.T) {
	for d, want := range map[time.Duration]int{
		-time.Second: 1, 0: 1, time.Millisecond: 1, time.Second: 1, 1500 * time.Millisecond: 2, 30 * 24 * time.Hour: 2592000,
	} {
		if got := RetrySeconds(d); got != want {
			t.Errorf("RetrySeconds(%v) = %d, want %d", d, got, want)
		}
	}
}
