package platformgw

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// call is one invocation as it passes the checks.
type call struct {
	route     invokeRoute
	requestID string
	started   time.Time
	key       store.KeyRecord
	svc       *catalog.Service
	ep        *catalog.Endpoint
	product   *billing.Product // nil for a service owner
	account   store.Account
	// subStarted anchors the subscription's billing periods (zero for a
	// service owner); the allowance headers are computed from it. subEnds
	// is its end (EndsAt), zero for none: a quota refusal's Retry-After
	// points no later (subscription.QuotaRetry).
	subStarted time.Time
	subEnds    time.Time
	user       signing.UserContext
	body       []byte
	allowance  allowance
	urls       jobURLs // an async job's, built before anything is taken
	// code is the error code the call was refused with (refuseCall),
	// cutOff that its answer was cut off after the status line: with
	// the status, the call's outcome (outcome.go).
	code   string
	cutOff bool

	// Parts of a call that would otherwise be allocated one by one on
	// every call; the call is allocated once anyway. idValue backs the
	// request id header, fwd what the upstream source and the transport
	// are told (the body handed to the proxy included), meter the sync
	// answer's writer, observed what the console's overview is told.
	idValue  [1]string
	fwd      forward
	meter    meterWriter
	observed observedCall
}

func (h *Handler) invoke(w http.ResponseWriter, r *http.Request, c *call, route invokeRoute, next caddyhttp.Handler) error {
	c.route, c.started = route, h.rt.Now()
	// The call's id (an async call's is its job's id): a UUID of its own
	// generator, set as Caddy's {http.request.uuid}.
	c.requestID = invokeRequestID(r)
	c.idValue[0] = c.requestID
	w.Header()[h.requestIDKey] = c.idValue[:]
	e := h.admit(r, c)
	// Refused or not, what was checked is published (a rate-limited
	// caller is worth logging too).
	c.publish(r)
	if e != nil {
		h.refuseCall(w, r, c, false, "rejected", e)
		return nil
	}
	if route.async {
		return h.invokeAsync(w, r, c, next)
	}
	return h.invokeSync(w, r, c, next)
}

func mode(r invokeRoute) string {
	if r.async {
		return "async"
	}
	return "sync"
}

// admit runs every check that may refuse the call, in the order a caller
// can fix them: credentials, route, subscription, limits, body.
func (h *Handler) admit(r *http.Request, c *call) *apierror.Error {
	key, e := h.rt.AuthenticateKey(r)
	if e != nil {
		return e
	}
	c.key = key
	svc, ok := h.rt.Catalog.Service(c.route.serviceID)
	if !ok {
		return apierror.New(apierror.ServiceNotFound, "no service "+apierror.QuoteID(c.route.serviceID))
	}
	ep, ok := svc.Endpoint(c.route.endpointID)
	if !ok {
		return apierror.New(apierror.EndpointNotFound, "service "+svc.ID+" has no endpoint "+apierror.QuoteID(c.route.endpointID))
	}
	c.svc, c.ep = svc, ep
	if !ep.Allows(r.Method) {
		return apierror.New(apierror.MethodNotAllowed, "endpoint "+ep.ID+" does not accept "+r.Method)
	}
	if c.route.async && !ep.Async {
		return apierror.New(apierror.EndpointNotFound, "endpoint "+ep.ID+" is not asynchronous; use /invoke")
	}
	if !c.route.async && ep.AsyncOnly {
		// Refused here, not by the backend: a backend's 4xx is charged.
		return apierror.Invalid("path", "endpoint "+ep.ID+" is asynchronous only; use /invoke/async")
	}
	ignoreH2COffer(r.Header)
	if r.Header.Get("Upgrade") != "" && !ep.AllowUpgrade {
		return apierror.Invalid("Upgrade", "endpoint "+ep.ID+" does not allow protocol upgrades")
	}
	if c.route.async {
		// Before the subscription, rate limit and reservation: a Host the
		// job's URLs cannot be built on refuses the call having taken
		// nothing.
		urls, e := h.jobURLs(r, c)
		if e != nil {
			return e
		}
		c.urls = urls
	}
	if e := h.subscription(r.Context(), c); e != nil {
		return e
	}
	if p := c.product; p != nil {
		if p.MeasurementType == billing.PerTimeUnit && !c.route.async && !ep.Streaming {
			return apierror.New(apierror.TimeUnitInvocationNotAllowed,
				"a PER_TIME_UNIT product is invoked asynchronously, or synchronously only on a streaming endpoint")
		}
		ok, wait, remaining := h.rt.Allow(key.ID, svc.ID, p.RateLimit, c.started)
		c.allowance.rate(p.RateLimit, remaining, wait)
		if !ok {
			return apierror.New(apierror.RateLimited, "rate limit of this key reached").WithRetry(wait)
		}
	}
	body, e := h.readBody(r)
	if e != nil {
		return e
	}
	c.body = body
	return nil
}

