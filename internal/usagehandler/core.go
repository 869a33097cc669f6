package usagehandler

// The core pre-flight routes. A backend that is not proxied through the
// gateway asks, before it accepts work, whether a caller's service key is
// good (validate) and whether some units would be allowed now (the two
// estimates). They answer from the same key checks, subscription rules and
// billing decision the gateway uses, and never write to the store.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/jwtauth"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/subscription"
	"github.com/platformgw/gateway/internal/wire"
)

// Schema versions of the core response bodies (package wire).
const (
	ValidationSchemaVersion = wire.ValidationSchemaVersion
	EstimateSchemaVersion   = wire.EstimateSchemaVersion
)

// coreKind names a route under a core prefix.
type coreKind int

const (
	coreUnknown         coreKind = iota // under a core prefix, but no route
	coreValidate                        // POST {core}/service-keys/validate
	coreKeyEstimate                     // POST {core}/service-keys/estimate-usage
	coreBillingEstimate                 // POST {core}/billing/usage/estimate
)

func coreKindOf(rest string) coreKind {
	switch rest {
	case "service-keys/validate":
		return coreValidate
	case "service-keys/estimate-usage":
		return coreKeyEstimate
	case "billing/usage/estimate":
		return coreBillingEstimate
	}
	return coreUnknown
}

// String is the route's label in metrics and logs.
func (k coreKind) String() string {
	switch k {
	case coreValidate:
		return "validate"
	case coreKeyEstimate:
		return "estimate_usage"
	case coreBillingEstimate:
		return "billing_estimate"
	}
	return "unknown"
}

// coreCall is what one core request has established so far.
type coreCall struct {
	kind      coreKind
	requestID string
	now       time.Time
	ts        string // the response timestamp: Unix seconds, header and body alike
	// svc is the calling service once authenticated: from then on every
	// answer, refusals included, is signed with its newest secret.
	svc *catalog.Service
}

// serveCore answers the routes under a core prefix.
func (h *Handler) serveCore(w http.ResponseWriter, r *http.Request, kind coreKind) {
	now := h.rt.Now()
	c := &coreCall{kind: kind, requestID: requestID(r), now: now, ts: signing.Timestamp(now)}
	if kind == coreUnknown {
		h.coreRefuse(w, r, c, apierror.New(apierror.NotFound, "no such route; the core routes are service-keys/validate, service-keys/estimate-usage and billing/usage/estimate"))
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		h.coreRefuse(w, r, c, apierror.New(apierror.MethodNotAllowed, r.Method+" is not allowed here; use POST"))
		return
	}
	s, e := h.readSigned(r)
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	f, e := parseObject(s.body)
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	switch kind {
	case coreValidate:
		h.validateKey(w, r, c, s, f)
	case coreKeyEstimate:
		h.estimateForKey(w, r, c, s, f)
	case coreBillingEstimate:
		h.estimateForUser(w, r, c, s, f)
	}
}

// validateKey answers POST {core}/service-keys/validate.
func (h *Handler) validateKey(w http.ResponseWriter, r *http.Request, c *coreCall, s signedRequest, f fields) {
	svc, e := h.callingService(c, s, f)
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	c.svc = svc
	token, e := f.serviceKey()
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	key, e := h.rt.AuthenticateServiceKey(r.Context(), token)
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	st, e := h.standingOf(r.Context(), svc, key.UserID)
	if e == nil {
		e = h.writable(r.Context(), c, svc, st)
	}
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	roles := key.Roles
	if roles == nil {
		roles = []string{}
	}
	out := wire.Validation{
		Valid:                   true,
		UserID:                  key.UserID,
		ServiceID:               svc.ID,
		ServiceKeyID:            key.ID,
		Roles:                   roles,
		ValidationSchemaVersion: ValidationSchemaVersion,
		SubscriptionStatus:      string(st.Status()), // ACTIVE for a service owner
		Timestamp:               c.now.Unix(),
	}
	if p := st.Product; p != nil {
		out.ServiceProductID = p.ID
		out.BillingModelType = &p.BillingModel
		out.MeasurementType = &p.MeasurementType
		out.UnitLabel = &p.UnitLabel
	}
	h.rt.CountPreflight(c.kind.String(), svc.ID, "ok")
	h.coreWrite(w, c, http.StatusOK, out)
}

