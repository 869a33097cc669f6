package portal

import (
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// startRootPortal serves the portal at the root of a site of its own (a
// portal.example.com, no handle_path), where its base path is empty.
func startRootPortal(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	backend := signingBackend(t)
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
	platform {
		store %s/platform.db
		public_url %s
		service echo {
			backend %s
			secret %s
			endpoint hello
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
			}
		}
	}
}
:%d {
	bind 127.0.0.1
	platform_portal
}
`, adminPort, httpPort, dir, siteBase, backend.URL, echoSecret, httpPort)
	unloadOtherStore(filepath.Join(dir, "platform.db"))
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	return &env{t: t, dir: dir, base: siteBase}
}

// browserURL resolves a URL written in a page as a browser does: the
// WHATWG URL parser first removes every ASCII tab and newline, then
// resolves it against the page's address.
func browserURL(t *testing.T, page, ref string) *url.URL {
	t.Helper()
	ref = strings.NewReplacer("\t", "", "\n", "", "\r", "", "&#9;", "", "&#10;", "", "&#13;", "").Replace(ref)
	base, err := url.Parse(page)
	if err != nil {
		t.Fatal(err)
	}
	u, err := base.Parse(strings.ReplaceAll(ref, "&amp;", "&"))
	if err != nil {
		t.Fatalf("%q: %v", ref, err)
	}
	return u
}

// TestOnwardNeverLeavesTheSite: the page that goes on by itself after a
// navigation from another site (onward) sends the browser to the same
// path of this site. A path holding a tab or a newline (`/%09/evil`) was
// written into the page as is; a browser removes those from a URL, so
// `/\t/evil.example/` became `//evil.example/`, another site: an open
// redirect wherever the portal is served at a site's root.
func TestOnwardNeverLeavesTheSite(t *testing.T) {
	e := startRootPortal(t)
	c := e.newClient()
	refresh := regexp.MustCompile(`content="0; url=([^"]*)"`)
	link := regexp.MustCompile(`<a href="([^"]*)">Continue to the portal`)
	for _, p := range []string{"/%09/evil.example/", "/%0A/evil.example/", "/%0D/evil.example/", "/%09%09/evil.example/x?m=subscribed"} {
		req, _ := http.NewRequest(http.MethodGet, e.base+p, nil)
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		req.Header.Set("Sec-Fetch-Mode", "navigate")
		_, body := c.do(req)
		for _, re := range []*regexp.Regexp{refresh, link} {
			m := re.FindStringSubmatch(body)
			if m == nil {
				continue // not the page that goes on: nothing to follow
			}
			if u := browserURL(t, e.base+p, m[1]); u.Host != strings.TrimPrefix(e.base, "http://") {
				t.Errorf("%s: the page sends the browser to %s, another site (%q)", p, u, m[1])
			}
		}
	}
	// The ordinary case still goes on, to the same address.
	req, _ := http.NewRequest(http.MethodGet, e.base+"/plans/echo?m=subscribed", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.Header.Set("Sec-Fetch-Mode", "navigate")
	if _, body := c.do(req); !strings.Contains(body, `content="0; url=/plans/echo?m=subscribed"`) {
		t.Errorf("a navigation from another site to a portal at the root:\n%s", body)
	}
}
