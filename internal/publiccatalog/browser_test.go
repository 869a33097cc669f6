package publiccatalog

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/browsertest"
	"github.com/platformgw/gateway/internal/wire"
)

// TestDocsOnAPhoneInBrowser: a service's API reference read on a 390 x 844
// phone is no wider than the screen: the responses table, whose
// descriptions hold error codes as single long words
// ("time_unit_invocation_not_allowed"), wraps them instead of pushing the
// page sideways, and so do the parameters and the curl line. With
// SCREENSHOTS_DIR set it saves catalog-docs-phone.png.
func TestDocsOnAPhoneInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	h := &Handler{StorefrontURL: "/store"}
	if err := h.setup(testCatalog(t), DocOptions{Options: Options{GatewayPrefix: "/api"}, Headers: wire.NewHeaders("Platform")}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeHTTP(w, r, nil); err != nil {
			t.Error(err)
		}
	}))
	defer srv.Close()
	if _, err := chromedp.Run(ctx, chromedp.EmulateViewport(390, 844)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/services/weather/docs"), chromedp.WaitVisible(chromedp.CSS(".op table"))); err != nil {
		t.Fatal(err)
	}
	wide, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
	if err != nil {
		t.Fatal(err)
	}
	if wide > 390 {
		t.Errorf("the reference is %d px wide on a 390 px phone", wide)
	}
	out, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("nav, table, pre, .op")].filter(e =>
		e.getBoundingClientRect().right > document.documentElement.clientWidth + 1).map(e => e.tagName + " " + e.textContent.slice(0, 60))`))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) > 0 {
		t.Errorf("past the right edge of the screen: %q", out)
	}
	// The headings stay whole words ("Status", not "Sta" over "tus").
	broken, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("th")].filter(e =>
		e.getBoundingClientRect().height > 2.2 * parseFloat(getComputedStyle(e).fontSize) + 12).map(e => e.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	if len(broken) > 0 {
		t.Errorf("table headings broken over lines: %q", broken)
	}
	browsertest.Screenshot(t, ctx, "catalog-docs-phone")
}