// estimateForKey answers POST {core}/service-keys/estimate-usage: a
// backend asks about the user whose service key it was given.
func (h *Handler) estimateForKey(w http.ResponseWriter, r *http.Request, c *coreCall, s signedRequest, f fields) {
	svc, e := h.callingService(c, s, f)
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	c.svc = svc
	token, e := f.serviceKey()
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	units, e := f.estimatedUnits()
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	key, e := h.rt.AuthenticateServiceKey(r.Context(), token)
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	h.estimate(w, r, c, svc, key.UserID, units)
}

// estimateForUser answers POST {core}/billing/usage/estimate. The caller
// is the service (signed) or the user itself (its Bearer key); the answer
// is not signed.
func (h *Handler) estimateForUser(w http.ResponseWriter, r *http.Request, c *coreCall, s signedRequest, f fields) {
	serviceID, e := f.serviceID("serviceId")
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	var svc *catalog.Service
	var keyUser string
	if s.signature != "" || r.Header.Get("Authorization") == "" {
		// The service itself. Refused alike whether serviceId names a
		// service or not (an unknown one cannot have signed), so that
		// unsigned callers cannot probe the catalog.
		if s.signature == "" {
			h.rt.CountSignatureFailure(c.kind.String())
			h.coreRefuse(w, r, c, apierror.New(apierror.InvalidSignature,
				"sign the request with the service's secret ("+h.rt.Headers.Signature+", "+h.rt.Headers.Timestamp+") or send Authorization: Bearer <the user's service key>"))
			return
		}
		known := false
		if svc, known = h.rt.Catalog.Service(serviceID); !known {
			h.coreRefuse(w, r, c, h.unknownSigner(s, c.kind.String()))
			return
		}
		if e := h.verify(s, svc, c.now, c.now, c.kind.String()); e != nil {
			h.coreRefuse(w, r, c, e)
			return
		}
	} else {
		if keyUser, e = h.bearerUser(r, c); e != nil {
			h.coreRefuse(w, r, c, e)
			return
		}
	}
	userID, e := f.userID("userId")
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	if svc == nil && keyUser != userID {
		h.coreRefuse(w, r, c, apierror.New(apierror.Forbidden, "a service key or JWT may only estimate its own user's usage"))
		return
	}
	units, e := f.estimatedUnits()
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	if svc == nil {
		// A key holder may learn what an invoke would tell it anyway.
		var known bool
		if svc, known = h.rt.Catalog.Service(serviceID); !known {
			h.coreRefuse(w, r, c, apierror.New(apierror.ServiceNotFound, "no service "+strconv.Quote(serviceID)))
			return
		}
	}
	h.estimate(w, r, c, svc, userID, units)
}

// bearerUser is the user the Authorization header of a billing estimate
// speaks for: the holder of a service key (psk_…), or, when the platform
// block configures jwt, the end user of a JWT (what the upstream SDKs'
// estimateUsageWithJwt sends). A JWT that does not verify is 401
// invalid_token, whatever the reason; the reason is logged, never the token.
func (h *Handler) bearerUser(r *http.Request, c *coreCall) (string, *apierror.Error) {
	if v := h.rt.JWT; v != nil {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if token = strings.TrimSpace(token); strings.EqualFold(scheme, "Bearer") && jwtauth.LooksLikeJWT(token) {
			user, err := v.UserID(token)
			if err != nil {
				h.logger.Info("jwt refused", zap.String("request_id", c.requestID), zap.String("reason", err.Error()))
				return "", apierror.New(apierror.InvalidToken, "the bearer token is not a valid JWT of this platform's identity provider")
			}
			return user, nil
		}
	}
	key, e := h.rt.AuthenticateKey(r)
	if e != nil {
		return "", e
	}
	return key.UserID, nil
}

