// Package usagehandler is the platform_usage HTTP handler: usage reports,
// async job progress and completion, job status and result, and the core
// pre-flight routes (key validation and usage estimates).
//
// Backends sign what they send here with their service secret
// (Base64 HMAC-SHA256 of the raw body followed by the timestamp header);
// callers read their jobs with their service key.
package usagehandler

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/platform"
	"github.com/platformgw/gateway/internal/store"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// Handler is the platform_usage handler; it serves from the runtime the
// platform app built (engine.Runtime).
type Handler struct {
	rt     *engine.Runtime
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.platform_usage",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision takes the runtime of the platform app: the Caddy shell ends
// here, and everything a request does goes through h.rt.
func (h *Handler) Provision(ctx caddy.Context) error {
	app, err := platform.FromContext(ctx, "platform_usage")
	if err != nil {
		return err
	}
	h.rt = app.Runtime()
	h.logger = ctx.Logger()
	if h.rt.PublicURL == "" {
		h.logger.Warn("public_url is not set: async jobs are accepted only when the caller's Host is one of the site's host names or the address it connected to; set public_url to the URL backends reach the gateway at")
	}
	return nil
}

// ServeHTTP answers the usage routes, job status and result, and passes
// every other path on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	rt, ok := matchRoute(h.rt.Prefixes, r.URL.Path)
	if !ok {
		return next.ServeHTTP(w, r)
	}
	method := r.Method
	if method == http.MethodHead {
		method = http.MethodGet // net/http drops the body
	}
	switch rt.kind {
	case routeCore:
		h.serveCore(w, r, rt.core)
	case routeUnknown:
		h.refuse(w, r, apierror.New(apierror.NotFound, "no such route"))
	case routeReport:
		if method != http.MethodPost {
			h.methodNotAllowed(w, r, "POST")
			return nil
		}
		h.report(w, r)
	case routeProgress, routeStatus:
		// The spec's progress URL is both polled by callers and posted to
		// by backends, so both routes answer both.
		switch method {
		case http.MethodGet:
			h.status(w, r, rt.id)
		case http.MethodPost:
			h.progress(w, r, rt.id)
		default:
			h.methodNotAllowed(w, r, "GET, HEAD, POST")
		}
	case routeComplete:
		if method != http.MethodPost {
			h.methodNotAllowed(w, r, "POST")
			return nil
		}
		h.complete(w, r, rt.id)
	case routeResult:
		if method != http.MethodGet {
			h.methodNotAllowed(w, r, "GET, HEAD")
			return nil
		}
		h.result(w, r, rt.id)
	}
	return nil
}

func (h *Handler) methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	h.refuse(w, r, apierror.New(apierror.MethodNotAllowed, r.Method+" is not allowed here; use "+allow))
}

// refuse writes a JSON error, counts and logs it (never a key, secret or
// signature, so the path without its query: a progress or callback URL
// carries a signature there).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, e *apierror.Error) {
	// The id goes in a header, not the body, where requestId names a job.
	id := requestID(r)
	w.Header().Set(h.rt.Headers.RequestID, id)
	h.rt.CountRejection(e.Code)
	h.logger.Info("usage request refused",
		zap.String("code", e.Code),
		zap.String("field", e.Field),
		zap.String("request_id", id),
		zap.String("method", r.Method),
		zap.String("path", r.URL.Path),
		zap.String("remote", r.RemoteAddr))
	apierror.Write(w, e)
}

// routeKind names what a path under one of the prefixes is.
type routeKind int

const (
	routeUnknown  routeKind = iota // under a prefix this handler owns, but no route
	routeReport                    // POST {usage}/report
	routeProgress                  // {usage}/progress/{id}
	routeComplete                  // {usage}/complete/{id}
	routeStatus                    // {gw}/requests/{id}/status
	routeResult                    // {gw}/requests/{id}/result
	routeCore                      // {core}/…: see core.go
)

type route struct {
	kind routeKind
	id   string   // the job's request id
	core coreKind // which core route
}

// matchRoute finds the route of a path. The handler owns everything under
// the usage prefixes and under {gw}/requests/; core paths are recognised so
// they can be dispatched; ok is false for any other path. The longest
// matching prefix wins, because the default usage and core prefixes lie
// inside the default gateway prefix (/api/usage, /api/v1 in /api).
func matchRoute(p engine.Prefixes, path string) (route, bool) {
	const (
		gw = iota
		usage
		core
	)
	group, rest, best := -1, "", -1
	for g, list := range [][]string{gw: p.Gateway, usage: p.Usage, core: p.Core} {
		for _, prefix := range list {
			r, ok := strings.CutPrefix(path, strings.TrimSuffix(prefix, "/")+"/")
			if ok && len(prefix) > best {
				group, rest, best = g, r, len(prefix)
			}
		}
	}
	switch group {
	case usage:
		if rest == "report" {
			return route{kind: routeReport}, true
		}
		if id, ok := strings.CutPrefix(rest, "progress/"); ok && validID(id) {
			return route{kind: routeProgress, id: id}, true
		}
		if id, ok := strings.CutPrefix(rest, "complete/"); ok && validID(id) {
			return route{kind: routeComplete, id: id}, true
		}
		return route{kind: routeUnknown}, true
	case gw:
		tail, ok := strings.CutPrefix(rest, "requests/")
		if !ok {
			return route{}, false // invoke routes belong to platform_gateway
		}
		if id, ok := strings.CutSuffix(tail, "/status"); ok && validID(id) {
			return route{kind: routeStatus, id: id}, true
		}
		if id, ok := strings.CutSuffix(tail, "/result"); ok && validID(id) {
			return route{kind: routeResult, id: id}, true
		}
		return route{kind: routeUnknown}, true
	case core:
		return route{kind: routeCore, core: coreKindOf(rest)}, true
	}
	return route{}, false
}

// validID accepts one non-empty path segment as a request id; whether a
// job has it is for the store to say.
func validID(id string) bool {
	return id != "" && len(id) <= 128 && !strings.ContainsAny(id, "/\x00")
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// storeFailure answers a store error that is not a refusal: a store that
// cannot be reached or cannot write now (a PostgreSQL restart, a full disk)
// is 503 store_unavailable with Retry-After, since nothing changed and a
// retry will do; anything else is logged by the caller and is a 500 with
// what failed.
//
// Handlers answer store errors through storeError, which logs them.
func storeFailure(err error, what string) *apierror.Error {
	if errors.Is(err, store.ErrUnavailable) {
		return apierror.New(apierror.StoreUnavailable, "the store cannot be reached right now ("+what+"); nothing was changed, retry").
			WithRetry(time.Second)
	}
	return apierror.New(apierror.InternalError, what)
}

// storeError logs a store error that is not a refusal and answers it as
// storeFailure does. An unavailable store (store.ErrUnavailable: a full
// disk, an I/O error, PostgreSQL out of reach) is not logged here: the
// store logs its failed writes once per burst with their count
// (boltstore's health), as the invoke path leaves them to it. A line per
// refused report, progress or completion was 93,560 ERROR lines in 20 s on
// a full disk.
func (h *Handler) storeError(err error, what, msg string, fields ...zap.Field) *apierror.Error {
	if !errors.Is(err, store.ErrUnavailable) {
		h.logger.Error(msg, append(fields, zap.Error(err))...)
	}
	return storeFailure(err, what)
}
