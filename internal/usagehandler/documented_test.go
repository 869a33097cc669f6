package usagehandler

import (
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/apidoc"
	"github.com/platformgw/gateway/internal/engine"
)

// TestEveryRouteIsDocumented: every route this handler answers (each
// routeKind and coreKind but the unknown ones) is reached by a path of
// docs/openapi.json under the default prefixes, so a route added here
// without its documentation fails. internal/apidoc holds the documented
// routes to a running gateway; this is the other direction for the
// routes that are not the admin API's.
func TestEveryRouteIsDocumented(t *testing.T) {
	paths := apidoc.Paths(t)
	ids := strings.NewReplacer("{requestId}", "req-1", "{serviceId}", "weather", "{endpointId}", "forecast")
	routes, cores := map[routeKind]string{}, map[coreKind]string{}
	for path := range paths {
		r, ok := matchRoute(engine.DefaultPrefixes(), ids.Replace(path))
		if !ok {
			continue
		}
		routes[r.kind] = path
		if r.kind == routeCore {
			cores[r.core] = path
		}
	}
	if p, ok := routes[routeUnknown]; ok {
		t.Errorf("docs/openapi.json documents %s, which this handler answers as no route", p)
	}
	// routeCore and coreBillingEstimate are the last of their kinds: a
	// kind added after them must be added to these loops.
	for k := routeReport; k <= routeCore; k++ {
		if _, ok := routes[k]; !ok {
			t.Errorf("route kind %d is answered but no path of docs/openapi.json reaches it", k)
		}
	}
	for k := coreValidate; k <= coreBillingEstimate; k++ {
		if _, ok := cores[k]; !ok {
			t.Errorf("core route %s is answered but no path of docs/openapi.json reaches it", k)
		}
	}
}
