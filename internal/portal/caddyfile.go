package portal

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("platform_portal", parseCaddyfile)
	// Like platform_usage: ahead of the gateway's directives. It is meant
	// to sit alone in a handle_path block, where order does not matter.
	httpcaddyfile.RegisterDirectiveOrder("platform_portal", httpcaddyfile.Before, "metrics")
}

// UnmarshalCaddyfile sets up the handler:
//
//	platform_portal {
//		allow_key_management
//		session_ttl 30m
//		sign_in_limit 10
//		allow_plain_http
//		minted_keys follow_parent|independent
//		max_active_keys 20
//		key_create_limit 5
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		if seen[d.Val()] {
			return d.Errf("platform_portal: %s given twice", d.Val())
		}
		seen[d.Val()] = true
		switch d.Val() {
		case "allow_key_management":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.AllowKeyManagement = true
		case "allow_plain_http":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.AllowPlainHTTP = true
		case "session_ttl":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil || dur < time.Minute || dur > 24*time.Hour {
				return d.Errf("session_ttl %q: a duration from 1m to 24h", d.Val())
			}
			h.SessionTTL = caddy.Duration(dur)
			if d.NextArg() {
				return d.ArgErr()
			}
		case "sign_in_limit":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 1 || n > 10000 {
				return d.Errf("sign_in_limit %q: attempts per minute, 1 to 10000", d.Val())
			}
			h.SignInLimit = n
			if d.NextArg() {
				return d.ArgErr()
			}
		case "minted_keys":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if v := d.Val(); v != MintedFollowParent && v != MintedIndependent {
				return d.Errf("minted_keys %q: %s or %s", v, MintedFollowParent, MintedIndependent)
			}
			h.MintedKeys = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "max_active_keys":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 1 || n > 1000 {
				return d.Errf("max_active_keys %q: active keys per user, 1 to 1000", d.Val())
			}
			h.MaxActiveKeys = n
			if d.NextArg() {
				return d.ArgErr()
			}
		case "key_create_limit":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 1 || n > 1000 {
				return d.Errf("key_create_limit %q: keys per minute per user, 1 to 1000", d.Val())
			}
			h.KeyCreateLimit = n
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("platform_portal: unknown option %q", d.Val())
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
