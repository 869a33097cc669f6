package platformgw

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("platform_gateway", parseCaddyfile)
	// Before reverse_proxy, which it hands admitted requests to, so users
	// need no `order` line.
	httpcaddyfile.RegisterDirectiveOrder("platform_gateway", httpcaddyfile.Before, "reverse_proxy")
}

// UnmarshalCaddyfile sets up the handler. It takes no arguments or options;
// services, prefixes and the header brand come from the global `platform`
// block:
//
//	platform_gateway
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("platform_gateway takes no options, got %q; configure services in the global platform block", d.Val())
	}
	return nil
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
