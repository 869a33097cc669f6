// Package platformgw is the platform_gateway HTTP handler. It answers the
// invoke routes: it checks the caller's service key, subscription, credits,
// quota and rate limit, reserves the call's units, signs the request for the
// backend (signing version 3) and hands it to the reverse_proxy handler that
// follows it in the route, then meters what the backend answered.
//
// It also provides the two small modules that let one reverse_proxy serve
// every service of the catalog: the `platform` dynamic upstream source and
// the `platform` transport, which pick the backend chosen by the gateway.
package platformgw

import (
	"net/http"
	"net/textproto"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/platform"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// Handler is the platform_gateway handler. It has no settings of its own:
// it serves from the runtime the `platform` app built (engine.Runtime).
type Handler struct {
	rt     *engine.Runtime
	logger *zap.Logger

	// hd are the brand's header names; requestIDKey is the response's
	// request id header name as net/http's Header.Set spells it
	// (X-Platform-Request-Id), so it is set in the map directly.
	hd           engine.Headers
	requestIDKey string
	// signers holds a signing.Signer per service of this config's
	// catalog (*catalog.Service → *signing.Signer), made on first use.
	signers sync.Map
	// jobFailures are the failed jobs the store did not take yet
	// (failjob.go).
	jobFailures jobFailures
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.platform_gateway",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision takes the runtime of the platform app: the Caddy shell ends
// here, and everything a request does goes through h.rt.
func (h *Handler) Provision(ctx caddy.Context) error {
	app, err := platform.FromContext(ctx, "platform_gateway")
	if err != nil {
		return err
	}
	h.init(app.Runtime(), ctx.Logger())
	register(h)              // until Cleanup: a job failure still queued then moves here
	registerConnContext(ctx) // PER_BYTE measures a caller's connection (delivered.go)
	return nil
}

// init sets the handler up to serve from rt (Provision; unit tests call it
// with a runtime of their own).
func (h *Handler) init(rt *engine.Runtime, logger *zap.Logger) {
	h.rt = rt
	h.logger = logger
	h.hd = rt.Headers
	h.requestIDKey = textproto.CanonicalMIMEHeaderKey(h.hd.RequestID)
}

// ServeHTTP answers invoke routes under the gateway prefixes, refuses
// anything else under .../service/, and passes other paths on untouched; if
// one of them ends up at the platform proxy, it answers 404 not_found.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) (err error) {
	route, ok := parseInvokePath(h.rt.Prefixes.Gateway, r.URL.Path)
	if !ok {
		err = next.ServeHTTP(w, r)
		if unrouted, _ := caddyhttp.GetVar(r.Context(), unroutedVar).(bool); unrouted && err != nil {
			// The path is served by nothing before the platform proxy,
			// which has no backend for it: a JSON 404 rather than an
			// empty 503 and two ERROR lines per stray request.
			h.refuse(w, r, requestID(r), apierror.New(apierror.NotFound, "no such route; invoke paths are {prefix}/service/{serviceId}/endpoint/{endpointId}/invoke[/async]"))
			return nil
		}
		return err
	}
	start := time.Now()
	if route.bad {
		// A request id like any refused call's, so the log line can be
		// found from what the caller was told.
		h.refuse(w, r, requestID(r), apierror.New(apierror.NotFound, "no such route; invoke paths are {prefix}/service/{serviceId}/endpoint/{endpointId}/invoke[/async]"))
		h.rt.CountOutcome(engine.OutcomeCall{Hour: hourOf(h.rt.Now()), Outcome: apierror.NotFound}, time.Since(start), 0)
		return nil
	}
	// The call is allocated once, with its observer in it.
	c := new(call)
	o := &c.observed
	*o = observedCall{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, next: next}
	// Deferred, so that a call whose answer is cut off (the proxy panics
	// with http.ErrAbortHandler) is counted too.
	defer h.endCall(c, start, &err)
	return h.invoke(o, r, c, route, o)
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
