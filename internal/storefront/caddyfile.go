package storefront

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/platformgw/gateway/internal/catalog"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("platform_storefront", parseCaddyfile)
	// Like platform_catalog: meant to sit alone in a handle_path block,
	// where order does not matter.
	httpcaddyfile.RegisterDirectiveOrder("platform_storefront", httpcaddyfile.Before, "metrics")
}

// UnmarshalCaddyfile sets up the handler:
//
//	platform_storefront [{
//		title <text>                   # the storefront's name; "API marketplace"
//		sign_in_url <path or URL>      # the portal's sign-in, e.g. /portal/
//		contact_url <URL or mailto:>   # where callers ask for access
//		catalog_url <path or URL>      # platform_catalog's mount, e.g. /catalog
//		image_origins <origin>...      # where logos and covers may load from
//		max_age <duration>             # Cache-Control max-age, 1s to 365d; 1m
//	}]
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.Errf("platform_storefront takes no arguments, got '%s'", d.Val())
	}
	seen := map[string]int{}
	for d.NextBlock(0) {
		name := d.Val()
		if line, dup := seen[name]; dup {
			return d.Errf("platform_storefront: %s given twice (first on line %d)", name, line)
		}
		seen[name] = d.Line()
		switch name {
		case "title", "sign_in_url", "contact_url", "catalog_url":
			var v string
			if !d.Args(&v) {
				return d.ArgErr()
			}
			if d.NextArg() {
				return d.Errf("%s takes one value; quote a title with spaces", name)
			}
			switch name {
			case "title":
				h.Title = v
			case "sign_in_url":
				h.SignInURL = v
			case "contact_url":
				h.ContactURL = v
			case "catalog_url":
				h.CatalogURL = v
			}
		case "image_origins":
			origins := d.RemainingArgs()
			if len(origins) == 0 {
				return d.ArgErr()
			}
			for _, o := range origins {
				if err := CheckOrigin(o); err != nil {
					return d.Errf("image_origins: %v", err)
				}
			}
			h.ImageOrigins = origins
		case "max_age":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err == nil {
				err = checkMaxAge(dur)
			}
			if err != nil {
				return d.Errf("max_age '%s': whole seconds, 1s to 365d", d.Val())
			}
			h.MaxAge = caddy.Duration(dur)
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("platform_storefront: unrecognized subdirective '%s'", name)
		}
		switch name {
		case "sign_in_url", "catalog_url":
			if err := catalog.CheckLink(d.Val(), false); err != nil {
				return d.Errf("%s: %v", name, err)
			}
		case "contact_url":
			if err := catalog.CheckLink(d.Val(), true); err != nil {
				return d.Errf("%s: %v", name, err)
			}
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