// estimate answers whether the user could consume units of svc now: the
// one billing decision, on the stored state, written nowhere. c.svc set
// means the answer is signed and carries the schema version and timestamp.
func (h *Handler) estimate(w http.ResponseWriter, r *http.Request, c *coreCall, svc *catalog.Service, userID string, units billing.Units) {
	st, e := h.standingOf(r.Context(), svc, userID)
	if e == nil {
		e = h.writable(r.Context(), c, svc, st)
	}
	if e != nil {
		h.coreRefuse(w, r, c, e)
		return
	}
	var state billing.State
	if st.Product != nil {
		var err error
		state, err = h.rt.Meter().State(r.Context(), st.Account, c.now)
		if err != nil {
			h.coreRefuse(w, r, c, h.storeError(err, "usage state lookup failed", "usage state",
				zap.String("request_id", c.requestID), zap.String("service", svc.ID)))
			return
		}
	}
	out, d := estimateOf(st.Product, state, units)
	status := http.StatusOK
	if !d.Allowed {
		status = apierror.Status(d.Code)
		out.RequestID = c.requestID
		if d.Code == billing.CodeQuotaExceeded {
			msg, at := subscription.QuotaRetry(out.Message, *st.Product, st.Subscription.StartedAt, st.Subscription.EndsAt, c.now)
			out.RetryAfter = apierror.RetrySeconds(at.Sub(c.now))
			out.Message = msg
			w.Header().Set("Retry-After", strconv.Itoa(out.RetryAfter))
		}
		h.logger.Info("usage estimate denied",
			zap.String("code", d.Code),
			zap.String("route", c.kind.String()),
			zap.String("request_id", c.requestID),
			zap.String("service", svc.ID))
	}
	if c.svc != nil {
		out.EstimateSchemaVersion = EstimateSchemaVersion
		out.Timestamp = c.now.Unix()
	}
	outcome := "ok"
	if !d.Allowed {
		outcome = d.Code
	}
	h.rt.CountPreflight(c.kind.String(), svc.ID, outcome)
	h.coreWrite(w, c, status, out)
}

// writable refuses a pre-flight answer for a subscriber while the store
// would refuse the call's hold (docs/wire-contract.md, store_unavailable):
// an estimate or a validation that says yes while every invoke is refused
// and every report fails sends the backend to work it cannot be paid for.
// A service owner calls free, with no hold, so it is asked nothing.
func (h *Handler) writable(ctx context.Context, c *coreCall, svc *catalog.Service, st subscription.Access) *apierror.Error {
	if st.Owner() {
		return nil
	}
	if err := h.rt.Meter().Writable(ctx); err != nil {
		return h.storeError(err, "recording usage", "store cannot take a hold",
			zap.String("request_id", c.requestID), zap.String("service", svc.ID))
	}
	return nil
}

// estimateOf is the answer for units on top of state st under product p
// (nil for a service owner, who is never charged). The decision and the
// breakdown come from billing.Decide and billing.Summarize, the code the
// gateway reserves with, on a copy of the state.
func estimateOf(p *billing.Product, st billing.State, units billing.Units) (wire.Estimate, billing.Decision) {
	out := wire.Estimate{SufficientCredits: true, WouldAllow: true}
	if p == nil {
		out.Breakdown = billing.Breakdown{UnitsUsed: units}
		return out, billing.Decision{Allowed: true, Units: units}
	}
	d := billing.Decide(*p, st, units)
	out.WouldAllow = d.Allowed
	out.SufficientCredits = d.Code != billing.CodeInsufficientCredits
	out.WouldExceedCap = d.Code == billing.CodeQuotaExceeded
	out.EstimatedCost = d.Cost
	out.BillingModelType = &p.BillingModel
	out.MeasurementType = &p.MeasurementType
	out.UnitLabel = &p.UnitLabel
	out.Breakdown = billing.Summarize(*p, st, units, false)
	if !d.Allowed {
		out.Code, out.Message = d.Code, d.Reason
	}
	return out, d
}

