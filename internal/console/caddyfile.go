package console

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("platform_console", parseCaddyfile)
	// Authentication (basic_auth, forward_auth) is ordered before it.
	httpcaddyfile.RegisterDirectiveOrder("platform_console", httpcaddyfile.Before, "reverse_proxy")
}

// UnmarshalCaddyfile sets up the handler:
//
//	platform_console {
//		prefix /console
//		refresh 10
//		allow_unauthenticated
//		allow_plain_http
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		name := d.Val()
		if seen[name] {
			return d.Errf("%s given twice", name)
		}
		seen[name] = true
		switch name {
		case "prefix":
			if !d.NextArg() {
				return d.ArgErr()
			}
			h.Prefix = d.Val()
			if h.Prefix == "" || h.Prefix[0] != '/' {
				return d.Errf("prefix %q must start with /", h.Prefix)
			}
		case "refresh":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 1 || n > maxRefresh {
				return d.Errf("refresh %q: seconds from 1 to 3600", d.Val())
			}
			h.RefreshSeconds = n
		case "allow_unauthenticated":
			h.AllowUnauthenticated = true
		case "allow_plain_http":
			h.AllowPlainHTTP = true
		default:
			return d.Errf("unknown platform_console option %q", name)
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	return nil
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
