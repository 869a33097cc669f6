package publiccatalog

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/platformgw/gateway/internal/catalog"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("platform_catalog", parseCaddyfile)
	// Like platform_portal: meant to sit alone in a handle_path block,
	// where order does not matter.
	httpcaddyfile.RegisterDirectiveOrder("platform_catalog", httpcaddyfile.Before, "metrics")
}

// UnmarshalCaddyfile sets up the handler:
//
//	platform_catalog [{
//		max_age <duration>    # Cache-Control max-age, 1s to 365d; 1m
//		storefront_url <path or URL> # platform_storefront's mount, e.g. /store
//	}]
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.Errf("platform_catalog takes no arguments, got '%s'", d.Val())
	}
	seen := map[string]int{}
	for d.NextBlock(0) {
		name := d.Val()
		if line, dup := seen[name]; dup {
			return d.Errf("platform_catalog: %s given twice (first on line %d)", name, line)
		}
		seen[name] = d.Line()
		switch name {
		case "max_age":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil || dur < time.Second || dur%time.Second != 0 || dur > 365*24*time.Hour {
				return d.Errf("max_age '%s': whole seconds, 1s to 365d", d.Val())
			}
			h.MaxAge = caddy.Duration(dur)
			if d.NextArg() {
				return d.ArgErr()
			}
		case "storefront_url":
			if !d.Args(&h.StorefrontURL) {
				return d.ArgErr()
			}
			if d.NextArg() {
				return d.ArgErr()
			}
			if err := catalog.CheckLink(h.StorefrontURL, false); err != nil {
				return d.Errf("platform_catalog: storefront_url: %v", err)
			}
		default:
			return d.Errf("platform_catalog: unrecognized subdirective '%s'", name)
		}
	}
	return nil
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)