// callingService authenticates the backend calling validate or
// estimate-usage: by the signature headers over the raw body and the
// timestamp, as reports are signed, or by serviceSecret in the body. With
// both, both must hold. serviceId names the service; without it a
// serviceSecret finds its own service.
func (h *Handler) callingService(c *coreCall, s signedRequest, f fields) (*catalog.Service, *apierror.Error) {
	route := c.kind.String()
	serviceID, hasID, e := f.str("serviceId")
	if e != nil {
		return nil, e
	}
	if hasID {
		if serviceID, e = f.serviceID("serviceId"); e != nil {
			return nil, e
		}
	}
	secret, hasSecret, e := f.str("serviceSecret")
	if e != nil {
		return nil, e
	}
	signed := s.signature != ""
	hd := h.rt.Headers
	refused := func(msg string) (*catalog.Service, *apierror.Error) {
		h.rt.CountSignatureFailure(route)
		return nil, apierror.New(apierror.InvalidSignature, msg)
	}
	if !signed && !hasSecret {
		return refused("authenticate the calling service: sign the request (" + hd.Signature + ", " + hd.Timestamp + ") or send serviceSecret")
	}
	const mismatch = "serviceSecret does not match the service's secret"
	var svc *catalog.Service
	switch {
	case hasID:
		var known bool
		if svc, known = h.rt.Catalog.Service(serviceID); !known {
			// No secret of an unknown service can match: the same answer
			// as a wrong one, so the catalog cannot be probed.
			if hasSecret {
				return refused(mismatch)
			}
			return nil, h.unknownSigner(s, route)
		}
	case hasSecret:
		if svc = h.serviceBySecret(secret); svc == nil {
			return refused(mismatch)
		}
	default:
		return nil, apierror.Invalid("serviceId", "serviceId is required to verify a signed request")
	}
	if hasSecret && !secretMatches(svc, secret) {
		return refused(mismatch)
	}
	if signed {
		if e := h.verify(s, svc, c.now, c.now, route); e != nil {
			return nil, e
		}
	}
	return svc, nil
}

// serviceBySecret finds the one service with secret among its secrets
// (the current one or, during a rotation, the previous one). Every secret
// is compared, in constant time; a secret two services share names
// neither. What the caller sent is hashed once, not once per service: it
// may be as long as the body, and the route needs no credentials.
func (h *Handler) serviceBySecret(secret string) *catalog.Service {
	got := sha256.Sum256([]byte(secret))
	var found *catalog.Service
	matches := 0
	for _, s := range h.rt.Catalog.Services() {
		svc, ok := h.rt.Catalog.Service(s.ID)
		if ok && digestMatches(svc, got) {
			found = svc
			matches++
		}
	}
	if matches != 1 {
		return nil
	}
	return found
}

// secretMatches compares secret with each of the service's secrets in
// constant time (through their SHA-256, so not even the length leaks).
func secretMatches(svc *catalog.Service, secret string) bool {
	return digestMatches(svc, sha256.Sum256([]byte(secret)))
}

// digestMatches compares got, the SHA-256 of a secret, with that of each
// of the service's secrets in constant time.
func digestMatches(svc *catalog.Service, got [sha256.Size]byte) bool {
	ok := false
	for _, s := range svc.VerifySecrets() {
		want := sha256.Sum256(s)
		if hmac.Equal(got[:], want[:]) {
			ok = true
		}
	}
	return ok
}

// standingOf is the user's standing with svc (subscription.Resolve: a
// service owner, or a subscription whose status grants access to a
// product the catalog still offers), its refusal translated.
func (h *Handler) standingOf(ctx context.Context, svc *catalog.Service, userID string) (subscription.Access, *apierror.Error) {
	a, err := subscription.Resolve(ctx, svc, userID, h.rt.Now(), h.rt.Subscriptions().GetSubscription)
	if err != nil {
		return a, h.accessRefusal(err)
	}
	return a, nil
}

// accessRefusal is the JSON error for subscription.Resolve's error: a
// refusal keeps its message; a failed lookup is logged and answered 500.
func (h *Handler) accessRefusal(err error) *apierror.Error {
	var refusal *subscription.Error
	if !errors.As(err, &refusal) {
		return h.storeError(err, "subscription lookup failed", "subscription lookup")
	}
	if refusal.Reason == subscription.NoSubscription {
		return apierror.New(apierror.NoSubscription, refusal.Error())
	}
	return apierror.New(apierror.SubscriptionInactive, refusal.Error())
}

