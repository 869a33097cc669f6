package console

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/chromedp/chromedp"

	"github.com/platformgw/gateway/internal/browsertest"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// TestConsoleRevenueNotGrantedInBrowser: the Revenue page's "Top-ups paid,
// not granted" table, as an operator reads it. Without such a top-up the
// page has no table and no heading for it. With two (one whose amount,
// a long pack name, a long reason and a long PaymentIntent id were kept,
// one from before the amount was kept), on a 390 x 844 phone as at
// 1280 px: the page is no wider than the screen, the table no wider than
// the page, the long id, pack, user and reason wrap inside their cell,
// and the amount and what went back read with their currency ("10.00
// USD", "4.00 USD"), each amount on the page on one line with it.
// With SCREENSHOTS_DIR set it saves console-revenue-notgranted.png and
// console-revenue-notgranted-phone.png, which docs/console.md links.
func TestConsoleRevenueNotGrantedInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	e, st := moneyEnv(t)
	seedPayments(t, e, st)
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	w := &world{env: e, url: consoleServer(t, h), now: moneyNow}

	// The empty case: no table, no heading.
	w.open(t, ctx, "/revenue", "#revenue-totals")
	if n := eval[int](t, ctx, `document.querySelectorAll("#not-granted, #notgranted-title").length`); n != 0 {
		t.Errorf("with no top-up paid and not granted the page shows %d of its table and heading", n)
	}

	pay := st.(store.Payments)
	put := func(id string, v payments.IgnoredTopUp) {
		t.Helper()
		b, _ := json.Marshal(v)
		if err := pay.PutPaymentRecord(context.Background(), payments.KindTopUpIgnored, id, b, moneyNow); err != nil {
			t.Fatal(err)
		}
	}
	paid := time.Date(2026, 11, 4, 9, 0, 0, 0, time.UTC)
	const longID = "pi_3QxYzLongPaymentIntentIdentifier0123456789abcdefABCDEF0123"
	const longPack = "enterprise_annual_prepaid_credits_bundle_2026"
	put(longID, payments.IgnoredTopUp{ID: longID, SessionID: "cs_test_a1", At: paid, PaidAt: paid,
		Reason: `the session names pack "` + longPack + `", which pre/credits does not have (packs: ten, big, yen); metadata platform_pack=` + longPack,
		UserID: "google-oauth2|112233445566778899001122", ServiceID: "pre", ProductID: "credits", Pack: longPack, Amount: 1000, Currency: "USD", Refunded: 400})
	put("pi_old", payments.IgnoredTopUp{ID: "pi_old", SessionID: "cs_old", Reason: "old reason", At: paid})

	// 920 px: the narrowest this table is still a table (below 900 px
	// it is stacked rows, as all are on a phone), with the least room per
	// column; 660 px: a page that is still wide, its other tables not
	// stacked.
	for _, size := range []struct {
		width, height int64
		shot          string
	}{{1280, 900, "console-revenue-notgranted"}, {920, 900, ""}, {660, 900, ""}, {390, 844, "console-revenue-notgranted-phone"}} {
		do(t, ctx, "viewport", chromedp.EmulateViewport(size.width, size.height))
		w.open(t, ctx, "/revenue", "#not-granted")
		if wide := eval[int](t, ctx, `document.documentElement.scrollWidth`); wide > int(size.width) {
			t.Errorf("the Revenue page with a top-up not granted at %d px is %d px wide", size.width, wide)
		}
		// The table and each of its cells stay within the page's main
		// column: nothing is cut off at its right edge.
		over := eval[[]string](t, ctx, `(() => { const main = document.querySelector("main").getBoundingClientRect();
			const pad = parseFloat(getComputedStyle(document.querySelector("main")).paddingRight);
			return [document.querySelector("#not-granted"), ...document.querySelectorAll("#not-granted td, #not-granted td code")].filter(e => {
				const r = e.getBoundingClientRect();
				return r.right > main.right - pad + 0.5 || e.scrollWidth > e.clientWidth + 1;
			}).map(e => e.outerHTML.slice(0, 80)) })()`)
		if len(over) > 0 {
			t.Errorf("at %d px, past the page's edge: %q", size.width, over)
		}
		rows := texts(t, ctx, "#not-granted tbody tr")
		if len(rows) != 2 {
			t.Fatalf("at %d px the not granted rows are %q", size.width, rows)
		}
		amount := texts(t, ctx, `#not-granted tbody tr:first-child td[data-label="Amount"]`)
		back := texts(t, ctx, `#not-granted tbody tr:first-child td[data-label="Refunded or disputed"]`)
		if len(amount) != 1 || !strings.Contains(amount[0], "10.00 USD") || len(back) != 1 || !strings.Contains(back[0], "4.00 USD") {
			t.Errorf("at %d px the amount reads %q and what went back %q, want 10.00 USD and 4.00 USD", size.width, amount, back)
		}
		if !strings.Contains(rows[0], longID) || !strings.Contains(rows[1], "not recorded: see Stripe") {
			t.Errorf("at %d px the rows read %q", size.width, rows)
		}
		// The long id wraps: its code is on more than one line, not one
		// line scrolled or cut.
		if lines := eval[int](t, ctx, `document.querySelector("#not-granted tbody tr:first-child code").getClientRects().length`); lines < 2 && size.width < 640 {
			t.Errorf("at %d px the long Stripe id is on %d line", size.width, lines)
		}
		// Every amount on the page reads on one line with its currency,
		// never "31.00" above "USD".
		split := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("#revenue-totals td.num, #not-granted td.num")).filter(e => /^\S+ [A-Z]{3}$/.test(e.textContent.trim())).filter(e => {
			const r = document.createRange(); r.selectNodeContents(e);
			return new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top))).size > 1;
		}).map(e => e.textContent)`)
		if len(split) > 0 {
			t.Errorf("at %d px amounts split from their currency: %q", size.width, split)
		}
		if size.shot != "" {
			browsertest.Screenshot(t, ctx, size.shot)
		}
	}
}

// TestConsoleRevenueResolveInBrowser: marking a top-up paid and not
// granted resolved, as an operator does it, on a 1280 px screen and on
// a 390 x 844 phone. Each open row has a "Mark resolved…" button, on one
// line and within the page; it leads to a confirmation with a note field
// no wider than the page; its button brings the Revenue page back saying
// the top-up was marked, the row gone from the open list and in the
// collapsed resolved list, which opens to a table within the page that
// says who marked it, when and the note. With every one marked, the page
// says none is open. With SCREENSHOTS_DIR set it saves
// console-revenue-resolve-*.png.
func TestConsoleRevenueResolveInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	e, st := moneyEnv(t)
	seedPayments(t, e, st)
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	w := &world{env: e, url: consoleServer(t, h), now: moneyNow}
	pay := st.(store.Payments)
	put := func(id string, v payments.IgnoredTopUp) {
		t.Helper()
		b, _ := json.Marshal(v)
		if err := pay.PutPaymentRecord(context.Background(), payments.KindTopUpIgnored, id, b, moneyNow); err != nil {
			t.Fatal(err)
		}
	}
	paid := time.Date(2026, 11, 4, 9, 0, 0, 0, time.UTC)
	const longID = "pi_3QxYzLongPaymentIntentIdentifier0123456789abcdefABCDEF0123"
	put(longID, payments.IgnoredTopUp{ID: longID, SessionID: "cs_test_a1", At: paid, PaidAt: paid, Reason: `the session names pack "retired", which pre/credits does not have`,
		UserID: "google-oauth2|112233445566778899001122", ServiceID: "pre", ProductID: "credits", Pack: "retired", Amount: 1000, Currency: "USD"})
	put("pi_old", payments.IgnoredTopUp{ID: "pi_old", SessionID: "cs_old", Reason: "old reason", At: paid})
	// within lists the elements of sel that pass the right edge of the
	// page's main column or whose content is wider than they are.
	within := func(size int64, sel string) {
		t.Helper()
		if wide := eval[int](t, ctx, `document.documentElement.scrollWidth`); wide > int(size) {
			t.Errorf("at %d px the page is %d px wide", size, wide)
		}
		over := eval[[]string](t, ctx, `(() => { const main = document.querySelector("main").getBoundingClientRect();
			const pad = parseFloat(getComputedStyle(document.querySelector("main")).paddingRight);
			return Array.from(document.querySelectorAll(`+jsString(sel)+`)).filter(e => {
				const r = e.getBoundingClientRect();
				return r.right > main.right - pad + 0.5 || e.scrollWidth > e.clientWidth + 1;
			}).map(e => e.outerHTML.slice(0, 80)) })()`)
		if len(over) > 0 {
			t.Errorf("at %d px, past the page's edge: %q", size, over)
		}
	}
	notes := []string{"refunded in Stripe", "granted by hand"}
	for i, size := range []struct {
		width, height int64
		shot          string
	}{{1280, 900, "console-revenue-resolve"}, {390, 844, "console-revenue-resolve-phone"}} {
		do(t, ctx, "viewport", chromedp.EmulateViewport(size.width, size.height))
		w.open(t, ctx, "/revenue", "#not-granted")
		rows := texts(t, ctx, "#not-granted tbody tr")
		if len(rows) != 2-i {
			t.Fatalf("at %d px the open rows are %q", size.width, rows)
		}
		within(size.width, "#not-granted, #not-granted td, #not-granted a.button")
		if lines := eval[int](t, ctx, `(() => { const r = document.createRange(); r.selectNodeContents(document.querySelector("#not-granted a.button"));
			return new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top))).size })()`); lines != 1 {
			t.Errorf("at %d px the button reads on %d lines", size.width, lines)
		}
		do(t, ctx, "mark resolved", chromedp.Click(chromedp.CSS(`#not-granted tbody tr:first-child a.button`)), chromedp.WaitVisible(chromedp.CSS("#confirm-note")))
		if q := text(t, ctx, "#confirm p strong"); !strings.Contains(q, "resolved?") {
			t.Errorf("at %d px the confirmation asks %q", size.width, q)
		}
		within(size.width, "#confirm, #confirm-note, #confirm-form button")
		browsertest.Screenshot(t, ctx, size.shot+"-confirm")
		do(t, ctx, "note", chromedp.SendKeys(chromedp.CSS("#confirm-note"), notes[i]))
		do(t, ctx, "confirm", chromedp.Click(chromedp.CSS("#confirm-form button")), chromedp.WaitVisible(chromedp.CSS("#done")))
		if done := text(t, ctx, "#done"); !strings.Contains(done, "marked resolved") {
			t.Errorf("at %d px the page says %q after the mark", size.width, done)
		}
		if open := eval[bool](t, ctx, `document.querySelector("#notgranted-resolved").open`); open {
			t.Errorf("at %d px the resolved list is open before it is asked for", size.width)
		}
		do(t, ctx, "open resolved", chromedp.Click(chromedp.CSS("#notgranted-resolved summary")), chromedp.WaitVisible(chromedp.CSS("#not-granted-resolved")))
		resolved := texts(t, ctx, "#not-granted-resolved tbody tr")
		if len(resolved) != i+1 || !strings.Contains(strings.Join(resolved, " | "), notes[i]) || !strings.Contains(resolved[0], "console:"+testOperator) {
			t.Errorf("at %d px the resolved rows are %q", size.width, resolved)
		}
		within(size.width, "#notgranted-resolved, #not-granted-resolved td, #not-granted-resolved td code")
		browsertest.Screenshot(t, ctx, size.shot)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("#not-granted").length`); n != 0 || !strings.Contains(text(t, ctx, "#not-granted-none"), "None is open") {
		t.Errorf("with every one marked the page shows %d open tables and %q", n, text(t, ctx, "#not-granted-none"))
	}
}
