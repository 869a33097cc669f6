package publiccatalog

import (
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apidoc"
)

// TestEveryRouteIsDocumented: every path the public catalog answers (its
// resources, a public service's id standing for {serviceId}; the
// stylesheet aside) is documented in docs/openapi.json under /catalog,
// where Caddyfile.example mounts it. internal/apidoc holds the documented
// routes to a running gateway; this is the other direction.
func TestEveryRouteIsDocumented(t *testing.T) {
	paths := apidoc.Paths(t)
	h := new(Handler)
	if err := h.setup(testCatalog(t), DocOptions{}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	n := 0
	for p := range h.resources {
		if strings.HasPrefix(p, "/assets/") {
			continue
		}
		template := p
		if rest, ok := strings.CutPrefix(p, "/services/"); ok {
			id, tail, _ := strings.Cut(rest, "/")
			if !h.public[id] {
				t.Fatalf("resource %s of a service that is not public", p)
			}
			template = "/services/{serviceId}"
			if tail != "" {
				template += "/" + tail
			}
		}
		if _, ok := paths["/catalog"+template]; !ok {
			t.Errorf("the public catalog answers %s; docs/openapi.json does not document /catalog%s", p, template)
		}
		n++
	}
	if n < 4 {
		t.Fatalf("only %d routes found: the test catalog has no public service?", n)
	}
}
