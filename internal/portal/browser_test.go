package portal

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// chromiumPath is Debian's chromium, which .ci/run installs.
const chromiumPath = "/usr/bin/chromium"

// screenshotsEnv names the variable that makes the browser test write the
// screenshots of docs/portal.md (docs/img/portal-*.png).
const screenshotsEnv = "PORTAL_SCREENSHOTS"

// newBrowser starts headless chromium with a profile of its own and
// returns a tab's context. It is skipped where chromium is not installed.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("BROWSER_TESTS") == "1" { // .ci/run: the browser tests must run
			t.Fatalf("BROWSER_TESTS=1 but no %s: %v", chromiumPath, err)
		}
		t.Skipf("no %s: %v", chromiumPath, err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first Run starts the browser; it must not carry a timeout.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// step runs actions with a time limit so a stuck page fails the test
// instead of hanging it.
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(c, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// submit clicks a button and waits for the page it loads.
func submit(t *testing.T, ctx context.Context, what string, button chromedp.CSS) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(c, chromedp.WaitEvent(cdppage.LoadEventFired, nil, chromedp.Click(button))); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func html(t *testing.T, ctx context.Context) string {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(c, chromedp.OuterHTML(chromedp.CSS("html")))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// shot writes portal-<name>.png into $SCREENSHOTS_DIR when it is set
// (make screenshots), else into docs/img when PORTAL_SCREENSHOTS is set.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("SCREENSHOTS_DIR")
	if dir == "" && os.Getenv(screenshotsEnv) != "" {
		dir = filepath.Join("..", "..", "docs", "img")
	}
	if dir == "" {
		return
	}
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "portal-"+name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

// signInBrowser types key into the sign-in form of a fresh page.
func signInBrowser(t *testing.T, ctx context.Context, key string, screenshot bool) {
	t.Helper()
	step(t, ctx, "open the portal", chromedp.Navigate(siteBase+"/portal/"), chromedp.WaitVisible(chromedp.ID("key")))
	checkPage(t, ctx, "the sign-in page")
	if screenshot {
		shot(t, ctx, "signin")
	}
	// By keyboard only: type the key and press Enter.
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(c, chromedp.WaitEvent(cdppage.LoadEventFired, nil, chromedp.SendKeys(chromedp.ID("key"), key+"\r"))); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	step(t, ctx, "the dashboard", chromedp.WaitVisible(chromedp.ID("subscriptions")))
}

// checkPage checks, in the browser, that the stylesheet applied under the
// page's Content-Security-Policy, that every control has a name a
// screen reader can say (a label, an aria-label or its text), and that
// no script but the portal's copy.js is on the page.
func checkPage(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	bg, err := chromedp.Run(c, chromedp.Evaluate[string](`getComputedStyle(document.body).backgroundColor`))
	if err != nil || bg != "rgb(245, 246, 248)" {
		t.Errorf("%s: the stylesheet did not apply (body background %q, %v)", what, bg, err)
	}
	unnamed, err := chromedp.Run(c, chromedp.Evaluate[[]string](`[...document.querySelectorAll('input:not([type=hidden]), button, meter, svg')]
		.filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
		.map(e => e.outerHTML.slice(0, 80))`))
	if err != nil {
		t.Fatal(err)
	}
	if len(unnamed) > 0 {
		t.Errorf("%s: controls without an accessible name: %q", what, unnamed)
	}
	// No inline script: at most the portal's own copy.js, by its src.
	scripts, err := chromedp.Run(c, chromedp.Evaluate[[]string](`[...document.scripts].filter(s => !s.src.endsWith('/portal/assets/copy.js') || s.textContent.trim()).map(s => s.outerHTML.slice(0, 80))`))
	if err != nil || len(scripts) != 0 {
		t.Errorf("%s: scripts other than assets/copy.js: %q (%v)", what, scripts, err)
	}
}

// TestBrowserCallerFlow: in a real browser, a caller signs in with a key,
// sees their own usage after a real call through the gateway and none of
// another user's, creates a key (shown once) that then works at the
// gateway, and revokes it.
func TestBrowserCallerFlow(t *testing.T) {
	ctx := newBrowser(t)
	e := start(t, "sign_in_limit 1000\nallow_key_management")
	aliceKey, aliceRec := e.user("alice", "basic")
	bobKey, bobRec := e.user("bob", "capped")
	st, aliceReq := invoke(t, aliceKey)
	if st != 200 {
		t.Fatalf("alice's call: %d", st)
	}
	if st, _ := invoke(t, aliceKey); st != 200 {
		t.Fatalf("alice's second call: %d", st)
	}
	st, bobReq := invoke(t, bobKey)
	if st != 200 {
		t.Fatalf("bob's call: %d", st)
	}
	aliceJob := e.job("alice", "FAILED", "the backend timed out")
	bobJob := e.job("bob", "RUNNING", "")

	signInBrowser(t, ctx, aliceKey, true)
	doc := html(t, ctx)
	for _, want := range []string{aliceRec.ID, aliceReq, aliceJob.ID, "Used this period", "98 left"} {
		if !strings.Contains(doc, want) {
			t.Errorf("alice's dashboard lacks %q", want)
		}
	}
	for _, leak := range []string{"bob", bobRec.ID, bobReq, bobJob.ID, aliceKey} {
		if strings.Contains(doc, leak) {
			t.Errorf("alice's dashboard shows %q", leak)
		}
	}
	checkPage(t, ctx, "the dashboard")
	shot(t, ctx, "dashboard")

	// Another user's job by URL: not found, nothing of it shown.
	step(t, ctx, "bob's job", chromedp.Navigate(siteBase+"/portal/jobs/"+url.PathEscape(bobJob.ID)), chromedp.WaitVisible(chromedp.CSS("h1")))
	if doc := html(t, ctx); !strings.Contains(doc, "No such job") || strings.Contains(doc, "bob") {
		t.Errorf("bob's job through alice's session:\n%s", doc)
	}
	step(t, ctx, "alice's job", chromedp.Navigate(siteBase+"/portal/jobs/"+url.PathEscape(aliceJob.ID)), chromedp.WaitVisible(chromedp.CSS("dl.figures")))
	checkPage(t, ctx, "a job")
	shot(t, ctx, "job")

	// Create a key: shown once, works at the gateway.
	step(t, ctx, "back", chromedp.Navigate(siteBase+"/portal/#keys"), chromedp.WaitVisible(chromedp.ID("label")))
	step(t, ctx, "label", chromedp.SendKeys(chromedp.ID("label"), "laptop"))
	submit(t, ctx, "create a key", `form[action="/portal/keys"] button[type=submit]`)
	step(t, ctx, "the new key", chromedp.WaitVisible(chromedp.ID("newkey")))
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	newKey, err := chromedp.Run(c, chromedp.Value(chromedp.ID("newkey")))
	cancel()
	if err != nil || !strings.HasPrefix(newKey, "psk_") {
		t.Fatalf("the new key %q: %v", newKey, err)
	}
	checkPage(t, ctx, "the new key")
	shot(t, ctx, "newkey")
	if st, _ := invoke(t, newKey); st != 200 {
		t.Fatalf("the new key at the gateway: %d", st)
	}
	keys, _ := e.store().ListKeys(context.Background(), "alice")
	var newID string
	for _, k := range keys {
		if k.ID != aliceRec.ID {
			newID = k.ID
		}
	}
	step(t, ctx, "reload", chromedp.Navigate(siteBase+"/portal/"), chromedp.WaitVisible(chromedp.ID("keys")))
	if doc := html(t, ctx); strings.Contains(doc, newKey) {
		t.Error("the new key is shown again")
	}

	// Revoke it, in two steps: the gateway refuses it from then on.
	submit(t, ctx, "revoke", chromedp.CSS(`a[aria-label="Revoke key `+newID+`"]`))
	step(t, ctx, "the confirmation", chromedp.WaitVisible(chromedp.CSS("form.actions")))
	if k := e.keyByID(newID); !k.RevokedAt.IsZero() {
		t.Fatal("the key was revoked before the confirmation")
	}
	submit(t, ctx, "confirm", chromedp.CSS(`form.actions button[type=submit]`))
	step(t, ctx, "revoked", chromedp.WaitVisible(chromedp.CSS("p.notice")))
	if k := e.keyByID(newID); k.RevokedAt.IsZero() {
		t.Fatal("the key is not revoked")
	}
	if st, _ := invoke(t, newKey); st != 401 {
		t.Errorf("the revoked key at the gateway: %d", st)
	}

	// Sign out; the dashboard is gone.
	submit(t, ctx, "sign out", "form.signout button")
	step(t, ctx, "signed out", chromedp.WaitVisible(chromedp.ID("key")))
	if doc := html(t, ctx); strings.Contains(doc, aliceRec.ID) {
		t.Error("alice's keys after sign-out")
	}
}

// TestBrowserKeyManagementOff: with the default config the caller sees
// their keys but no form to create or revoke one.
func TestBrowserKeyManagementOff(t *testing.T) {
	ctx := newBrowser(t)
	e := start(t, "sign_in_limit 1000")
	key, rec := e.user("carol", "capped")
	if st, _ := invoke(t, key); st != 200 {
		t.Fatalf("carol's call: %d", st)
	}
	signInBrowser(t, ctx, key, false)
	doc := html(t, ctx)
	if !strings.Contains(doc, rec.ID) || !strings.Contains(doc, "Your operator manages keys") {
		t.Error("carol's keys are not listed")
	}
	if strings.Contains(doc, "Create key") || strings.Contains(doc, "Revoke") {
		t.Error("key forms shown with key management off")
	}
	shot(t, ctx, "keys-off")
}
