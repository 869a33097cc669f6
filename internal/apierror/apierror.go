// Package apierror builds the one JSON error body of the wire contract:
// {"code","message","retryAfter"?,"requestId"?,"field"?} with the status
// that belongs to the code. Every handler refuses through it.
package apierror

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/billing"
)

// Codes of the wire contract.
const (
	MissingKey                   = "missing_key"
	InvalidKey                   = "invalid_key"
	KeyRevoked                   = "key_revoked"
	KeyExpired                   = "key_expired"
	InvalidSignature             = "invalid_signature"
	StaleTimestamp               = "stale_timestamp"
	InvalidToken                 = "invalid_token"
	NoSubscription               = "no_subscription"
	SubscriptionInactive         = "subscription_inactive"
	InsufficientCredits          = "insufficient_credits"
	Forbidden                    = "forbidden"
	ServiceNotFound              = "service_not_found"
	EndpointNotFound             = "endpoint_not_found"
	RequestNotFound              = "request_not_found"
	NotFound                     = "not_found"
	MethodNotAllowed             = "method_not_allowed"
	RequestAlreadyCompleted      = "request_already_completed"
	PayloadTooLarge              = "payload_too_large"
	InvalidRequest               = "invalid_request"
	UnsupportedMediaType         = "unsupported_media_type"
	TimeUnitInvocationNotAllowed = "time_unit_invocation_not_allowed"
	QuotaExceeded                = "quota_exceeded"
	RateLimited                  = "rate_limited"
	ServiceError                 = "service_error"
	ServiceTimeout               = "service_timeout"
	InternalError                = "internal_error"
	StoreUnavailable             = "store_unavailable"
)

var statuses = map[string]int{
	MissingKey:                   http.StatusUnauthorized,
	InvalidKey:                   http.StatusUnauthorized,
	KeyRevoked:                   http.StatusUnauthorized,
	KeyExpired:                   http.StatusUnauthorized,
	InvalidSignature:             http.StatusUnauthorized,
	StaleTimestamp:               http.StatusUnauthorized,
	InvalidToken:                 http.StatusUnauthorized,
	NoSubscription:               http.StatusForbidden,
	SubscriptionInactive:         http.StatusForbidden,
	InsufficientCredits:          http.StatusForbidden,
	Forbidden:                    http.StatusForbidden,
	ServiceNotFound:              http.StatusNotFound,
	EndpointNotFound:             http.StatusNotFound,
	RequestNotFound:              http.StatusNotFound,
	NotFound:                     http.StatusNotFound,
	MethodNotAllowed:             http.StatusMethodNotAllowed,
	RequestAlreadyCompleted:      http.StatusConflict,
	PayloadTooLarge:              http.StatusRequestEntityTooLarge,
	InvalidRequest:               http.StatusBadRequest,
	UnsupportedMediaType:         http.StatusUnsupportedMediaType,
	TimeUnitInvocationNotAllowed: http.StatusBadRequest,
	QuotaExceeded:                http.StatusTooManyRequests,
	RateLimited:                  http.StatusTooManyRequests,
	ServiceError:                 http.StatusBadGateway,
	ServiceTimeout:               http.StatusGatewayTimeout,
	InternalError:                http.StatusInternalServerError,
	StoreUnavailable:             http.StatusServiceUnavailable,
}

// Status returns the HTTP status of a code (500 for an unknown code).
func Status(code string) int {
	if s, ok := statuses[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Error is a refusal on its way to the caller; it is also a Go error so
// deep code can return it and the handler write it.
type Error struct {
	Code       string `json:"code"`
	Message    string `json:"message"`
	RetryAfter int    `json:"retryAfter,omitempty"`
	RequestID  string `json:"requestId,omitempty"`
	Field      string `json:"field,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// New makes an error with a code and message.
func New(code, message string) *Error { return &Error{Code: code, Message: message} }

// Invalid makes an invalid_request error naming the offending field.
func Invalid(field, message string) *Error {
	return &Error{Code: InvalidRequest, Message: message, Field: field}
}

// WithRetry sets the seconds after which a retry may succeed
// (RetrySeconds), sent in the body and the Retry-After header.
func (e *Error) WithRetry(d time.Duration) *Error {
	e.RetryAfter = RetrySeconds(d)
	return e
}

// RetrySeconds is a wait as a Retry-After tells it: whole seconds, rounded
// up (billing.CeilSeconds), at least one.
func RetrySeconds(d time.Duration) int { return max(1, int(billing.CeilSeconds(d))) }

// Unavailable is the refusal of a call whose charge the store cannot
// record now (a full disk): refused before it is forwarded, retried later.
func Unavailable() *Error {
	return New(StoreUnavailable, "usage cannot be recorded right now; the call was not forwarded and not charged").
		WithRetry(time.Second)
}

// Write sends the error as JSON with its status.
func Write(w http.ResponseWriter, e *Error) { WriteStatus(w, Status(e.Code), e) }

// WriteStatus sends the error as JSON with the given status instead of its
// code's: a service_error that mirrors the status a backend answered.
func WriteStatus(w http.ResponseWriter, status int, e *Error) {
	body := Encode(e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	w.WriteHeader(status)
	w.Write(body)
}

// Encode is the error's JSON body, ending in a newline. '<', '>' and '&'
// are written as they are: json.Marshal's \u003c escapes are for JSON put
// into HTML, and made messages such as "no service \u003cx\u003e" hard
// to read. The body is served as application/json with nosniff.
func Encode(e *Error) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(e) // a struct of strings and an int: never fails
	return b.Bytes()
}

// maxQuoted is how much of an id a message quotes, in bytes.
const maxQuoted = 64

// QuoteID quotes an id a request named for an error message: cut to 64
// bytes on a character boundary (marked "…"), invalid UTF-8 shown as "?",
// in double quotes. Every message that repeats a caller's id uses it, so a
// made-up id of any size or encoding reads the same everywhere.
func QuoteID(id string) string {
	cut := false
	if len(id) > maxQuoted {
		i := maxQuoted
		for i > 0 && !utf8.RuneStart(id[i]) {
			i--
		}
		id, cut = id[:i], true
	}
	id = strings.ToValidUTF8(id, "?")
	if cut {
		id += "…"
	}
	return "\"" + id + "\""
}