// serviceKey reads the required serviceKey field.
func (f fields) serviceKey() (string, *apierror.Error) {
	s, ok, e := f.str("serviceKey")
	if e != nil {
		return "", e
	}
	if !ok || strings.TrimSpace(s) == "" {
		return "", apierror.Invalid("serviceKey", "serviceKey is required")
	}
	return strings.TrimSpace(s), nil
}

// estimatedUnits reads the required estimatedUnits: a non-negative exact
// decimal (zero asks about the subscription as it stands).
func (f fields) estimatedUnits() (billing.Units, *apierror.Error) {
	u, ok, e := f.units("estimatedUnits")
	if e != nil {
		return 0, e
	}
	if !ok {
		return 0, apierror.Invalid("estimatedUnits", "estimatedUnits is required")
	}
	return u, nil
}

// coreRefuse answers a core request with an error: counted, logged (never
// a key, secret or signature) and, once the calling service is
// authenticated, signed like any other answer to it. On validate, every
// 401 and a subscription that grants no access are answered 401 in the
// validation shape {valid:false,error}.
func (h *Handler) coreRefuse(w http.ResponseWriter, r *http.Request, c *coreCall, e *apierror.Error) {
	e.RequestID = c.requestID
	status := apierror.Status(e.Code)
	var body any = e
	if c.kind == coreValidate && (status == http.StatusUnauthorized ||
		e.Code == apierror.NoSubscription || e.Code == apierror.SubscriptionInactive) {
		status = http.StatusUnauthorized
		body = wire.ValidationFailure{
			Error:                   e.Code,
			Code:                    e.Code,
			Message:                 e.Message,
			RequestID:               e.RequestID,
			ValidationSchemaVersion: ValidationSchemaVersion,
			Timestamp:               c.now.Unix(),
		}
	}
	service := ""
	if c.svc != nil {
		service = c.svc.ID
	}
	h.rt.CountRejection(e.Code)
	h.rt.CountPreflight(c.kind.String(), service, e.Code)
	h.logger.Info("core request refused",
		zap.String("code", e.Code),
		zap.String("field", e.Field),
		zap.String("route", c.kind.String()),
		zap.String("request_id", c.requestID),
		zap.String("service", service),
		zap.String("method", r.Method),
		zap.String("path", r.URL.Path),
		zap.String("remote", r.RemoteAddr))
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	h.coreWrite(w, c, status, body)
}

// coreWrite sends a core answer. Once the calling service is known the
// body is signed as backends sign what they send: X-<Brand>-Signature is
// Base64(HMAC-SHA256(newest secret, body + timestamp)), over the exact
// bytes sent, with the timestamp in X-<Brand>-Timestamp.
func (h *Handler) coreWrite(w http.ResponseWriter, c *coreCall, status int, v any) {
	body, err := marshal(v)
	if err != nil {
		h.logger.Error("encode core answer", zap.String("request_id", c.requestID), zap.Error(err))
		status, body = http.StatusInternalServerError, []byte(`{"code":"internal_error","message":"could not encode the answer"}`)
	}
	hd := h.rt.Headers
	w.Header().Set(hd.RequestID, c.requestID)
	if c.svc != nil {
		w.Header().Set(hd.Signature, signing.Sign(c.svc.SigningSecret(), body, []byte(c.ts)))
		w.Header().Set(hd.Timestamp, c.ts)
	}
	writeJSON(w, status, body)
}

// marshal is json.Marshal without its HTML escapes: the wire contract's
// bodies have '<', '>' and '&' as themselves (a unit label "Q&A" read
// "Q\u0026A", a refusal's quoted id "a\u003cb"), as apierror.Encode
// writes every refusal of the other routes.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
}

// requestID is the id of this HTTP request in logs and answers: Caddy's
// own request UUID, which reading it also adds to the request's access log
// entry (as "uuid"), so a refusal can be found in both. Outside a Caddy
// server (unit tests) a fresh UUID.
func requestID(r *http.Request) string {
	ctx := r.Context()
	repl, ok := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if _, hasExtra := ctx.Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok && hasExtra {
		if id, _ := repl.GetString("http.request.uuid"); id != "" {
			return id
		}
	}
	return uuid.NewString()
}
