package portal

import (
	"context"
	"strings"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/platformgw/gateway/internal/store"
)

// TestBrowserOIDCSignIn: in a real browser a caller who has no key
// signs in at the identity provider (the in-test provider on loopback),
// comes back signed in through the provider's redirect and the portal's
// own page (the session cookie is SameSite=Strict), sees an empty
// dashboard that says so, makes a key, and once the operator subscribes
// them, calls the gateway with it.
func TestBrowserOIDCSignIn(t *testing.T) {
	ctx := newBrowser(t)
	idp := newTestIdP(t, nil, "", "")
	e := start(t, oidcOptions(idp, siteBase, ""))

	step(t, ctx, "open the portal", chromedp.Navigate(siteBase+"/portal/"),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/portal/oidc/start"]`)))
	checkPage(t, ctx, "the sign-in page with a provider")
	shot(t, ctx, "signin-oidc")
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := chromedp.Run(c, chromedp.WaitEvent(cdppage.LoadEventFired, nil,
		chromedp.Click(chromedp.CSS(`a[href="/portal/oidc/start"]`))))
	cancel()
	if err != nil {
		t.Fatalf("sign in with the provider: %v", err)
	}
	step(t, ctx, "the dashboard", chromedp.WaitVisible(chromedp.ID("subscriptions")))
	doc := html(t, ctx)
	for _, want := range []string{"jane.doe@example.com", "You have no subscriptions yet."} {
		if !strings.Contains(doc, want) {
			t.Errorf("the dashboard lacks %q:\n%s", want, doc)
		}
	}
	checkPage(t, ctx, "the dashboard of a caller signed in with the provider")
	shot(t, ctx, "dashboard-oidc")

	step(t, ctx, "label", chromedp.SendKeys(chromedp.ID("label"), "first key"))
	submit(t, ctx, "create a key", `form[action="/portal/keys"] button[type=submit]`)
	step(t, ctx, "the new key", chromedp.WaitVisible(chromedp.ID("newkey")))
	c, cancel = context.WithTimeout(ctx, 30*time.Second)
	newKey, err := chromedp.Run(c, chromedp.Value(chromedp.ID("newkey")))
	cancel()
	if err != nil || !strings.HasPrefix(newKey, "psk_") {
		t.Fatalf("the new key %q: %v", newKey, err)
	}
	if _, err := e.store().PutSubscription(context.Background(), store.Subscription{
		UserID: "jane.doe@example.com", ServiceID: "echo", ProductID: "basic", Status: "ACTIVE", UpdatedAt: time.Now().UTC(),
	}); err != nil {
		t.Fatal(err)
	}
	if st, _ := invoke(t, newKey); st != 200 {
		t.Fatalf("the new key at the gateway: %d", st)
	}

	submit(t, ctx, "sign out", "form.signout button")
	step(t, ctx, "signed out", chromedp.WaitVisible(chromedp.ID("key")))
}
