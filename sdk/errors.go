package sdk

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
)

// Error codes of the wire contract, the Code of an [APIError].
const (
	CodeMissingKey              = apierror.MissingKey
	CodeInvalidKey              = apierror.InvalidKey
	CodeKeyRevoked              = apierror.KeyRevoked
	CodeKeyExpired              = apierror.KeyExpired
	CodeInvalidSignature        = apierror.InvalidSignature
	CodeStaleTimestamp          = apierror.StaleTimestamp
	CodeNoSubscription          = apierror.NoSubscription
	CodeSubscriptionInactive    = apierror.SubscriptionInactive
	CodeInsufficientCredits     = apierror.InsufficientCredits
	CodeRequestNotFound         = apierror.RequestNotFound
	CodeRequestAlreadyCompleted = apierror.RequestAlreadyCompleted
	CodePayloadTooLarge         = apierror.PayloadTooLarge
	CodeInvalidRequest          = apierror.InvalidRequest
	CodeQuotaExceeded           = apierror.QuotaExceeded
	CodeRateLimited             = apierror.RateLimited
	CodeInternalError           = apierror.InternalError
)

// APIError is a refusal from the usage service or the core routes: the
// HTTP status and the JSON error body {"code","message","retryAfter"?,
// "requestId"?,"field"?}. An answer that is not such a body (a proxy's
// HTML 502, say) still becomes an APIError, with an empty Code and the
// start of the body as Message.
type APIError struct {
	Status     int           // HTTP status code
	Code       string        // machine-readable code, e.g. "invalid_signature"
	Message    string        // human-readable explanation
	RetryAfter time.Duration // when to try again (429), from the body or the Retry-After header
	RequestID  string        // the server's id of the request, for support
	Field      string        // the offending field of an invalid_request
}

func (e *APIError) Error() string {
	var b strings.Builder
	b.WriteString("platform: HTTP ")
	b.WriteString(strconv.Itoa(e.Status))
	if e.Code != "" {
		b.WriteString(" ")
		b.WriteString(e.Code)
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if e.Field != "" {
		b.WriteString(" (field ")
		b.WriteString(e.Field)
		b.WriteString(")")
	}
	if e.RequestID != "" {
		b.WriteString(" [request ")
		b.WriteString(e.RequestID)
		b.WriteString("]")
	}
	return b.String()
}

// Retryable reports whether the same request may succeed later: a rate
// limit or an unavailable server (429, 502, 503, 504), the answers the
// Client retries itself before returning them.
func (e *APIError) Retryable() bool { return transientStatus(e.Status) }

// IsCode reports whether err is, or wraps, an *APIError with that code.
func IsCode(err error, code string) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == code
}

// Errors of the Client that are not answers of the server.
var (
	// ErrResponseSignature is wrapped when a pre-flight answer is
	// unsigned, signed with no secret of the service, or signed at a time
	// outside the tolerance: the answer may be forged or replayed and is
	// not trusted.
	ErrResponseSignature = errors.New("platform: the response signature does not verify")
)

// maxErrorSnippet bounds how much of a non-JSON error body an APIError
// quotes.
const maxErrorSnippet = 256

// decodeAPIError builds the APIError of a non-2xx answer. now resolves a
// Retry-After given as an HTTP date.
func decodeAPIError(status int, header http.Header, body []byte, now time.Time) *APIError {
	e := &APIError{Status: status}
	var wire struct {
		Code       string          `json:"code"`
		Error      string          `json:"error"` // the validate route's {valid:false,error}
		Message    string          `json:"message"`
		RetryAfter json.RawMessage `json:"retryAfter"`
		RequestID  string          `json:"requestId"`
		Field      string          `json:"field"`
	}
	if json.Unmarshal(body, &wire) == nil && (wire.Code != "" || wire.Error != "" || wire.Message != "") {
		e.Code, e.Message, e.RequestID, e.Field = wire.Code, wire.Message, wire.RequestID, wire.Field
		if e.Code == "" {
			e.Code = wire.Error
		}
		if s, err := strconv.ParseFloat(strings.Trim(string(wire.RetryAfter), `"`), 64); err == nil && s > 0 {
			e.RetryAfter = time.Duration(s * float64(time.Second))
		}
	} else {
		snippet := strings.TrimSpace(string(body))
		if len(snippet) > maxErrorSnippet {
			snippet = snippet[:maxErrorSnippet] + "…"
		}
		e.Message = http.StatusText(status)
		if snippet != "" {
			e.Message += ": " + snippet
		}
	}
	if e.RetryAfter == 0 {
		e.RetryAfter = parseRetryAfter(header.Get("Retry-After"), now)
	}
	return e
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP
// date. Anything else, or a time already past, is zero.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, int64(maxRetryAfterHeader/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// maxRetryAfterHeader keeps a silly Retry-After from overflowing a
// Duration; nothing waits that long anyway.
const maxRetryAfterHeader = 365 * 24 * time.Hour

// transientStatus is a status worth retrying: rate limited, or the server
// (or a proxy in front of it) is unavailable.
func transientStatus(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}
