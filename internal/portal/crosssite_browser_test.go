package portal

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// foreignSite is a page on another site (localhost, where the portal is
// on 127.0.0.1: another host, so another site to the browser), standing
// for Stripe's checkout: a link to /go, which answers 303 to back, as
// Stripe sends a caller back to a success or cancel URL.
func foreignSite(t *testing.T, back string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/go" {
			http.Redirect(w, r, back, http.StatusSeeOther)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<!doctype html><title>Checkout</title><a id="back" href="/go">Back to the portal</a>`)
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	return "http://localhost:" + port + "/"
}

// TestBrowserBackFromAnotherSite: a signed-in caller who comes back to the
// portal from another site (Stripe's checkout sending them to the plans
// page with ?m=checkout-cancelled) is still signed in and reads the
// message, although the browser does not send the SameSite=Strict session
// cookie on a navigation that another site started.
func TestBrowserBackFromAnotherSite(t *testing.T) {
	ctx := newBrowser(t)
	e := startShop(t, "allow_key_management")
	key := e.keyOnly("walker")
	signInBrowser(t, ctx, key, false)

	foreign := foreignSite(t, siteBase+"/portal/plans/echo?m=checkout-cancelled")
	step(t, ctx, "the other site", chromedp.Navigate(foreign), chromedp.WaitVisible(chromedp.ID("back")))
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(c, chromedp.WaitEvent(cdppage.LoadEventFired, nil, chromedp.Click(chromedp.ID("back")))); err != nil {
		t.Fatalf("back to the portal: %v", err)
	}
	// A page that goes on by itself may stand between: wait for the
	// plans page, or the sign-in page.
	step(t, ctx, "the next page", chromedp.WaitVisible(chromedp.CSS(`#plan-basic, #key`)))
	doc := html(t, ctx)
	if !strings.Contains(doc, "You left Stripe") || !strings.Contains(doc, "Signed in as") {
		t.Errorf("back from another site, the caller is not on their plans page with the message:\n%s", doc)
	}
	checkPage(t, ctx, "the plans page after another site")
}

// TestOnwardFromAnotherSite: only a GET navigation from another site
// without a session cookie gets the page that goes on, to the same path
// of this portal and its query; anything else is served as before.
func TestOnwardFromAnotherSite(t *testing.T) {
	e := local(t, "")
	c := e.newClient()
	nav := func(p, site string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodGet, e.base+p, nil)
		if site != "" {
			req.Header.Set("Sec-Fetch-Site", site)
			req.Header.Set("Sec-Fetch-Mode", "navigate")
		}
		return c.do(req)
	}
	resp, body := nav("/portal/plans/echo?m=subscribed&x=%22%3E%3Cb%3E", "cross-site")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Security-Policy") == "" ||
		!strings.Contains(body, `content="0; url=/portal/plans/echo?m=subscribed&amp;x=%22%3E%3Cb%3E"`) || strings.Contains(body, "<b>") {
		t.Errorf("a navigation from another site: %d\n%s", resp.StatusCode, body)
	}
	for _, tc := range []struct{ path, site string }{
		{"/portal/plans/echo?m=subscribed", "same-origin"},
		{"/portal/plans/echo?m=subscribed", ""},
		{"/portal/oidc/callback?state=x", "cross-site"},
	} {
		if _, body := nav(tc.path, tc.site); strings.Contains(body, "Continue to the portal") {
			t.Errorf("%s from %q: the page that goes on\n%s", tc.path, tc.site, body)
		}
	}
	// Signed in, the browser sent the cookie: nothing in between.
	c.signIn(e.keyOnly("olga"))
	if _, body := nav("/portal/?m=signedout", "cross-site"); strings.Contains(body, "Continue to the portal") {
		t.Errorf("with a session cookie: the page that goes on\n%s", body)
	}
}
