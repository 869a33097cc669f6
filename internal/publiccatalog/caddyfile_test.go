package publiccatalog

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("platform_catalog {\n\tmax_age 5m\n}")); err != nil {
		t.Fatal(err)
	}
	if time.Duration(h.MaxAge) != 5*time.Minute {
		t.Errorf("max_age %v", time.Duration(h.MaxAge))
	}
	h = Handler{}
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("platform_catalog {\n\tstorefront_url /store\n}")); err != nil || h.StorefrontURL != "/store" {
		t.Errorf("storefront_url: %q, %v", h.StorefrontURL, err)
	}
	if err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("platform_catalog")); err != nil {
		t.Errorf("no block: %v", err)
	}
	for _, tc := range []struct{ in, want string }{
		{"platform_catalog x", "takes no arguments"},
		{"platform_catalog {\n\tmax_age 0s\n}", "max_age '0s'"},
		{"platform_catalog {\n\tmax_age 1.5s\n}", "max_age '1.5s'"},
		{"platform_catalog {\n\tmax_age soon\n}", "max_age 'soon'"},
		{"platform_catalog {\n\tmax_age 1m\n\tmax_age 2m\n}", "max_age given twice (first on line 2)"},
		{"platform_catalog {\n\tmax_age\n}", "wrong argument count"},
		{"platform_catalog {\n\tmaxage 1m\n}", "unrecognized subdirective 'maxage'"},
		{"platform_catalog {\n\tstorefront_url\n}", "wrong argument count"},
		{"platform_catalog {\n\tstorefront_url /store /shop\n}", "wrong argument count"},
		{"platform_catalog {\n\tstorefront_url store\n}", "storefront_url: '(no scheme; value not repeated)' is not a path starting with / or an http(s) URL"},
		{"platform_catalog {\n\tstorefront_url javascript:alert(1)\n}", "storefront_url: 'javascript:…' is not a path"},
		{"platform_catalog {\n\tstorefront_url //evil.example/\n}", "storefront_url:"},
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}