// subscription fills the user context from subscription.Resolve (who may
// call the service, under which product, at the call's start: a
// subscription past its end is refused here, exactly, sweep or no sweep)
// and translates its refusal.
func (h *Handler) subscription(ctx context.Context, c *call) *apierror.Error {
	c.user = signing.UserContext{UserID: c.key.UserID, Roles: c.key.Roles}
	a, err := subscription.Resolve(ctx, c.svc, c.key.UserID, c.started, h.rt.Subscriptions().GetSubscription)
	if err != nil {
		return h.accessRefusal(err)
	}
	c.account = a.Account
	c.user.SubscriptionStatus = string(a.Status())
	p := a.Product
	if p == nil { // a service owner calls free
		return nil
	}
	c.product = p
	c.subStarted, c.subEnds = a.Subscription.StartedAt, a.Subscription.EndsAt
	c.user.ServiceProductID = p.ID
	c.user.BillingModel = p.BillingModel
	c.user.MeasurementType = p.MeasurementType
	c.user.UnitLabel = p.UnitLabel
	return nil
}

// accessRefusal is the caller's error for subscription.Resolve's.
func (h *Handler) accessRefusal(err error) *apierror.Error {
	var refusal *subscription.Error
	if errors.Is(err, store.ErrUnavailable) {
		return apierror.Unavailable() // a shared store that cannot be reached: 503, retry
	}
	if !errors.As(err, &refusal) {
		h.logger.Error("subscription lookup", zap.Error(err))
		return apierror.New(apierror.InternalError, "subscription lookup failed")
	}
	if refusal.Reason == subscription.NoSubscription {
		return apierror.New(apierror.NoSubscription, refusal.Error())
	}
	return apierror.New(apierror.SubscriptionInactive, refusal.Error())
}

// readBody reads the whole request body (the v3 signature covers it),
// refusing one over the configured size with 413. It reads into a pooled
// buffer and keeps an exact copy: an empty body (most GETs) allocates
// nothing, any other one allocation. The pooled buffer itself is never
// handed on, because net/http's transport may still read a request body
// after RoundTrip has returned.
func (h *Handler) readBody(r *http.Request) ([]byte, *apierror.Error) {
	limit := h.rt.Limits.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, apierror.New(apierror.PayloadTooLarge, "request body is larger than the limit")
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	bp := bodyBuffers.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= maxPooledBody {
			bodyBuffers.Put(bp)
		}
	}()
	b := (*bp)[:0]
	if r.ContentLength > 0 && int64(cap(b)) < r.ContentLength+1 {
		b = make([]byte, 0, r.ContentLength+1) // +1: EOF is read without growing
	}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		room := b[len(b):cap(b)]
		if most := limit + 1 - int64(len(b)); int64(len(room)) > most {
			room = room[:most] // as io.LimitReader(limit+1): never read much past the limit
		}
		n, err := r.Body.Read(room)
		b = b[:len(b)+n]
		*bp = b
		if int64(len(b)) > limit {
			return nil, apierror.New(apierror.PayloadTooLarge, "request body is larger than the limit")
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, apierror.Invalid("body", "could not read the request body")
		}
	}
	if len(b) == 0 {
		return nil, nil
	}
	return bytes.Clone(b), nil
}

// bodyBuffers are readBody's read buffers; one larger than maxPooledBody
// (a rare large upload) is left to the garbage collector rather than kept.
var bodyBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

const maxPooledBody = 64 << 10

