package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/subscription"
)

// DefaultMaxBodyBytes is the largest request body a Verifier reads. The
// gateway forwards bodies up to 10 MiB by default (max_body_bytes), and
// an async envelope escapes its payload as a JSON string: a '"' becomes
// 2 bytes, a control byte 6 ("\u0001"), an invalid byte 3 (U+FFFD), so
// an envelope of a 10 MiB body can be up to 60 MiB and a little more.
// 16 MiB refused a 9 MiB body of quotes the gateway had accepted, and its
// job failed. A backend that takes smaller bodies sets MaxBodyBytes (and
// the gateway's max_body_bytes) to match.
const DefaultMaxBodyBytes = 64 << 20

// Errors of a refused verification; every one is also an ErrUnverified.
var (
	// ErrUnverified is wrapped by every verification failure: the call
	// did not come, unchanged and recently, from the gateway.
	ErrUnverified = errors.New("platform: request not verified")
	// ErrMissingSignature: no signature or timestamp header.
	ErrMissingSignature = fmt.Errorf("%w: missing signature headers", ErrUnverified)
	// ErrInvalidSignature: the signature does not match the body and
	// context under any of the secrets.
	ErrInvalidSignature = fmt.Errorf("%w: invalid signature", ErrUnverified)
	// ErrStaleTimestamp: the timestamp is malformed or outside the
	// tolerance (a replay, or a clock far off).
	ErrStaleTimestamp = fmt.Errorf("%w: stale or malformed timestamp", ErrUnverified)
	// ErrSigningVersion: a Signing-Version other than 3.
	ErrSigningVersion = fmt.Errorf("%w: unsupported signing version", ErrUnverified)
	// ErrBodyTooLarge: the body is larger than MaxBodyBytes.
	ErrBodyTooLarge = fmt.Errorf("%w: body too large", ErrUnverified)
)

// Verifier checks that a call came from the gateway: the version 3
// signature
//
//	Base64(HMAC-SHA256(secret, payload + timestamp + ctx))
//	ctx = "3" + userId + serviceProductId + rolesCSV + subscriptionStatus
//	          + billingModel + measurementType + unitLabel
//
// over the X-<Brand>-* headers, and a timestamp within Tolerance. For a
// sync call the payload is the raw body; for an async job it is the
// canonical {"payload":…,"request_id":…} rebuilt from the envelope.
//
// The zero value of every field but Secrets is usable. A Verifier must not
// be changed while in use.
type Verifier struct {
	// Secrets are the service secrets a signature may be made with: the
	// current one, and during a rotation the next or previous one too.
	Secrets [][]byte
	// Brand is the brand word of the header names (default Platform;
	// Tollara for backends of the platform this gateway replaces).
	Brand string
	// Tolerance is how far the signed timestamp may lie from the local
	// clock (default 5 minutes).
	Tolerance time.Duration
	// Clock returns the current time (default time.Now).
	Clock func() time.Time
	// MaxBodyBytes bounds the body read (default DefaultMaxBodyBytes).
	MaxBodyBytes int64
}

// NewVerifier returns a Verifier accepting signatures made with any of
// secrets, with the default brand and tolerance.
func NewVerifier(secrets ...string) *Verifier {
	v := &Verifier{}
	for _, s := range secrets {
		v.Secrets = append(v.Secrets, []byte(s))
	}
	return v
}

// CallerContext is the trusted identity of a verified call: who is
// calling, under which subscription. Every field was covered by the
// gateway's signature, except RequestID.
type CallerContext struct {
	UserID             string
	ServiceProductID   string // empty when the service's owner calls it
	Roles              []string
	SubscriptionStatus string // ACTIVE, TRIAL, CANCELLING, CANCELLING_PENDING, …
	BillingModel       string // SUBSCRIPTION, PREPAID, USAGE_POSTPAID, USAGE_INSTANT; subscribers only
	MeasurementType    string // PER_REQUEST, PER_TOKEN, PER_BYTE, PER_TIME_UNIT; subscribers only
	UnitLabel          string // "request", "token", …; subscribers only
	// RequestID is the gateway's id of the call (X-<Brand>-Request-ID);
	// for an async job, the job's request id. Put it in reports as
	// Report.RequestID and in your logs.
	RequestID string
	// Timestamp is the signed time of the call.
	Timestamp time.Time
	// Job is the async job of an async call, nil for a sync call.
	Job *AsyncJob
}

// IsSubscriber reports whether the caller is a subscriber, billed under a
// product, rather than the service's owner calling it free.
func (c *CallerContext) IsSubscriber() bool { return c.ServiceProductID != "" }

