package gateway

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestImportRegistersModules: importing the root package, as xcaddy's
// generated main does, registers every module of the gateway.
func TestImportRegistersModules(t *testing.T) {
	for _, id := range []string{
		"platform",
		"admin.api.platform",
		"admin.api.platform_store",
		"http.handlers.platform_gateway",
		"http.handlers.platform_usage",
		"http.handlers.platform_portal",
		"http.handlers.platform_console",
		"http.reverse_proxy.upstreams.platform",
		"http.reverse_proxy.transport.platform",
		"caddy.listeners.platform_delivery",
	} {
		if _, err := caddy.GetModule(id); err != nil {
			t.Errorf("module %s is not registered: %v", id, err)
		}
	}
}
