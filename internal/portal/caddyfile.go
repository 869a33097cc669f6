package portal

import (
	"strconv"

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
//		oidc {
//			name "Example SSO"
//			issuer https://id.example.com
//			client_id portal
//			client_secret {env.PORTAL_OIDC_SECRET}
//			redirect_url https://api.example.com/portal/oidc/callback
//			user_claim email|sub|preferred_username
//			scopes openid email profile
//			allowed_domains example.com example.org
//		}
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
			if err != nil || dur < minSessionTTL || dur > maxSessionTTL {
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
			if err != nil || n < 1 || n > maxSignInLimit {
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
			if err != nil || n < 1 || n > maxKeyOption {
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
			if err != nil || n < 1 || n > maxKeyOption {
				return d.Errf("key_create_limit %q: keys per minute per user, 1 to 1000", d.Val())
			}
			h.KeyCreateLimit = n
			if d.NextArg() {
				return d.ArgErr()
			}
		case "oidc":
			if d.NextArg() {
				return d.ArgErr()
			}
			o, err := unmarshalOIDC(d)
			if err != nil {
				return err
			}
			h.OIDC = o
		default:
			return d.Errf("platform_portal: unknown option %q", d.Val())
		}
	}
	return nil
}

// unmarshalOIDC reads the oidc block. What needs no network is checked
// here, so a mistake names its line; the provider is found at provision.
func unmarshalOIDC(d *caddyfile.Dispenser) (*OIDC, error) {
	o := new(OIDC)
	start := d.Line()
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return nil, d.Errf("oidc: %s given twice", opt)
		}
		seen[opt] = true
		var one *string
		switch opt {
		case "name":
			one = &o.Name
		case "issuer":
			one = &o.Issuer
		case "client_id":
			one = &o.ClientID
		case "client_secret":
			one = &o.ClientSecret
		case "redirect_url":
			one = &o.RedirectURL
		case "user_claim":
			one = &o.UserClaim
		case "scopes":
			o.Scopes = d.RemainingArgs()
			if len(o.Scopes) == 0 {
				return nil, d.ArgErr()
			}
		case "allowed_domains":
			o.AllowedDomains = d.RemainingArgs()
			if len(o.AllowedDomains) == 0 {
				return nil, d.ArgErr()
			}
		default:
			return nil, d.Errf("oidc: unknown option %q", opt)
		}
		if one != nil {
			// Not d.ArgErr(): it repeats the last token read, which for
			// "client_secret first-half second-half" is part of the
			// secret, and a config error is logged.
			args := d.RemainingArgs()
			if len(args) != 1 {
				return nil, d.Errf("oidc: %s takes one value, found %d (the values are not repeated here)", opt, len(args))
			}
			*one = args[0]
		}
		if err := o.checkOption(opt); err != nil {
			return nil, d.Errf("%v", err)
		}
	}
	if o.Issuer == "" || o.ClientID == "" || o.RedirectURL == "" {
		return nil, d.Errf("oidc (from line %d) needs issuer, client_id and redirect_url", start)
	}
	return o, nil
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
