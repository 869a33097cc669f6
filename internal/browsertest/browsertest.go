// Package browsertest runs Debian's chromium headless for tests, driven
// through github.com/chromedp/chromedp: a fresh profile per test, no
// sandbox (tests run as root in CI containers), and nothing that talks to
// the network on its own (background networking, component updates,
// sync). Tests that need a browser call New; without chromium they skip,
// unless BROWSER_TESTS=1 demands it (CI sets it after installing it).
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// SetHeaders sends headers with every request the tab makes from now on
// (an Authorization header signs a test in to basic_auth, as the browser
// would after its login prompt, which headless chromium cannot show).
func SetHeaders(t testing.TB, ctx context.Context, headers map[string]string) {
	t.Helper()
	h := network.Headers{}
	for k, v := range headers {
		h[k] = v
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("enable network: %v", err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: h}); err != nil {
		t.Fatalf("set headers: %v", err)
	}
}

// DefaultPath is where Debian's chromium package installs the browser.
const DefaultPath = "/usr/bin/chromium"

// Path is the browser to run: $CHROMIUM, or DefaultPath.
func Path() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	return DefaultPath
}

// New starts a headless chromium for t and returns a context of a fresh
// tab in it; the browser is stopped when the test ends. timeout bounds
// everything run in the context.
func New(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	path := Path()
	if _, err := exec.LookPath(path); err != nil {
		if os.Getenv("BROWSER_TESTS") == "1" {
			t.Fatalf("BROWSER_TESTS=1 but no chromium at %s: %v", path, err)
		}
		t.Skipf("no chromium at %s (apt-get install chromium, or set CHROMIUM)", path)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(filepath.Join(t.TempDir(), "profile")),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	ctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	t.Cleanup(func() {
		cancelTimeout()
		cancelTab()
		cancelAlloc()
	})
	// Start the browser now, so a browser that cannot start fails here.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// Screenshot saves a full-page PNG of the current page to
// $SCREENSHOTS_DIR/name.png (quality 100 is PNG; below, chromium sends JPEG) when SCREENSHOTS_DIR is set (make screenshots
// sets it); otherwise it does nothing.
func Screenshot(t testing.TB, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("SCREENSHOTS_DIR")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}