// prepareForward strips what the caller may not send to a backend, signs
// the payload, and routes the request to the service's backend for the
// reverse proxy that follows. It returns the signature and timestamp.
//
// The signature and context headers are not set on r: Caddy's loggers
// record the request the proxy hands its transport (reverse_proxy's
// "upstream roundtrip" at DEBUG, "aborting with incomplete response" at
// WARN when a caller hangs up or a backend cuts its body short), headers
// and all, and only Authorization and cookies are redacted there. They
// travel in a request variable and the `platform` transport adds them to
// its own copy of the request as it sends it (Transport.RoundTrip).
func (h *Handler) prepareForward(r *http.Request, c *call, payload []byte, backendPath string) (sig, ts string) {
	hd := &h.hd
	stripCallerHeaders(r.Header, hd.Prefix)
	// The proxy forwards request trailers too: a chunked body ending in
	// "X-Platform-User-ID: admin" or "Authorization: Bearer <key>" reached
	// the backend as trailers, unsigned, past the header stripping. The
	// body is read in full by now, so the trailers are too.
	stripCallerHeaders(r.Trailer, hd.Prefix)
	sig, ts = h.signer(c.svc).SignV3At(payload, h.rt.Now(), c.user)
	f := &c.fwd
	f.svc = c.svc
	f.add(hd.Signature, sig)
	f.add(hd.Timestamp, ts)
	f.add(hd.SigningVersion, signing.Version)
	f.add(hd.UserID, c.user.UserID)
	f.add(hd.ServiceProductID, c.user.ServiceProductID)
	f.add(hd.SubscriptionStatus, c.user.SubscriptionStatus)
	if len(c.user.Roles) > 0 {
		f.add(hd.Roles, strings.Join(c.user.Roles, ","))
	}
	if c.product != nil {
		f.add(hd.BillingModel, c.user.BillingModel)
		f.add(hd.MeasurementType, c.user.MeasurementType)
		f.add(hd.UnitLabel, c.user.UnitLabel)
	}
	f.add(hd.RequestID, c.requestID)

	r.URL.Path = c.svc.BackendURL().Path + backendPath
	r.URL.RawPath = ""
	caddyhttp.SetVar(r.Context(), forwardVar, f)
	return sig, ts
}

// signer is the service's Signer, made on its first call in this config.
func (h *Handler) signer(svc *catalog.Service) *signing.Signer {
	if s, ok := h.signers.Load(svc); ok {
		return s.(*signing.Signer)
	}
	s, _ := h.signers.LoadOrStore(svc, signing.NewSigner(svc.SigningSecret()))
	return s.(*signing.Signer)
}

// stripCallerHeaders removes every X-<Brand>-* header a caller sent (also
// spelled with '_', which CGI-style backends read as the same variable),
// the Authorization header (the service key never reaches a backend), and
// Connection tokens naming such headers, which would otherwise make the
// proxy drop the headers the gateway adds.
func stripCallerHeaders(h http.Header, prefix string) {
	for name := range h {
		if hasBrandPrefix(name, prefix) || strings.EqualFold(name, "Authorization") {
			delete(h, name)
		}
	}
	filterConnection(h, func(tok string) bool { return hasBrandPrefix(tok, prefix) })
}

// ignoreH2COffer drops an offer to switch to cleartext HTTP/2: `h2c` from
// Upgrade, the HTTP2-Settings header, and their Connection tokens. Java's
// default HttpClient makes that offer on every plain-http request, and a
// server may ignore an upgrade offer and answer in the protocol asked in
// (RFC 9110 section 7.8), which the gateway does: the call is then an
// ordinary HTTP/1.1 invoke. Any other protocol in Upgrade (WebSocket) is a
// real switch and stays, for the endpoint's allow_upgrade to decide.
func ignoreH2COffer(h http.Header) {
	offers := h.Values("Upgrade")
	if len(offers) == 0 {
		return
	}
	var keep []string
	h2c := false
	for _, v := range offers {
		for _, tok := range strings.Split(v, ",") {
			tok = strings.TrimSpace(tok)
			switch {
			case strings.EqualFold(tok, "h2c"):
				h2c = true
			case tok != "":
				keep = append(keep, tok)
			}
		}
	}
	if !h2c {
		return
	}
	h.Del("HTTP2-Settings")
	drop := []string{"HTTP2-Settings"}
	if len(keep) == 0 {
		h.Del("Upgrade")
		drop = append(drop, "Upgrade")
	} else {
		h.Set("Upgrade", strings.Join(keep, ", "))
	}
	dropConnectionTokens(h, drop...)
}

// dropConnectionTokens removes the named options from Connection.
func dropConnectionTokens(h http.Header, names ...string) {
	filterConnection(h, func(tok string) bool {
		return slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, tok) })
	})
}

// filterConnection removes the Connection options drop names, and the
// header itself when none is left.
func filterConnection(h http.Header, drop func(tok string) bool) {
	conn := h.Values("Connection")
	if len(conn) == 0 {
		return
	}
	var keep []string
	for _, v := range conn {
		for _, tok := range strings.Split(v, ",") {
			tok = strings.TrimSpace(tok)
			if tok != "" && !drop(tok) {
				keep = append(keep, tok)
			}
		}
	}
	if len(keep) == 0 {
		h.Del("Connection")
		return
	}
	h.Set("Connection", strings.Join(keep, ", "))
}

// hasBrandPrefix compares case-insensitively, treating '_' as '-'.
func hasBrandPrefix(name, prefix string) bool {
	if len(name) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		c := name[i]
		if c == '_' {
			c = '-'
		} else if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}