// HasAccess reports whether the subscription status grants access.
func (c *CallerContext) HasAccess() bool { return GrantAccess(c.SubscriptionStatus) }

// HasRole reports whether the caller's key has the role.
func (c *CallerContext) HasRole(role string) bool {
	for _, r := range c.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// AsyncJob is the envelope of an async call: the caller's body and where
// to report on the job. ProgressURL and CallbackURL are passed as they are
// to Client.ReportProgress and Client.ReportCompletion.
type AsyncJob struct {
	RequestID   string
	Payload     string // the caller's body
	ProgressURL string
	CallbackURL string
}

// GrantAccess reports whether a subscription status lets its user call
// the service: ACTIVE, TRIAL, CANCELLING and CANCELLING_PENDING do;
// EXPIRED, CANCELLED, SUSPENDED and anything else do not. It is the
// gateway's own rule (package subscription), surrounding spaces ignored.
func GrantAccess(status string) bool {
	return subscription.GrantsAccess(strings.TrimSpace(status))
}

// VerifyRequest reads r's body (up to MaxBodyBytes) and verifies the call.
// It returns the caller context and the body as received; r.Body is left
// consumed (Middleware restores it). An async envelope is recognised by
// its signature: see Verify.
func (v *Verifier) VerifyRequest(r *http.Request) (*CallerContext, []byte, error) {
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		limit := v.maxBody()
		if r.ContentLength > limit {
			return nil, nil, ErrBodyTooLarge
		}
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
		if err != nil {
			return nil, nil, fmt.Errorf("sdk: read request body: %w", err)
		}
		if int64(len(body)) > limit {
			return nil, nil, ErrBodyTooLarge
		}
	}
	cc, err := v.Verify(r.Header, body)
	return cc, body, err
}

// Verify checks a call given its headers and raw body.
//
// The signature is first checked as a sync call's, over the raw body. When
// that fails and the body is an async envelope {"request_id","payload",
// "progress_url","callback_url"}, it is checked over the envelope's
// canonical form, signing.AsyncCanonical(payload, request_id), and the
// result carries the Job. Checking sync first is what keeps a caller from
// passing a sync body off as a job: a sync body that verified as async
// would have to equal its own canonical form, and it verifies as sync
// first.
func (v *Verifier) Verify(h http.Header, body []byte) (*CallerContext, error) {
	hd := newHeaderNames(v.Brand)
	sig, ts := single(h, hd.Signature), single(h, hd.Timestamp)
	if sig == "" || ts == "" {
		return nil, ErrMissingSignature
	}
	if ver, ok := h[http.CanonicalHeaderKey(hd.SigningVersion)]; ok && (len(ver) != 1 || strings.TrimSpace(ver[0]) != signing.Version) {
		return nil, ErrSigningVersion
	}
	// Each context header must come once: with two, which one a handler
	// reads would be a guess.
	names := []string{hd.UserID, hd.ServiceProductID, hd.Roles, hd.SubscriptionStatus, hd.BillingModel, hd.MeasurementType, hd.UnitLabel}
	for _, n := range names {
		if len(h.Values(n)) > 1 {
			return nil, fmt.Errorf("%w: header %s sent more than once", ErrInvalidSignature, n)
		}
	}
	rolesCSV := h.Get(hd.Roles)
	uc := signing.UserContext{
		UserID:             h.Get(hd.UserID),
		ServiceProductID:   h.Get(hd.ServiceProductID),
		SubscriptionStatus: h.Get(hd.SubscriptionStatus),
		BillingModel:       h.Get(hd.BillingModel),
		MeasurementType:    h.Get(hd.MeasurementType),
		UnitLabel:          h.Get(hd.UnitLabel),
	}
	if rolesCSV != "" {
		// The header text exactly as signed: split and rejoined by ','
		// it is the same bytes, whatever it holds.
		uc.Roles = strings.Split(rolesCSV, ",")
	}
	ctx := signing.AppendContext(nil, uc)
	tsb := []byte(ts)

	if !hasSecret(v.Secrets) {
		return nil, fmt.Errorf("%w: the Verifier has no secret", ErrInvalidSignature)
	}
	var job *AsyncJob
	if !signing.Verify(v.Secrets, sig, body, tsb, ctx) {
		env, ok := parseEnvelope(body)
		if !ok || !signing.Verify(v.Secrets, sig, signing.AsyncCanonical(env.Payload, env.RequestID), tsb, ctx) {
			return nil, ErrInvalidSignature
		}
		job = env
	}
	at, err := signing.ParseTimestamp(ts)
	if err != nil {
		return nil, ErrStaleTimestamp
	}
	now := v.now()
	if !signing.Within(at, now, now, v.tolerance()) {
		return nil, ErrStaleTimestamp
	}
	cc := &CallerContext{
		UserID:             uc.UserID,
		ServiceProductID:   uc.ServiceProductID,
		Roles:              cleanRoles(uc.Roles),
		SubscriptionStatus: uc.SubscriptionStatus,
		BillingModel:       uc.BillingModel,
		MeasurementType:    uc.MeasurementType,
		UnitLabel:          uc.UnitLabel,
		RequestID:          h.Get(hd.RequestID),
		Timestamp:          at,
		Job:                job,
	}
	if job != nil {
		// The signed id, not a header anyone on the way could set.
		cc.RequestID = job.RequestID
	}
	return cc, nil
}

