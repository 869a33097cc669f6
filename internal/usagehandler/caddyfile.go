package usagehandler

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("platform_usage", parseCaddyfile)
	// Ahead of platform_gateway (which sits just before reverse_proxy): the
	// usage and core prefixes (/api/usage, /api/v1) lie inside the default
	// gateway prefix (/api). Plugins may only anchor on standard
	// directives, and metrics is the one before reverse_proxy.
	httpcaddyfile.RegisterDirectiveOrder("platform_usage", httpcaddyfile.Before, "metrics")
}

// UnmarshalCaddyfile sets up the handler. It takes no arguments or options;
// prefixes and limits come from the global `platform` block:
//
//	platform_usage
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("platform_usage takes no options, got %q; configure it in the global platform block", d.Val())
	}
	return nil
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
