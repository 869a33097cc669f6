package platformgw

import (
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/apidoc"
	"github.com/platformgw/gateway/internal/engine"
)

// TestInvokeRoutesAreDocumented: both invoke routes this handler answers,
// sync and async, are reached by a path of docs/openapi.json under the
// default prefixes, and no documented path under {prefix}/service/ is one
// it refuses as malformed. internal/apidoc holds the documented routes to
// a running gateway; this is the other direction.
func TestInvokeRoutesAreDocumented(t *testing.T) {
	paths := apidoc.Paths(t)
	ids := strings.NewReplacer("{serviceId}", "weather", "{endpointId}", "forecast")
	var sync, async bool
	for path := range paths {
		r, ok := parseInvokePath(engine.DefaultPrefixes().Gateway, ids.Replace(path))
		switch {
		case !ok:
		case r.bad:
			t.Errorf("docs/openapi.json documents %s, which the gateway refuses as no invoke route", path)
		case r.async:
			async = true
		default:
			sync = true
		}
	}
	if !sync || !async {
		t.Errorf("documented: sync invoke %v, async invoke %v; both are answered", sync, async)
	}
}