func hasSecret(secrets [][]byte) bool {
	for _, s := range secrets {
		if len(s) > 0 {
			return true
		}
	}
	return false
}

// single returns a header's value when it is sent exactly once.
func single(h http.Header, name string) string {
	vs := h.Values(name)
	if len(vs) != 1 {
		return ""
	}
	return vs[0]
}

// cleanRoles drops empty roles and surrounding spaces.
func cleanRoles(raw []string) []string {
	var out []string
	for _, r := range raw {
		if r = strings.TrimSpace(r); r != "" {
			out = append(out, r)
		}
	}
	return out
}

// parseEnvelope reads an async envelope. Keys are matched exactly (as
// JavaScript's JSON.parse does, unlike encoding/json's case-folding);
// request_id and payload must be strings.
func parseEnvelope(body []byte) (*AsyncJob, bool) {
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, false // not JSON: skip the decoder
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return nil, false
	}
	str := func(key string) (string, bool) {
		raw, ok := m[key]
		if !ok || len(raw) == 0 || raw[0] != '"' {
			return "", false
		}
		var s string
		return s, json.Unmarshal(raw, &s) == nil
	}
	id, ok1 := str("request_id")
	payload, ok2 := str("payload")
	if !ok1 || !ok2 || id == "" {
		return nil, false
	}
	progress, _ := str("progress_url")
	callback, _ := str("callback_url")
	return &AsyncJob{RequestID: id, Payload: payload, ProgressURL: progress, CallbackURL: callback}, true
}

func (v *Verifier) now() time.Time {
	if v.Clock != nil {
		return v.Clock()
	}
	return time.Now()
}

func (v *Verifier) tolerance() time.Duration {
	if v.Tolerance > 0 {
		return v.Tolerance
	}
	return DefaultTolerance
}

func (v *Verifier) maxBody() int64 {
	if v.MaxBodyBytes > 0 {
		return v.MaxBodyBytes
	}
	return DefaultMaxBodyBytes
}

// ctxKey keys the CallerContext in a request's context.
type ctxKey struct{}

// NewContext returns ctx carrying cc, as Middleware does.
func NewContext(ctx context.Context, cc *CallerContext) context.Context {
	return context.WithValue(ctx, ctxKey{}, cc)
}

// FromContext returns the CallerContext Middleware verified for this
// request, and false outside Middleware.
func FromContext(ctx context.Context) (*CallerContext, bool) {
	cc, ok := ctx.Value(ctxKey{}).(*CallerContext)
	return cc, ok && cc != nil
}

// Middleware verifies every request before next sees it. A request that
// does not verify is answered 401 with the JSON error body of the wire
// contract (code invalid_signature or stale_timestamp), or 413 when its
// body is too large, and never reaches next. A verified one reaches next
// with its CallerContext in the context (FromContext) and r.Body readable
// again from the start, the raw body as received (for an async call, the
// envelope; the caller's body is in Job.Payload).
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cc, body, err := v.VerifyRequest(r)
		if err != nil {
			apierror.Write(w, refusal(err))
			return
		}
		r = r.WithContext(NewContext(r.Context(), cc))
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		next.ServeHTTP(w, r)
	})
}

// refusal is the JSON error a failed verification is answered with; it
// says what to fix, never what the expected signature was.
func refusal(err error) *apierror.Error {
	switch {
	case errors.Is(err, ErrBodyTooLarge):
		return apierror.New(apierror.PayloadTooLarge, "request body is larger than the limit")
	case errors.Is(err, ErrStaleTimestamp):
		return apierror.New(apierror.StaleTimestamp, "the signed timestamp is outside the accepted window")
	case errors.Is(err, ErrMissingSignature):
		return apierror.New(apierror.InvalidSignature, "the request is not signed by the gateway")
	case errors.Is(err, ErrUnverified):
		return apierror.New(apierror.InvalidSignature, "the signature does not match the request")
	}
	return apierror.New(apierror.InvalidRequest, "the request could not be read")
}
