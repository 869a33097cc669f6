// Package stripewebhook is the platform_stripe_webhook handler: the
// endpoint Stripe posts its signed events to. It hands each request to
// the platform app's payments integration (internal/payments), which
// verifies the signature and its timestamp and applies each event once
// (docs/payments.md).
//
//	handle /stripe/webhook {
//		platform_stripe_webhook
//	}
package stripewebhook

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/platform"
)

func init() {
	caddy.RegisterModule(new(Handler))
	httpcaddyfile.RegisterHandlerDirective("platform_stripe_webhook", parseCaddyfile)
	// Meant to sit alone in a handle block, where order does not matter.
	httpcaddyfile.RegisterDirectiveOrder("platform_stripe_webhook", httpcaddyfile.Before, "metrics")
}

// Handler is the webhook endpoint. It takes no settings: the secret and
// tolerance are the platform app's payments block.
type Handler struct {
	svc *payments.Service
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.platform_stripe_webhook", New: func() caddy.Module { return new(Handler) }}
}

// Provision finds the payments integration of the platform app.
func (h *Handler) Provision(ctx caddy.Context) error {
	app, err := platform.FromContext(ctx, "platform_stripe_webhook")
	if err != nil {
		return err
	}
	if h.svc = app.PaymentsService(); h.svc == nil {
		return errors.New("platform_stripe_webhook: the platform app has no payments block (payments stripe { … }), so there is no webhook secret to verify events with")
	}
	return nil
}

// ServeHTTP answers every request itself; it never calls next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	h.svc.ServeWebhook(w, r)
	return nil
}

// UnmarshalCaddyfile reads `platform_stripe_webhook`, which takes no
// arguments and no block.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.Errf("platform_stripe_webhook takes no arguments, got '%s'; its settings are the platform app's payments block", d.Val())
	}
	if d.NextBlock(0) {
		return d.Errf("platform_stripe_webhook takes no block; its settings are the platform app's payments block")
	}
	return nil
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
