// Package portal is the caller portal, the platform_portal HTTP handler: a
// caller signs in with one of their service keys and sees their own
// subscriptions, usage against quota, credits and spend, recent calls,
// jobs and keys; with allow_key_management they create and revoke their
// own keys. Pages are server-rendered html/template with embedded assets
// and work without script (copy.js only adds copy buttons); docs/portal.md
// is the guide.
package portal

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/platform"
	"github.com/platformgw/gateway/internal/store"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// Defaults of the handler's options.
const (
	DefaultSessionTTL     = 30 * time.Minute
	DefaultSignInLimit    = 10 // attempts per minute per client address
	DefaultMaxActiveKeys  = 20 // active keys per user, past which the portal makes no more
	DefaultKeyCreateLimit = 5  // keys a user may create per minute
)

// The values of minted_keys.
const (
	MintedFollowParent = "follow_parent"
	MintedIndependent  = "independent"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Handler is the platform_portal handler. Mount it on a path of its own
// with handle_path (it finds its base path from the original request), so
// links, redirects and the session cookie stay under that path.
type Handler struct {
	// AllowKeyManagement lets a signed-in caller create and revoke their
	// own service keys; off by default.
	AllowKeyManagement bool `json:"allow_key_management,omitempty"`
	// SessionTTL is how long a session lasts after sign-in; 30m.
	SessionTTL caddy.Duration `json:"session_ttl,omitempty"`
	// SignInLimit is how many sign-in attempts a client address may make
	// per minute; 10.
	SignInLimit int `json:"sign_in_limit,omitempty"`
	// AllowPlainHTTP serves the portal over plain HTTP to clients that are
	// not on loopback (behind a proxy that terminates TLS). Without it a
	// plain HTTP request is only served from 127.0.0.1 or ::1 (the demo),
	// since its session cookie cannot be marked Secure.
	AllowPlainHTTP bool `json:"allow_plain_http,omitempty"`
	// MintedKeys is what revoking the key a caller signed in with does to
	// the keys they made with it: "follow_parent" (the default) revokes
	// them too, "independent" leaves them. Either way a key made in the
	// portal has that key's roles and expires no later than it.
	MintedKeys string `json:"minted_keys,omitempty"`
	// MaxActiveKeys is how many active keys a user may have for the
	// portal to make another; 20.
	MaxActiveKeys int `json:"max_active_keys,omitempty"`
	// KeyCreateLimit is how many keys a user may create in the portal per
	// minute; 5.
	KeyCreateLimit int `json:"key_create_limit,omitempty"`
	// OIDC, if set, lets callers sign in with the operator's OpenID
	// Connect provider as well as with a key (oidc.go).
	OIDC *OIDC `json:"oidc,omitempty"`

	// rt is the runtime the platform app built (engine.Runtime): the
	// store, the clock, key authentication and the rate limiters; ops are
	// the caller's own changes and period summaries, the same functions
	// the admin API runs.
	rt  *engine.Runtime
	ops Operations
	// pay is the payments integration, nil without a payments block:
	// paid plans (payments.go) and credit packs (topups.go); csp the
	// pages' Content-Security-Policy.
	pay    *payments.Service
	csp    string
	oidc   *oidcProvider
	logger *zap.Logger
	pages  *template.Template
	assets fs.FS
}

// Operations are what the portal does beyond the store, through the
// functions of the admin API (*ops.Ops has them), with their
// validation, errors and audit entries.
type Operations interface {
	CreateKey(ctx context.Context, actor string, req ops.CreateKeyRequest) (ops.KeyView, error)
	RevokeKey(ctx context.Context, actor, keyID string) (ops.KeyView, error)
	Summarize(ctx context.Context, sub store.Subscription, at time.Time) (ops.PeriodSummary, error)
	RecordAudit(ctx context.Context, e store.AuditEntry) error
	// What a caller does to their own subscriptions (selfservice.go).
	PutSubscription(ctx context.Context, actor, userID, serviceID, productID, status string) (ops.SubscriptionChange, error)
	PutSubscriptionUntil(ctx context.Context, actor, userID, serviceID, productID, status string, end ops.End) (ops.SubscriptionChange, error)
	ScheduleChange(ctx context.Context, actor, userID, serviceID, was, productID string, from time.Time) error
	PendingChange(ctx context.Context, userID, serviceID string) (ops.ScheduledChange, bool, error)
	ApplyDueChange(ctx context.Context, userID, serviceID string, now time.Time) (ops.ScheduledChange, error)
	RequestAccess(ctx context.Context, actor, userID, serviceID, productID string) error
	PendingAccessRequests(ctx context.Context, userID string) ([]ops.AccessRequest, error)
}

var _ Operations = (*ops.Ops)(nil)

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.platform_portal", New: func() caddy.Module { return new(Handler) }}
}

