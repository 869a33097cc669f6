package console

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/chromedp/chromedp"

	"github.com/platformgw/gateway/internal/browsertest"
	"github.com/platformgw/gateway/internal/payments"
)

// TestConsoleRevenueInBrowser: the Revenue page with payments configured
// (moneyEnv's usage and seedPayments' records) fits a 390 x 844 phone as
// it fits 1280 px, shows each currency's row with its amounts, the
// negative balance red, the past due subscriptions red before amber in
// their colours, and its range form within reach. With SCREENSHOTS_DIR
// set it saves console-revenue.png and console-revenue-phone.png, which
// docs/console.md shows.
func TestConsoleRevenueInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	e, st := moneyEnv(t)
	seedPayments(t, e, st)
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	w := &world{env: e, url: consoleServer(t, h), now: moneyNow}
	for _, size := range []struct {
		width, height int64
		suffix        string
	}{{1280, 900, ""}, {390, 844, "-phone"}} {
		do(t, ctx, "viewport", chromedp.EmulateViewport(size.width, size.height))
		w.open(t, ctx, "/revenue", "#revenue-totals")
		if wide := eval[int](t, ctx, `document.documentElement.scrollWidth`); wide > int(size.width) {
			t.Errorf("the Revenue page at %d px is %d px wide", size.width, wide)
		}
		out := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("main button, main input, main a")).filter(e => {
			const r = e.getBoundingClientRect();
			return r.width === 0 || r.left < 0 || r.right > document.documentElement.clientWidth;
		}).map(e => e.outerHTML.slice(0, 80))`)
		if len(out) > 0 {
			t.Errorf("at %d px: out of reach %q", size.width, out)
		}
		rows := texts(t, ctx, "#revenue-totals tbody tr")
		if len(rows) != 4 || !strings.Contains(rows[1], "700 JPY") || !strings.Contains(rows[2], "1.125 KWD") {
			t.Errorf("at %d px the totals are %q", size.width, rows)
		}
		colours := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("#past-due li > span")).map(s => getComputedStyle(s).color)`)
		if strings.Join(colours, "|") != "rgb(164, 0, 0)|rgb(164, 0, 0)|rgb(138, 82, 0)" {
			t.Errorf("past due colours %q, want red, red, amber", colours)
		}
		if c := eval[string](t, ctx, `getComputedStyle(document.querySelector("#owed td.level-red")).color`); c != "rgb(164, 0, 0)" {
			t.Errorf("the negative balance is %s, want red", c)
		}
		browsertest.Screenshot(t, ctx, "console-revenue"+size.suffix)
	}
	// The range form: two months, each with its row.
	do(t, ctx, "range", chromedp.SetValue(chromedp.CSS("#r-from"), "2026-10"), chromedp.SetValue(chromedp.CSS("#r-to"), "2026-11"),
		chromedp.Click(chromedp.CSS("#revenue-range button")), chromedp.WaitVisible(chromedp.CSS("#revenue-months")))
	if months := texts(t, ctx, "#revenue-months tbody tr td:first-child"); len(months) < 2 || !strings.Contains(months[0], "October 2026") {
		t.Errorf("months %q", months)
	}
}
