package console

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/platformgw/gateway/internal/browsertest"
)

// consolePages are every page of the console, with an element that
// shows it is rendered and the name of its screenshot.
var consolePages = []struct{ path, sel, name string }{
	{"/", "#attention", "console-overview"},
	{"/services", "#svc-weather", "console-services"},
	{"/users", "#users", "console-users"},
	{"/users/alice", "#subscriptions", "console-user"},
	{"/users/alicee", "#no-user", "console-no-user"},
	{"/usage?group=endpoint", "#usage-chart", "console-usage"},
	{"/jobs", "#jobs", "console-jobs"},
	{"/jobs/job-1", "#job-result", "console-job"},
	{"/jobs/job-3", "#job-error", "console-job-failed"},
	{"/alerts", "#alerts", "console-alerts"},
	{"/revenue", "#not-configured", "console-revenue-unconfigured"},
	{"/audit", "#audit", "console-audit"},
	{"/users/bob/revoke?keyId=", "#confirm", "console-confirm"},
	{"/usage?from=nonsense&user=alice", "#filter-error", "console-usage-bad-filter"},
	{"/jobs/job-9", ".error", "console-error"},
}

// TestConsolePhonesInBrowser: on a 390 x 844 phone no console page is
// wider than the screen (tables become stacked rows, long results and
// ids wrap or scroll inside their box), and every action (each form's
// button, each link styled as one) lies within it. With SCREENSHOTS_DIR
// set it saves each page at 1280 px (console-<page>.png) and at 390 px
// (console-<page>-phone.png), the images docs/console.md shows.
func TestConsolePhonesInBrowser(t *testing.T) {
	ctx := browsertest.New(t, 2*time.Minute)
	w := newWorld(t)
	keys, err := w.rt.Store().ListKeys(t.Context(), "bob")
	if err != nil || len(keys) == 0 {
		t.Fatal(keys, err)
	}
	for _, size := range []struct {
		width, height int64
		suffix        string
	}{{1280, 900, ""}, {390, 844, "-phone"}} {
		do(t, ctx, "viewport", chromedp.EmulateViewport(size.width, size.height))
		for _, p := range consolePages {
			path := p.path
			if p.name == "console-confirm" {
				path += keys[0].ID
			}
			w.open(t, ctx, path, p.sel)
			if wide := eval[int](t, ctx, `document.documentElement.scrollWidth`); wide > int(size.width) {
				t.Errorf("%s at %d px is %d px wide", p.path, size.width, wide)
			}
			out := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("main button, main a.button, main input, main select")).filter(e => {
				const r = e.getBoundingClientRect();
				return e.type !== "hidden" && (r.width === 0 || r.left < 0 || r.right > document.documentElement.clientWidth);
			}).map(e => e.outerHTML.slice(0, 80))`)
			if len(out) > 0 {
				t.Errorf("%s at %d px: controls out of reach %q", p.path, size.width, out)
			}
			// A chart's words (the time labels under it, the value
			// ticks, the measure's name) never print over each other.
			overlaps := eval[[]string](t, ctx, `(() => { const out = [];
				for (const svg of document.querySelectorAll("svg.chart")) {
					const ts = [...svg.querySelectorAll("text")].filter(e => getComputedStyle(e).display !== "none").map(e => [e.textContent, e.getBoundingClientRect()]);
					for (let i = 0; i < ts.length; i++) for (let j = i + 1; j < ts.length; j++) {
						const a = ts[i][1], b = ts[j][1];
						if (a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5) out.push(ts[i][0] + " / " + ts[j][0]);
					}
				}
				return out })()`)
			if len(overlaps) > 0 {
				t.Errorf("%s at %d px: chart labels over each other: %q", p.path, size.width, overlaps)
			}
			browsertest.Screenshot(t, ctx, p.name+size.suffix)
		}
	}
}
