package console

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/platformgw/gateway/internal/browsertest"
)

// TestConsoleRequestsInBrowser: the access requests page in Chromium, at
// 1280 and 390 px: no wider than the screen, every control in reach;
// Approve sets the subscription through the user page's form and Decline
// empties the list. With SCREENSHOTS_DIR set it saves
// console-requests.png and console-requests-phone.png.
func TestConsoleRequestsInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	w := newWorld(t)
	for _, u := range []string{"erin", "frank"} {
		if err := w.ops.RequestAccess(t.Context(), "portal:"+u, u, "weather", "capped"); err != nil {
			t.Fatal(err)
		}
	}
	for _, size := range []struct {
		width, height int64
		suffix        string
	}{{1280, 900, ""}, {390, 844, "-phone"}} {
		do(t, ctx, "viewport", chromedp.EmulateViewport(size.width, size.height))
		w.open(t, ctx, "/requests", "#requests")
		if wide := eval[int](t, ctx, `document.documentElement.scrollWidth`); wide > int(size.width) {
			t.Errorf("the requests page at %d px is %d px wide", size.width, wide)
		}
		browsertest.Screenshot(t, ctx, "console-requests"+size.suffix)
	}
	do(t, ctx, "viewport", chromedp.EmulateViewport(1280, 900))
	w.open(t, ctx, "/requests", "#requests")
	do(t, ctx, "approve erin", chromedp.Click(chromedp.CSS(`form[action$="/users/erin/subscription"] button`)),
		chromedp.WaitVisible(chromedp.CSS("#subscriptions")))
	if sub, err := w.rt.Store().GetSubscription(t.Context(), "erin", "weather"); err != nil || sub.ProductID != "capped" || sub.Status != "ACTIVE" {
		t.Errorf("erin after approval: %+v %v", sub, err)
	}
	w.open(t, ctx, "/requests", "#requests")
	do(t, ctx, "decline frank", chromedp.Click(chromedp.CSS(`form[action$="/requests/decline"] button`)),
		chromedp.WaitVisible(chromedp.CSS("p.done")))
	if rows := texts(t, ctx, "#requests tbody tr"); len(rows) != 1 || !strings.Contains(rows[0], "No requests are waiting") {
		t.Errorf("after answering both: %q", rows)
	}
}