// Provision finds the platform app and readies the handler around its
// runtime and operations.
func (h *Handler) Provision(ctx caddy.Context) error {
	app, err := platform.FromContext(ctx, "platform_portal")
	if err != nil {
		return err
	}
	h.pay = app.PaymentsService()
	return h.setup(ctx, app.Runtime(), app.Ops(), ctx.Logger())
}

// setup applies the options' defaults, parses the templates and readies
// the handler around a runtime and the operations (Provision, and tests
// that serve the portal with no Caddy). With oidc it discovers the
// provider, and while the provider cannot be reached keeps trying until
// ctx ends: the portal serves key sign-in meanwhile.
func (h *Handler) setup(ctx context.Context, rt *engine.Runtime, o Operations, logger *zap.Logger) error {
	h.rt, h.ops, h.logger = rt, o, logger
	h.csp = contentSecurityPolicy
	if h.pay != nil {
		h.csp = paymentsCSP
	}
	if err := h.checkBounds(); err != nil {
		return err
	}
	if h.SessionTTL == 0 {
		h.SessionTTL = caddy.Duration(DefaultSessionTTL)
	}
	if h.SignInLimit == 0 {
		h.SignInLimit = DefaultSignInLimit
	}
	switch h.MintedKeys {
	case "":
		h.MintedKeys = MintedFollowParent
	case MintedFollowParent, MintedIndependent:
	default:
		return fmt.Errorf("platform_portal: minted_keys %q: %s or %s", h.MintedKeys, MintedFollowParent, MintedIndependent)
	}
	if h.MaxActiveKeys == 0 {
		h.MaxActiveKeys = DefaultMaxActiveKeys
	}
	if h.KeyCreateLimit == 0 {
		h.KeyCreateLimit = DefaultKeyCreateLimit
	}
	if h.OIDC != nil {
		if err := h.OIDC.check(); err != nil {
			return fmt.Errorf("platform_portal: %w", err)
		}
		secret := caddy.NewReplacer().ReplaceKnown(h.OIDC.ClientSecret, "")
		h.oidc = newOIDCProvider(h.OIDC, secret, logger)
		h.oidc.start(ctx)
	}
	var err error
	h.pages, err = parsePages()
	if err != nil {
		return err
	}
	h.assets, err = fs.Sub(assetFS, "assets")
	return err
}

// The options' bounds: the Caddyfile refuses a value outside them on
// its line, and setup refuses one from any config (JSON too, where a
// bare number of session_ttl is nanoseconds); 0 is the default.
const (
	minSessionTTL  = time.Minute
	maxSessionTTL  = 24 * time.Hour
	maxSignInLimit = 10000
	maxKeyOption   = 1000 // max_active_keys and key_create_limit
)

// checkBounds refuses an option set outside its bounds, with the words
// the Caddyfile's refusal uses.
func (h *Handler) checkBounds() error {
	if d := time.Duration(h.SessionTTL); d != 0 && (d < minSessionTTL || d > maxSessionTTL) {
		return fmt.Errorf("platform_portal: session_ttl %s: a duration from 1m to 24h (a bare number in JSON is nanoseconds: write \"30m\")", d)
	}
	if n := h.SignInLimit; n < 0 || n > maxSignInLimit {
		return fmt.Errorf("platform_portal: sign_in_limit %d: attempts per minute, 1 to %d", n, maxSignInLimit)
	}
	if n := h.MaxActiveKeys; n < 0 || n > maxKeyOption {
		return fmt.Errorf("platform_portal: max_active_keys %d: active keys per user, 1 to %d", n, maxKeyOption)
	}
	if n := h.KeyCreateLimit; n < 0 || n > maxKeyOption {
		return fmt.Errorf("platform_portal: key_create_limit %d: keys per minute per user, 1 to %d", n, maxKeyOption)
	}
	return nil
}

// parsePages parses the embedded templates.
func parsePages() (*template.Template, error) {
	t, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("platform_portal templates: %w", err)
	}
	return t, nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
