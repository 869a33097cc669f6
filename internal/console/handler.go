// Package console is the platform_console HTTP handler: the operator's web
// console (overview, services, users and their keys, subscriptions and
// credits, the usage explorer, jobs and the audit log), server-rendered
// with html/template, its assets embedded. Every change goes through the
// same functions as the admin API (internal/ops: Ops.CreateKey and the
// rest), with the same validation and errors, and is written to the audit log
// under the signed-in operator's name.
//
// The console does not authenticate anyone itself: Caddy's basic_auth in
// front of it does (or forward_auth followed by vars http.auth.user.id, in
// a route: docs/console.md), and it refuses (403) any request
// without an authenticated user ({http.auth.user.id}) unless
// allow_unauthenticated is set. Over plain HTTP it answers loopback
// clients only (internal/httpsonly, the portal's rule), unless
// allow_plain_http says TLS ends in a proxy in front of it.
package console

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/httpsonly"
	"github.com/platformgw/gateway/internal/onceform"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/platform"
	"github.com/platformgw/gateway/internal/store"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// Handler is the platform_console handler.
type Handler struct {
	// Prefix is the path the console is served under, such as /console;
	// empty when a handle_path strips it before the console sees the
	// request (links then start at the site root of the stripped path,
	// and Prefix must still name it for links: set it either way).
	Prefix string `json:"prefix,omitempty"`
	// AllowUnauthenticated serves requests that no Caddy authentication
	// handler signed in. Never set it on a reachable address.
	AllowUnauthenticated bool `json:"allow_unauthenticated,omitempty"`
	// RefreshSeconds is how often the overview reloads itself; 10.
	RefreshSeconds int `json:"refresh_seconds,omitempty"`
	// AllowPlainHTTP serves the console over plain HTTP to clients that
	// are not on loopback (behind a proxy that terminates TLS). Without
	// it a plain HTTP request is only served from 127.0.0.1 or ::1 (make
	// run), since the operator's password and the console's cookie would
	// cross the network in the clear.
	AllowPlainHTTP bool `json:"allow_plain_http,omitempty"`

	// rt is the runtime the platform app built (engine.Runtime): the
	// store, the catalog, the clock and the recent call figures; ops are
	// the operator's changes, the same functions the admin API runs.
	rt     *engine.Runtime
	ops    Operations
	logger *zap.Logger
	csrf   *csrfKey
	// once hands out the forms' one-time values and remembers those
	// taken (once.go).
	once *onceform.Book
	// payments is the config's payments block (defaults filled), nil
	// when it has none: the Revenue page then shows the usage money only.
	payments *payments.Config
}

// Operations are what the console changes and reads beyond the store,
// through the functions of the admin API (*ops.Ops has them), with their
// validation, errors and audit entries.
type Operations interface {
	CreateKey(ctx context.Context, actor string, req ops.CreateKeyRequest) (ops.KeyView, error)
	RevokeKey(ctx context.Context, actor, keyID string) (ops.KeyView, error)
	PutSubscription(ctx context.Context, actor, userID, serviceID, productID, status string) (ops.SubscriptionChange, error)
	AddCredits(ctx context.Context, actor, userID, serviceID string, amount billing.Units) (store.Subscription, error)
	Summary(ctx context.Context, userID, serviceID string, at time.Time) (ops.UserSummary, error)
	PeriodState(ctx context.Context, sub store.Subscription, at time.Time) (ops.PeriodSummary, error)
	ListAlerts(ctx context.Context, q ops.AlertQuery) (ops.AlertPage, error)
	AuditLog(ctx context.Context, cursor string, limit int) ([]store.AuditEntry, string, error)
	KeyLastUsed(id string) (time.Time, bool)
	Outcomes(ctx context.Context, q ops.OutcomeQuery) (ops.OutcomeSeries, error)
	FlushOutcomes(ctx context.Context)
	// Access requests from the portal (requests.go).
	PendingAccessRequests(ctx context.Context, userID string) ([]ops.AccessRequest, error)
	DeclineAccess(ctx context.Context, actor, userID, serviceID, productID string) error
	// RecordAudit writes an entry of a change made apart from the store's
	// own (a top-up marked resolved, notgranted.go).
	RecordAudit(ctx context.Context, e store.AuditEntry) error
}

var _ Operations = (*ops.Ops)(nil)

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.platform_console",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision takes the platform app.
func (h *Handler) Provision(ctx caddy.Context) error {
	app, err := platform.FromContext(ctx, "platform_console")
	if err != nil {
		return err
	}
	if s := app.PaymentsService(); s != nil {
		cfg := s.Config()
		h.payments = &cfg
	}
	return h.setup(app.Runtime(), app.Ops(), ctx.Logger())
}

// setup readies a handler around a runtime and the operations (Provision,
// and tests).
func (h *Handler) setup(rt *engine.Runtime, ops Operations, logger *zap.Logger) error {
	h.rt, h.ops, h.logger = rt, ops, logger
	if err := h.checkOptions(); err != nil {
		return err
	}
	h.Prefix = strings.TrimRight(h.Prefix, "/")
	if h.RefreshSeconds == 0 {
		h.RefreshSeconds = 10
	}
	k, err := newCSRFKey()
	if err != nil {
		return err
	}
	h.csrf = k
	h.once = newOnceBook(k)
	return nil
}

// maxRefresh is the most refresh_seconds may be.
const maxRefresh = 3600

// checkOptions refuses the options the Caddyfile refuses on their line,
// from any config (JSON too), with the same words.
func (h *Handler) checkOptions() error {
	if h.Prefix != "" && h.Prefix[0] != '/' {
		return fmt.Errorf("platform_console: prefix %q must start with /", h.Prefix)
	}
	if n := h.RefreshSeconds; n < 0 || n > maxRefresh {
		return fmt.Errorf("platform_console: refresh_seconds %d: seconds from 1 to %d", n, maxRefresh)
	}
	return nil
}

// securityHeaders go on every answer of the console.
func securityHeaders(hd http.Header) {
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Cache-Control", "no-store")
}

// operator is the user Caddy's authentication signed in, "" when none.
func operator(r *http.Request) string {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return ""
	}
	s, _ := repl.GetString("http.auth.user.id")
	return s
}

// ServeHTTP serves the console's pages; it never calls next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	securityHeaders(w.Header())
	// Before the operator is even looked at: the refusal is the same
	// whether or not the credentials sent were good, so it tells an
	// eavesdropper's victim nothing and a guesser nothing either.
	if !h.AllowPlainHTTP && httpsonly.PlainFromAfar(r) {
		h.logger.Warn("console request over plain HTTP from a client not on loopback refused; serve the console over HTTPS (or set allow_plain_http behind a proxy that terminates TLS)",
			zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path))
		http.Error(w, "403 forbidden: HTTPS required. The console is served over HTTPS only (plain HTTP from loopback excepted): an operator's password and the console's cookie must not travel in the clear.", http.StatusForbidden)
		return nil
	}
	who := operator(r)
	if who == "" {
		if !h.AllowUnauthenticated {
			h.logger.Warn("console request without an authenticated user refused; put basic_auth in front of platform_console, or forward_auth followed by vars http.auth.user.id (docs/console.md)",
				zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path))
			http.Error(w, "403 forbidden: the console needs an authenticated operator (basic_auth in front of it, or forward_auth followed by vars http.auth.user.id)", http.StatusForbidden)
			return nil
		}
		who = "anonymous"
	}
	h.route(w, r, who)
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
