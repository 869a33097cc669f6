package portal

import (
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// trustedProxiesOption is a trusted_proxies setting as docs/fleet.md
// writes it, in its text or in a code block.
var trustedProxiesOption = regexp.MustCompile(`trusted_proxies(_strict| static <balancer address>)`)

// fleetServersOptions is the servers block docs/fleet.md tells a fleet's
// nodes to set behind their balancer, with the balancer at 127.0.0.1.
func fleetServersOptions(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/fleet.md")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, m := range trustedProxiesOption.FindAllString(string(doc), -1) {
		if m = strings.ReplaceAll(m, "<balancer address>", "127.0.0.1/32"); !slices.Contains(lines, m) {
			lines = append(lines, m)
		}
	}
	if len(lines) == 0 {
		t.Fatal("docs/fleet.md shows no trusted_proxies line")
	}
	return "servers {\n\t\t" + strings.Join(lines, "\n\t\t") + "\n\t}"
}

// TestSignInLimitBehindABalancer: behind a balancer that adds the
// caller's address to X-Forwarded-For (as most do: nginx's
// $proxy_add_x_forwarded_for, cloud load balancers), a caller who sends an
// X-Forwarded-For of its own is still counted by its own address. With
// the servers options docs/fleet.md gave (trusted_proxies alone), Caddy
// took the left-most address, the caller's free choice: each sign-in
// attempt under another made-up address had a fresh sign_in_limit, and
// logs and the console showed that address.
func TestSignInLimitBehindABalancer(t *testing.T) {
	e := startSiteWith(t, fleetServersOptions(t), "sign_in_limit 3", false)
	c := e.newClient()
	const caller = "198.51.100.7" // what the balancer saw and appended
	for i, made := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4", "203.0.113.5"} {
		_, page := c.get("/portal/")
		req, _ := http.NewRequest(http.MethodPost, c.base+"/portal/signin",
			strings.NewReader(url.Values{"csrf": {csrf(t, page)}, "key": {"pk_wrong"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Forwarded-For", made+", "+caller)
		resp, _ := c.do(req)
		want := http.StatusUnauthorized
		if i >= 3 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Errorf("attempt %d, made-up address %s: %d, want %d", i+1, made, resp.StatusCode, want)
		}
	}
}
