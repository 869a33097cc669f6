package platformgw

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// TestDynamicPlatformNeedsPlatformTransport: the `platform` transport adds
// the signed headers, so a reverse_proxy with `dynamic platform` and any
// other transport (or none, which is Caddy's http transport) forwarded
// every admitted call unsigned. Such a config is now refused at load.
// caddy.Validate provisions without starting anything (no listener, no
// admin endpoint).
func TestDynamicPlatformNeedsPlatformTransport(t *testing.T) {
	config := func(transport string, multi bool) *caddy.Config {
		source := map[string]any{"source": "platform"}
		if multi {
			source = map[string]any{"source": "multi", "sources": []any{source}}
		}
		proxy := map[string]any{
			"handler":           "reverse_proxy",
			"dynamic_upstreams": source,
		}
		if transport != "" {
			proxy["transport"] = map[string]any{"protocol": transport}
		}
		return &caddy.Config{
			Admin: &caddy.AdminConfig{Disabled: true},
			AppsRaw: caddy.ModuleMap{"http": caddyconfig.JSON(map[string]any{
				"servers": map[string]any{"gw": map[string]any{
					"listen":          []string{"127.0.0.1:0"},
					"automatic_https": map[string]any{"disable": true},
					"routes":          []any{map[string]any{"handle": []any{proxy}}},
				}},
			}, nil)},
		}
	}
	for _, multi := range []bool{false, true} {
		for _, transport := range []string{"", "http"} {
			err := caddy.Validate(config(transport, multi))
			if err == nil || !strings.Contains(err.Error(), "needs 'transport platform'") {
				t.Errorf("transport %q (inside dynamic multi: %v): %v, want a refusal", transport, multi, err)
			}
		}
		if err := caddy.Validate(config("platform", multi)); err != nil {
			t.Errorf("transport platform (inside dynamic multi: %v): %v", multi, err)
		}
	}
}
