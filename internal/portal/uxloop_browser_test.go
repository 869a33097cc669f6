package portal

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"

	_ "github.com/platformgw/gateway/internal/console"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	_ "github.com/platformgw/gateway/internal/publiccatalog"
)

// loopOperator signs in to the console of startLoop's site.
const (
	loopOperator = "operator"
	loopPassword = "correct horse battery staple"
)

// startLoop is the whole marketplace on one site: the storefront, the
// public catalog and its API reference, the portal with an identity
// provider, Stripe (stripe-mock) for the paid plan, the gateway and the
// operator's console behind basic_auth.
func startLoop(t *testing.T, idp *testIdP) (*env, *stripetest.Mock) {
	t.Helper()
	mock := stripetest.Start(t)
	dir := t.TempDir()
	backend := signingBackend(t)
	hash, err := bcrypt.GenerateFromPassword([]byte(loopPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
	platform {
		store %s/platform.db
		public_url %s
		service echo {
			backend %s
			secret %s
			public
			display_name Echo
			description "Says back what it is sent."
			endpoint hello {
				methods GET POST
				path /hello
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 5
				overage block
				display_name Free
				self_service
			}
			product pro {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 10000 per month
				display_name Pro
				currency USD
				period_price 29
				self_service
			}
			product credits {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 0.5
				currency USD
				display_name Credits
			}
		}
		payments stripe {
			secret_key sk_test_portal
			webhook_secret %s
			api_base %s
			past_due_grace 72h
			price echo pro price_pro_usd
		}
	}
}
:%d {
	bind 127.0.0.1
	handle /stripe/webhook {
		platform_stripe_webhook
	}
	handle_path /portal/* {
		platform_portal {
%s
		}
	}
	redir /store /store/
	handle_path /store/* {
		platform_storefront {
			sign_in_url /portal/
			catalog_url /catalog
		}
	}
	handle_path /catalog/* {
		platform_catalog {
			storefront_url /store
		}
	}
	handle_path /console/* {
		basic_auth {
			%s %s
		}
		platform_console {
			prefix /console
		}
	}
	handle {
		platform_usage
		platform_gateway
		reverse_proxy {
			dynamic platform
			transport platform
		}
	}
}
`, adminPort, httpPort, dir, siteBase, backend.URL, echoSecret, payWhsec, mock.URL, httpPort,
		oidcOptions(idp, siteBase, ""), loopOperator, hash)
	unloadOtherStore(filepath.Join(dir, "platform.db"))
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	e := &env{t: t, dir: dir, base: siteBase}
	app := e.app()
	e.rt, e.ops, e.clock = app.Runtime(), app.Ops(), app.SetClock
	return e, mock
}

// consoleErrors collects what the browser reports of a page: errors and
// warnings in its console (a Content-Security-Policy violation among
// them) and uncaught exceptions.
type consoleErrors struct {
	mu   sync.Mutex
	msgs []string
}

func (c *consoleErrors) listen(t *testing.T, ctx context.Context) {
	t.Helper()
	err := chromedp.Listen(ctx, func(ev any) {
		var m string
		switch ev := ev.(type) {
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.EntryLevelError || ev.Entry.Level == cdplog.EntryLevelWarning {
				m = string(ev.Entry.Source) + ": " + ev.Entry.Text + " " + ev.Entry.URL
			}
		case *cdpruntime.EventExceptionThrown:
			m = "exception: " + ev.ExceptionDetails.Text
		case *cdpruntime.EventConsoleAPICalled:
			if ev.Type == cdpruntime.ConsoleAPICalledTypeError || ev.Type == cdpruntime.ConsoleAPICalledTypeWarning {
				m = "console." + string(ev.Type)
			}
		}
		if m != "" {
			c.mu.Lock()
			c.msgs = append(c.msgs, m)
			c.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{call(ctx, cdplog.Enable), call(ctx, cdpruntime.Enable)} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func call(ctx context.Context, cmd cdp.Command[cdp.Empty, cdp.Empty]) error {
	_, err := chromedp.Call(ctx, cmd, cdp.Empty{})
	return err
}

func (c *consoleErrors) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.msgs
	c.msgs = nil
	return out
}

// loopShot saves a full-page screenshot to $UXLOOP_SHOTS when set.
func loopShot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("UXLOOP_SHOTS")
	if dir == "" {
		return
	}
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBrowserMarketplaceLoop walks the whole marketplace as people do,
// at a phone's width and a desktop's: a caller finds the service on the
// storefront, reads its API reference, signs in with the identity
// provider, takes the free plan, calls with the key shown once, sees the
// call and the quota on the dashboard, then takes the paid plan through
// Stripe; the operator sees them in the console. Every page keeps to its
// Content-Security-Policy (nothing refused in the browser's console) and
// fits the screen.
func TestBrowserMarketplaceLoop(t *testing.T) {
	for _, size := range []struct {
		name string
		w, h int64
	}{{"390", phoneWidth, phoneHeight}, {"1280", 1280, 900}} {
		t.Run(size.name, func(t *testing.T) {
			idp := newTestIdP(t, nil, "", "")
			e, mock := startLoop(t, idp)
			ctx := newBrowser(t)
			var errs consoleErrors
			errs.listen(t, ctx)
			step(t, ctx, "viewport", chromedp.EmulateViewport(size.w, size.h))
			page := func(name, path, wait string) {
				t.Helper()
				step(t, ctx, name, chromedp.Navigate(siteBase+path), chromedp.WaitVisible(chromedp.CSS(wait)))
				looked(t, ctx, &errs, name+"-"+size.name, size.w)
			}
			page("store", "/store/", "main")
			page("store-service", "/store/services/echo", "main")
			page("store-missing", "/store/services/nope", "body")
			page("docs", "/catalog/services/echo/docs", "main")
			// From the reference back to the plans, as a person who came
			// to the docs first goes on to buy.
			step(t, ctx, "docs to plans", chromedp.Click(chromedp.CSS(`nav a[href="/store/services/echo"]`)), chromedp.WaitVisible(chromedp.CSS("main")))
			if at := eval[string](t, ctx, `location.pathname`); at != "/store/services/echo" {
				t.Errorf("the reference's plans link led to %s", at)
			}
			page("docs-missing", "/catalog/services/nope/docs", "body")
			page("portal-signin", "/portal/", "#key-help")
			// The help under the key field names the header with an example
			// key, on one line: not "Bearer" at a line's end and "…." alone
			// on the next.
			if help := eval[string](t, ctx, `document.querySelector('#key-help code').textContent`); help != "Authorization: Bearer psk_…" {
				t.Errorf("the key's help shows %q", help)
			}
			if n := eval[int](t, ctx, `document.querySelector('#key-help code').getClientRects().length`); n != 1 {
				t.Errorf("the key's help header is cut over %d lines", n)
			}
			page("portal-plans-signin", "/portal/plans/echo", "body")
			step(t, ctx, "sign in", chromedp.Click(chromedp.CSS(`a[href="/portal/oidc/start"]`)), chromedp.WaitVisible(chromedp.CSS(`#plan-basic form button`)))
			looked(t, ctx, &errs, "portal-plans-"+size.name, size.w)
			submit(t, ctx, "subscribe free", `#plan-basic form button[type=submit]`)
			looked(t, ctx, &errs, "portal-plans-subscribed-"+size.name, size.w)
			key := eval[string](t, ctx, `document.getElementById('newkey').value`)
			for i := 0; i < 6; i++ {
				invoke(t, key)
			}
			page("portal-dashboard", "/portal/", "#subscriptions")
			page("portal-missing-job", "/portal/jobs/job-nope", "body")
			page("portal-billing", "/portal/billing", "body")
			page("portal-plans-index", "/portal/plans/", "main")
			page("portal-missing-page", "/portal/nope", "body")
			page("store-missing-page", "/store/nope/deeper", "body")
			page("portal-export-refused", "/portal/usage.csv?from=2026-11-20&to=2026-11-01", "body")
			page("portal-plans-missing", "/portal/plans/nope", "body")

			// The paid plan: Checkout is made, the browser leaves for
			// Stripe (no network here), Stripe sends the caller back and
			// its events.
			page("portal-plans-again", "/portal/plans/echo", "#plan-pro form button")
			c, cancel := context.WithTimeout(ctx, 30*time.Second)
			chromedp.Run(c, chromedp.Click(chromedp.CSS(`#plan-pro form button[type=submit]`)))
			cancel()
			time.Sleep(time.Second)
			errs.take()
			var cust string
			for _, r := range mock.Requests("/v1/checkout/sessions") {
				cust = r.Form.Get("customer")
			}
			if cust == "" {
				t.Fatal("no Checkout Session")
			}
			page("portal-back-from-checkout", "/portal/plans/echo?m=subscribed", "main")
			t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
			user := "jane.doe@example.com"
			items := map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_1", "object": "subscription_item",
				"price": map[string]any{"id": "price_pro_usd", "object": "price"}, "current_period_end": t0.Add(30 * 24 * time.Hour).Unix()}}}
			meta := map[string]string{"platform_user_id": user, "platform_service_id": "echo", "platform_product_id": "pro"}
			// What Stripe answers when the gateway reads the subscription back.
			mock.Answer("/v1/subscriptions/sub_loop", map[string]any{"status": "active", "customer": cust,
				"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil, "metadata": meta, "items": items})
			payEvent(t, "evt_sub_"+size.name, "customer.subscription.created", t0, map[string]any{"id": "sub_loop", "object": "subscription", "customer": cust, "status": "active",
				"metadata": meta, "items": items})
			payEvent(t, "evt_inv_"+size.name, "invoice.paid", t0.Add(time.Second), map[string]any{"id": "in_loop", "object": "invoice", "customer": cust, "status": "paid",
				"amount_due": 2900, "amount_paid": 2900, "currency": "usd",
				"hosted_invoice_url": "https://invoice.stripe.com/i/in_loop", "invoice_pdf": "https://pay.stripe.com/invoice/in_loop/pdf",
				"status_transitions": map[string]any{"paid_at": t0.Add(time.Second).Unix()},
				"parent":             map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_loop"}}})
			invoke(t, key)
			page("portal-plans-paid", "/portal/plans/echo", "main")
			page("portal-dashboard-paid", "/portal/", "#subscriptions")
			page("portal-billing-paid", "/portal/billing", "main")
			submit(t, ctx, "sign out", `form[action$="signout"] button`)
			looked(t, ctx, &errs, "portal-signed-out-"+size.name, size.w)

			browserAuth(t, ctx)
			page("console-overview", "/console/", "main")
			page("console-services", "/console/services", "main")
			page("console-users", "/console/users", "main")
			page("console-user", "/console/users/"+user, "main")
			step(t, ctx, "credits", chromedp.SendKeys(chromedp.CSS("#cr-amount"), "ten"))
			submit(t, ctx, "add credits", `#credits button`)
			looked(t, ctx, &errs, "console-credits-refused-"+size.name, size.w)
			// Moving a caller who pays through Stripe to another plan asks
			// first, and Cancel leaves them where they were.
			page("console-user-again", "/console/users/"+user, "#sub-echo")
			step(t, ctx, "change the plan", chromedp.SetValue(chromedp.CSS("#sub-echo-product"), "basic"))
			submit(t, ctx, "save the plan", `#sub-echo button`)
			step(t, ctx, "the confirmation", chromedp.WaitVisible(chromedp.CSS("#confirm-form")))
			if q := eval[string](t, ctx, `document.querySelector('main').innerText`); !strings.Contains(q, "Stripe keeps charging them for pro") {
				t.Errorf("the confirmation of a paid plan's change says:\n%s", q)
			}
			looked(t, ctx, &errs, "console-confirm-paid-"+size.name, size.w)
			submit(t, ctx, "cancel", `#cancel`)
			if sub, ok := e.subscriptionTo(user, "echo"); !ok || sub.ProductID != "pro" {
				t.Errorf("after Cancel: %+v", sub)
			}
			page("console-usage", "/console/usage", "main")
			page("console-revenue", "/console/revenue", "main")
			page("console-audit", "/console/audit", "main")
			page("console-missing", "/console/nope", "body")
		})
	}
}

func browserAuth(t *testing.T, ctx context.Context) {
	t.Helper()
	h := network.Headers{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(loopOperator+":"+loopPassword))}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: h}); err != nil {
		t.Fatal(err)
	}
}

// looked checks the page in the browser the way a person would notice:
// nothing refused or failing in the console, nothing wider than the
// screen; it saves a screenshot.
func looked(t *testing.T, ctx context.Context, errs *consoleErrors, name string, width int64) {
	t.Helper()
	time.Sleep(200 * time.Millisecond) // let the console events arrive
	for _, m := range errs.take() {
		if strings.Contains(m, "favicon.ico") || (strings.Contains(name, "missing") && strings.Contains(m, "404") || strings.Contains(name, "refused") && strings.Contains(m, "400") || strings.Contains(name, "missing") && strings.Contains(m, "404")) {
			continue // the site has no icon; missing pages and refused forms answer 404 and 400 as they must
		}
		t.Errorf("%s: the browser says %s", name, m)
	}
	if w := eval[int64](t, ctx, `document.documentElement.scrollWidth`); w > width {
		wide := eval[[]string](t, ctx, fmt.Sprintf(`[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > %d.5).slice(0, 5).map(e => e.outerHTML.slice(0, 120))`, width))
		t.Errorf("%s is %dpx wide at %dpx: %q", name, w, width, wide)
	}
	// Every form that changes something carries its CSRF token.
	if bare := eval[[]string](t, ctx, `[...document.querySelectorAll('form')].filter(f => f.method.toLowerCase() === 'post' &&
		!f.querySelector('input[type=hidden][name=csrf]')?.value).map(f => f.outerHTML.slice(0, 100))`); len(bare) > 0 {
		t.Errorf("%s: POST forms without a CSRF token: %q", name, bare)
	}
	// A keyboard reaches the page's content first: a skip link to main
	// past the menus (the API reference has none to skip).
	if !strings.HasPrefix(name, "docs") && eval[string](t, ctx, `(document.querySelector('a[href="#main"], a[href="#content"]') || {}).hash || ''`) == "" {
		t.Errorf("%s: no link to skip to the content", name)
	}
	// What the keyboard focuses shows it: the first stops of Tab each
	// have an outline or a ring.
	for i := 0; i < 6; i++ {
		step(t, ctx, "tab", chromedp.KeyEvent("\t"))
		if bare := eval[string](t, ctx, `(() => { const e = document.activeElement; if (!e || e === document.body) return '';
			const s = getComputedStyle(e); return (s.outlineStyle === 'none' || s.outlineWidth === '0px') && s.boxShadow === 'none' ? e.outerHTML.slice(0, 100) : '' })()`); bare != "" {
			t.Errorf("%s: the keyboard's focus does not show on %s", name, bare)
			break
		}
	}
	// A card's first line starts at its padding: no band of blank space
	// above a card's heading.
	if gaps := eval[[]string](t, ctx, `[...document.querySelectorAll('.card')].filter(c => c.firstElementChild &&
		c.firstElementChild.getBoundingClientRect().top - c.getBoundingClientRect().top > 24).map(c => c.outerHTML.slice(0, 80))`); len(gaps) > 0 {
		t.Errorf("%s: cards with blank space above their first line: %q", name, gaps)
	}
	loopShot(t, ctx, name)
}
