package storefront

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/browsertest"
	"github.com/platformgw/gateway/internal/catalog"
)

// marketplace is a catalog that looks like a real one: five public
// services with logos on the site, features, tags and plans, and one
// service that is not public.
func marketplace(t *testing.T) *catalog.Catalog {
	t.Helper()
	var services []*catalog.Service
	add := func(id, name, desc string, tags []string, features [][3]string, products []*billing.Product, listings []*catalog.ProductListing) {
		s := &catalog.Service{ID: id, DisplayName: name, Description: desc, Public: true, Tags: tags,
			LogoURL: "/img/" + id + ".svg", Backend: "http://127.0.0.1:1", Secrets: []string{id + "-secret-0123456789abcdef"},
			Endpoints: []*catalog.Endpoint{{ID: "query", Methods: []string{"GET"}}, {ID: "batch", Methods: []string{"POST"}, Async: true, Cost: units("10")}},
			Products:  products, ProductListings: listings}
		for i, f := range features {
			s.Features = append(s.Features, &catalog.Feature{ID: f[0], Label: f[1], InfoTooltip: f[2], DisplayOrder: i})
		}
		services = append(services, s)
	}
	q := func(n int64) *billing.Units { u := billing.Whole(n); return &u }
	add("weather", "Weather Now", "Current conditions and 14-day forecasts for any place on Earth, updated every ten minutes.",
		[]string{"geo", "weather"},
		[][3]string{{"global", "Every country", "Stations in 240 countries and territories"}, {"fast", "Answers in 50 ms", "Median over the last 30 days"}, {"history", "40 years of history", "Hourly records since 1985"}},
		[]*billing.Product{
			{ID: "free", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: q(1000), Overage: "block", RateLimit: &billing.RateLimit{Requests: 5}},
			{ID: "pro", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: q(100000), Overage: "allow", Price: *units("0.0008"), RateLimit: &billing.RateLimit{Requests: 50}},
			{ID: "business", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: q(2000000), Overage: "allow", Price: *units("0.0004")},
		},
		[]*catalog.ProductListing{
			{Product: "free", DisplayName: "Free", Description: "For trying it out."},
			{Product: "pro", DisplayName: "Pro", Currency: "USD", PeriodPrice: units("29"), TrialDays: 14, Description: "For apps in production."},
			{Product: "business", DisplayName: "Business", Currency: "USD", PeriodPrice: units("249"), Description: "For high traffic, with priority support."},
		})
	add("geocode", "Geocoder", "Addresses to coordinates and back, with rooftop accuracy in 60 countries.", []string{"geo", "maps"},
		[][3]string{{"rooftop", "Rooftop accuracy", "Where the address register allows"}, {"batch", "Batch jobs", "Up to 10000 addresses a job"}},
		[]*billing.Product{{ID: "payg", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, UnitLabel: "lookup", Price: *units("0.002")}},
		[]*catalog.ProductListing{{Product: "payg", DisplayName: "Pay as you go", Currency: "EUR"}})
	add("translate", "Translate", "Neural translation between 80 languages, billed per character.", []string{"text", "ai"},
		[][3]string{{"langs", "80 languages", ""}, {"glossary", "Glossaries", "Keep your product names as they are"}},
		[]*billing.Product{{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, UnitLabel: "character", Price: *units("0.001")}},
		[]*catalog.ProductListing{{Product: "credits", DisplayName: "Prepaid"}})
	add("ocr", "Document OCR", "Text and tables from scanned documents and photos.", []string{"ai", "documents"},
		[][3]string{{"tables", "Tables kept as tables", ""}},
		[]*billing.Product{{ID: "starter", BillingModel: billing.UsageInstant, MeasurementType: billing.PerRequest, UnitLabel: "page", Price: *units("3")}},
		[]*catalog.ProductListing{{Product: "starter", DisplayName: "Per page", Currency: "JPY"}})
	add("fx", "Exchange Rates", "Reference rates of 170 currencies, every minute.", []string{"finance"},
		nil,
		[]*billing.Product{{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: q(50000), Overage: "block"}},
		[]*catalog.ProductListing{{Product: "basic", DisplayName: "Basic", Currency: "GBP", PeriodPrice: units("9")}})
	services = append(services, &catalog.Service{ID: "payroll", DisplayName: "Payroll Internal", Backend: "http://127.0.0.1:1",
		Secrets: []string{"payroll-secret-0123456789abcdef"}, Tags: []string{"finance"}, Endpoints: []*catalog.Endpoint{{ID: "run"}}})
	c, err := catalog.Compile(services, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// logo is a small SVG logo of a color with a letter, served by the test
// site as an operator's own images would be.
func logo(color, letter string) string {
	return fmt.Sprintf(`<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 48 48"><rect width="48" height="48" rx="10" fill="%s"/>`+
		`<text x="24" y="32" font-family="sans-serif" font-size="24" font-weight="700" fill="#fff" text-anchor="middle">%s</text></svg>`, color, letter)
}

// startSite serves the storefront under /store/ (stripped, as handle_path
// does) and the logos under /img/.
func startSite(t *testing.T) string {
	t.Helper()
	h := &Handler{Title: "Acme API Marketplace", SignInURL: "/portal/", CatalogURL: "/catalog"}
	if err := h.setup(marketplace(t), "/api", zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	logos := map[string]string{"weather": logo("#0969da", "W"), "geocode": logo("#1a7f37", "G"), "translate": logo("#8250df", "T"), "ocr": logo("#bc4c00", "O"), "fx": logo("#1b1f24", "€")}
	mux := http.NewServeMux()
	mux.HandleFunc("/img/", func(w http.ResponseWriter, r *http.Request) {
		svg, ok := logos[strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/img/"), ".svg")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "image/svg+xml")
		_, _ = w.Write([]byte(svg))
	})
	mux.Handle("/store/", http.StripPrefix("/store", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeHTTP(w, r, nil); err != nil {
			t.Error(err)
		}
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/store/"
}

func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(c, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAsValue))
	if err != nil {
		t.Fatalf("eval %s: %v", js, err)
	}
	return v
}

// load navigates (or clicks) and waits for the page to load.
func load(t *testing.T, ctx context.Context, what string, action chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(c, chromedp.WaitEvent(cdppage.LoadEventFired, nil, action)); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// cards are the names on the front page's cards, in order.
func cards(t *testing.T, ctx context.Context) []string {
	return eval[[]string](t, ctx, `[...document.querySelectorAll('.card h2')].map(e => e.textContent.trim())`)
}

// checkPage checks what every page owes a caller in the browser: the
// stylesheet applied under the policy, no script, every image loaded
// with alt text, one h1 and no skipped heading level, the landmarks,
// every control named, and nothing wider than the window.
func checkPage(t *testing.T, ctx context.Context, what string, width int) {
	t.Helper()
	if bg := eval[string](t, ctx, `getComputedStyle(document.body).backgroundColor`); bg != "rgb(246, 248, 250)" {
		t.Errorf("%s: the stylesheet did not apply (body background %q)", what, bg)
	}
	if n := eval[int](t, ctx, `document.scripts.length`); n != 0 {
		t.Errorf("%s: %d scripts", what, n)
	}
	if bad := eval[[]string](t, ctx, `[...document.images].filter(i => !i.complete || i.naturalWidth === 0 || !i.hasAttribute('alt')).map(i => i.src)`); len(bad) > 0 {
		t.Errorf("%s: images not loaded or without alt: %q", what, bad)
	}
	if skips := eval[[]string](t, ctx, `(() => { let last = 0, out = []; for (const h of document.querySelectorAll('h1,h2,h3,h4,h5,h6')) {
		const n = +h.tagName[1]; if (n > last + 1) out.push(h.tagName + ' ' + h.textContent.trim()); last = n; } return out })()`); len(skips) > 0 {
		t.Errorf("%s: headings skip a level at %q", what, skips)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('h1').length`); n != 1 {
		t.Errorf("%s: %d h1", what, n)
	}
	if missing := eval[[]string](t, ctx, `['header','nav','main','footer'].filter(s => !document.querySelector(s))`); len(missing) > 0 {
		t.Errorf("%s: no %q landmark", what, missing)
	}
	if unnamed := eval[[]string](t, ctx, `[...document.querySelectorAll('input:not([type=hidden]), button, a')]
		.filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim()).map(e => e.outerHTML.slice(0, 80))`); len(unnamed) > 0 {
		t.Errorf("%s: controls without an accessible name: %q", what, unnamed)
	}
	if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > width {
		t.Errorf("%s: the document is %d px wide in a %d px window", what, w, width)
	}
}

// planTops are the top edges of the plan boxes of a service page.
func planTops(t *testing.T, ctx context.Context) []float64 {
	return eval[[]float64](t, ctx, `[...document.querySelectorAll('.plan')].map(p => p.getBoundingClientRect().top)`)
}

// TestStorefrontInBrowser: in chromium at 1280 px, the cards, a search, a
// tag, a service page with its plans side by side and a keyboard focus
// that shows; then at 390x844 every page fits the phone's width and the
// plans stack. With SCREENSHOTS_DIR set it saves storefront-cards,
// storefront-search, storefront-service, storefront-cards-phone and
// storefront-service-phone.
func TestStorefrontInBrowser(t *testing.T) {
	ctx := browsertest.New(t, 2*time.Minute)
	base := startSite(t)

	do(t, ctx, "desktop", chromedp.EmulateViewport(1280, 900))
	load(t, ctx, "the front page", chromedp.Navigate(base))
	all := []string{"Weather Now", "Geocoder", "Translate", "Document OCR", "Exchange Rates"}
	if got := cards(t, ctx); strings.Join(got, ",") != strings.Join(all, ",") {
		t.Errorf("cards %q, want %q", got, all)
	}
	if strings.Contains(eval[string](t, ctx, `document.documentElement.outerHTML`), "Payroll") {
		t.Error("the service that is not public is on the front page")
	}
	checkPage(t, ctx, "the front page", 1280)
	if tops := eval[[]float64](t, ctx, `[...document.querySelectorAll('.card')].slice(0, 3).map(c => c.getBoundingClientRect().top)`); len(tops) != 3 || tops[0] != tops[1] || tops[1] != tops[2] {
		t.Errorf("the first three cards are not in one row: tops %v", tops)
	}
	browsertest.Screenshot(t, ctx, "storefront-cards")
	// The keyboard: the first Tab lands on the skip link, which shows
	// with a visible outline.
	do(t, ctx, "tab", chromedp.KeyEvent("\t"))
	if focus := eval[string](t, ctx, `(() => { const e = document.activeElement; return e.textContent.trim() + '|' + getComputedStyle(e).outlineStyle })()`); focus != "Skip to content|solid" {
		t.Errorf("first Tab focuses %q, want the skip link with a solid outline", focus)
	}

	do(t, ctx, "type a search", chromedp.SendKeys(chromedp.ID("q"), "addresses"))
	load(t, ctx, "search", chromedp.Click(chromedp.CSS(".search button")))
	if got := cards(t, ctx); len(got) != 1 || got[0] != "Geocoder" {
		t.Errorf("search for addresses: %q", got)
	}
	if u := eval[string](t, ctx, `location.search`); u != "?q=addresses" {
		t.Errorf("the search is not a GET with q: %q", u)
	}
	browsertest.Screenshot(t, ctx, "storefront-search")

	load(t, ctx, "all", chromedp.Navigate(base))
	load(t, ctx, "tag ai", chromedp.Click(chromedp.CSS(`.tags a[href="?tag=ai"]`)))
	if got := cards(t, ctx); strings.Join(got, ",") != "Translate,Document OCR" {
		t.Errorf("tag ai: %q", got)
	}
	if cur := eval[string](t, ctx, `document.querySelector('.tags [aria-current=page]').textContent`); cur != "ai" {
		t.Errorf("current tag %q", cur)
	}
	checkPage(t, ctx, "the tag ai", 1280)

	load(t, ctx, "a card's link", chromedp.Click(chromedp.CSS(`.card h2 a[href="services/translate"]`)))
	if h1 := eval[string](t, ctx, `document.querySelector('h1').textContent`); h1 != "Translate" {
		t.Errorf("the card led to %q", h1)
	}
	load(t, ctx, "the weather page", chromedp.Navigate(base+"services/weather"))
	checkPage(t, ctx, "the weather page", 1280)
	if tops := planTops(t, ctx); len(tops) != 3 || tops[0] != tops[1] || tops[1] != tops[2] {
		t.Errorf("the three plans are not side by side at 1280 px: tops %v", tops)
	}
	if prices := eval[[]string](t, ctx, `[...document.querySelectorAll('.plan .price')].map(p => p.textContent.trim())`); strings.Join(prices, "|") != "Free|29.00 USD per month|249.00 USD per month" {
		t.Errorf("prices %q", prices)
	}
	if tip := eval[string](t, ctx, `document.querySelector('.features li[title]').title + '|' + document.querySelector('.features .hint').offsetHeight`); !strings.HasPrefix(tip, "Stations in 240 countries and territories|") || strings.HasSuffix(tip, "|0") {
		t.Errorf("the first feature's tooltip is not both a title and visible: %q", tip)
	}
	if cta := eval[string](t, ctx, `document.querySelector('.access a.cta').getAttribute('href')`); cta != "/portal/" {
		t.Errorf("the call to action leads to %q", cta)
	}
	browsertest.Screenshot(t, ctx, "storefront-service")

	load(t, ctx, "a missing service", chromedp.Navigate(base+"services/payroll"))
	checkPage(t, ctx, "the not-found page", 1280)

	do(t, ctx, "phone", chromedp.EmulateViewport(390, 844))
	for _, p := range []string{"", "?q=geo", "?tag=ai", "services/weather", "services/geocode", "services/translate", "services/ocr", "services/fx", "services/nope"} {
		load(t, ctx, "phone "+p, chromedp.Navigate(base+p))
		checkPage(t, ctx, "phone "+p, 390)
		if p == "" {
			browsertest.Screenshot(t, ctx, "storefront-cards-phone")
		}
		if p == "services/weather" {
			if tops := planTops(t, ctx); len(tops) != 3 || !(tops[0] < tops[1] && tops[1] < tops[2]) {
				t.Errorf("the plans do not stack at 390 px: tops %v", tops)
			}
			browsertest.Screenshot(t, ctx, "storefront-service-phone")
		}
	}
}
