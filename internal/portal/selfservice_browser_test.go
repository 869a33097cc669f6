package portal

import (
	"context"
	"strings"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// TestBrowserSelfServiceWalk is the walk of a new caller, in a real
// browser: they browse the storefront, follow its Subscribe to the
// portal, sign in with the identity provider, take the free plan, get a
// key shown once, call the service through the gateway with it, and see
// the call on their dashboard.
func TestBrowserSelfServiceWalk(t *testing.T) {
	ctx := newBrowser(t)
	idp := newTestIdP(t, nil, "", "")
	startShop(t, oidcOptions(idp, siteBase, ""))

	step(t, ctx, "the storefront's page of echo", chromedp.Navigate(siteBase+"/store/services/echo"),
		chromedp.WaitVisible(chromedp.CSS(`a.cta[href="/portal/plans/echo"]`)))
	click := func(what string, sel chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := chromedp.Run(c, chromedp.WaitEvent(cdppage.LoadEventFired, nil, sel)); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// Not signed in yet: the portal asks for that first.
	click("Subscribe on the storefront", chromedp.Click(chromedp.CSS(`a.cta[href="/portal/plans/echo"]`)))
	step(t, ctx, "the sign-in page", chromedp.WaitVisible(chromedp.CSS(`a[href="/portal/oidc/start"]`)))
	click("sign in with the provider", chromedp.Click(chromedp.CSS(`a[href="/portal/oidc/start"]`)))
	// Signed in, the caller is back on the plans they chose.
	step(t, ctx, "the plans page", chromedp.WaitVisible(chromedp.CSS(`#plan-basic form button`)))
	checkPage(t, ctx, "the plans page")
	shot(t, ctx, "plans")
	submit(t, ctx, "subscribe to the free plan", `#plan-basic form button[type=submit]`)
	step(t, ctx, "the new key", chromedp.WaitVisible(chromedp.ID("newkey")))
	checkPage(t, ctx, "the plans page with the new key")
	shot(t, ctx, "plans-subscribed")
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	key, err := chromedp.Run(c, chromedp.Value(chromedp.ID("newkey")))
	cancel()
	if err != nil || !strings.HasPrefix(key, "psk_") {
		t.Fatalf("the new key %q: %v", key, err)
	}
	// The first period ends a month on, not as it starts.
	today := time.Now().UTC().Format("2 Jan 2006")
	if doc := html(t, ctx); !strings.Contains(doc, "You are subscribed to Echo") || !strings.Contains(doc, "Your plan.") ||
		!strings.Contains(doc, "this period ends ") || strings.Contains(doc, "this period ends "+today) {
		t.Errorf("the plans page after subscribing:\n%s", doc)
	}
	click("the plans page again", chromedp.Reload())
	if doc := html(t, ctx); strings.Contains(doc, key) {
		t.Error("the key is shown a second time")
	}

	st, reqID := invoke(t, key)
	if st != 200 || reqID == "" {
		t.Fatalf("a call with the new key: %d %q", st, reqID)
	}
	click("the dashboard", chromedp.Navigate(siteBase+"/portal/"))
	step(t, ctx, "the dashboard", chromedp.WaitVisible(chromedp.ID("subscriptions")))
	doc := html(t, ctx)
	for _, want := range []string{reqID, "jane.doe@example.com", "echo"} {
		if !strings.Contains(doc, want) {
			t.Errorf("the dashboard lacks %q", want)
		}
	}
}
