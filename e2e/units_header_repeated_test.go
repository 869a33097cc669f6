package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

// TestUnitsHeaderRepeated has a backend state its units in two
// X-Platform-Units lines. The first was charged (5 of "5" and "100"),
// while the same two values in one line ("5, 100", which HTTP makes the
// same header) were ignored as malformed and the call charged its cost:
// which figure a backend meant cannot be told, and the answer depended on
// how a proxy in between wrote the lines. Both are now ignored alike.
func TestUnitsHeaderRepeated(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Query().Get("mode") {
		case "two":
			w.Header()["X-Platform-Units"] = []string{"5", "100"}
		case "joined":
			w.Header().Set("X-Platform-Units", "5, 100")
		case "one":
			w.Header().Set("X-Platform-Units", "5")
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(be.Close)
	g := startGateway(t, t.TempDir(), fmt.Sprintf(`
		service rep {
			backend %s
			secret %s
			endpoint go {
				path /go
			}
			product token {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				unit token
				price 0.001
			}
		}`, be.URL, testSecret))
	g.subscribe("u-units", "rep", "token", "ACTIVE")
	key, _ := g.newKey("u-units")
	for _, tc := range []struct {
		mode string
		want billing.Units
	}{{"two", billing.Whole(1)}, {"joined", billing.Whole(1)}, {"one", billing.Whole(5)}} {
		before := ledgerSum(g.ledger("u-units"))
		resp, body := call(t, "GET", invokeURL("rep", "go")+"?mode="+tc.mode, key, "")
		if resp.StatusCode != 200 || resp.Header.Get("X-Platform-Units") != "" {
			t.Fatalf("%s: %d %s %v", tc.mode, resp.StatusCode, body, resp.Header)
		}
		if got := ledgerSum(g.ledger("u-units")) - before; got != tc.want {
			t.Errorf("%s: charged %s, want %s", tc.mode, got, tc.want)
		}
	}
}
