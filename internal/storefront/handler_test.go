package storefront

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
)

func units(s string) *billing.Units {
	u, err := billing.ParseUnits(s)
	if err != nil {
		panic(err)
	}
	return &u
}

// testCatalog has two public services (weather with a listed, a private
// and a prepaid product; maps, free) and one that is not public, whose
// names and texts must never reach a page.
func testCatalog(t testing.TB) *catalog.Catalog {
	t.Helper()
	q := billing.Whole(10000)
	free := billing.Whole(1000)
	weather := &catalog.Service{
		ID: "weather", Backend: "http://10.0.0.7:9000", Secrets: []string{"backend-secret-0123456789"},
		Public: true, DisplayName: "Weather", Description: "Forecasts for every city.",
		LogoURL: "https://cdn.example.com/w.png", CoverImageURL: "https://elsewhere.example.net/c.jpg", Tags: []string{"geo", "weather"},
		Features: []*catalog.Feature{{ID: "fast", Label: "Fast", DisplayOrder: 2}, {ID: "global", Label: "Global", DisplayOrder: 1, InfoTooltip: "240 countries"}},
		Endpoints: []*catalog.Endpoint{
			{ID: "forecast", Methods: []string{"GET"}},
			{ID: "report", Methods: []string{"POST"}, Async: true, AsyncOnly: true, Cost: units("5")},
		},
		Products: []*billing.Product{
			{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: &q,
				Overage: "allow", Price: *units("0.002"), RateLimit: &billing.RateLimit{Requests: 10}},
			{ID: "enterprise", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: *units("0.001")},
			{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, UnitLabel: "token", Price: *units("2")},
			{ID: "starter", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: &free, Overage: "block"},
		},
		ProductListings: []*catalog.ProductListing{
			{Product: "basic", DisplayName: "Basic", Currency: "USD", PeriodPrice: units("29"), TrialDays: 14},
			{Product: "enterprise", DisplayName: "Enterprise Secret Deal", Currency: "USD", Private: true},
		},
	}
	maps := &catalog.Service{
		ID: "maps", Backend: "http://10.0.0.9", Secrets: []string{"maps-secret-0123456789"}, Public: true,
		DisplayName: "Maps", Description: "Tiles and routes.", LogoURL: "/img/maps.png", Tags: []string{"geo"},
		Endpoints: []*catalog.Endpoint{{ID: "tile", Methods: []string{"GET"}}},
		Products:  []*billing.Product{{ID: "free", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &free}},
		// Callers take the free plan themselves, in the portal.
		ProductListings: []*catalog.ProductListing{{Product: "free", SelfService: true}},
	}
	hidden := &catalog.Service{ID: "internal-only", DisplayName: "Payroll Internal", Backend: "http://10.0.0.8",
		Secrets: []string{"other-secret-0123456789"}, Tags: []string{"hr"},
		Endpoints: []*catalog.Endpoint{{ID: "x"}}}
	c, err := catalog.Compile([]*catalog.Service{weather, maps, hidden}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newHandler(t testing.TB) *Handler {
	t.Helper()
	h := &Handler{
		Title: "Acme APIs", SignInURL: "/portal/", CatalogURL: "/catalog",
		ImageOrigins: []string{"https://cdn.example.com"},
	}
	if err := h.setup(testCatalog(t), "/api", zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	return h
}

func get(t testing.TB, h *Handler, method, target string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, nil); err != nil {
		t.Fatal(err)
	}
	return w
}

const wantCSP = "default-src 'none'; style-src 'self'; img-src 'self' https://cdn.example.com; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// TestPrivateNeverShown: a service that is not public and a private
// product appear on no page, not even by their id, and the hidden
// service's page is the same 404 as a service that does not exist.
func TestPrivateNeverShown(t *testing.T) {
	h := newHandler(t)
	pages := []string{"/", "/?q=payroll", "/?tag=hr", "/?q=internal", "/services/weather", "/services/maps"}
	for _, p := range pages {
		w := get(t, h, "GET", p)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: %d", p, w.Code)
		}
		body := w.Body.String()
		for _, secret := range []string{"internal-only", "Payroll", "enterprise", "Enterprise Secret Deal", "10.0.0.", "secret-0123"} {
			if strings.Contains(body, secret) {
				t.Errorf("%s shows %q", p, secret)
			}
		}
	}
	if body := get(t, h, "GET", "/?tag=hr").Body.String(); !strings.Contains(body, "Weather") {
		t.Error("a tag only a hidden service has should be ignored, showing every public service")
	}
	hidden := get(t, h, "GET", "/services/internal-only")
	unknown := get(t, h, "GET", "/services/nope")
	if hidden.Code != http.StatusNotFound || unknown.Code != http.StatusNotFound {
		t.Fatalf("hidden %d, unknown %d; want 404 for both", hidden.Code, unknown.Code)
	}
	if strings.ReplaceAll(hidden.Body.String(), "internal-only", "nope") != unknown.Body.String() {
		t.Error("the hidden service's 404 differs from an unknown service's: it tells that the service exists")
	}
}

// TestNotFoundPage: an unknown service or path is an HTML 404 page under
// the same policy, with a link back that holds at its depth.
func TestNotFoundPage(t *testing.T) {
	h := newHandler(t)
	for path, back := range map[string]string{"/services/nope": `href="../"`, "/no/such/page": `href="../../"`, "/services/a/b": `href="../../"`, "/services/": `href="../"`} {
		w := get(t, h, "GET", path)
		if w.Code != http.StatusNotFound {
			t.Fatalf("%s: %d", path, w.Code)
		}
		body := w.Body.String()
		if ct := w.Header().Get("Content-Type"); ct != htmlType {
			t.Errorf("%s: Content-Type %q", path, ct)
		}
		if w.Header().Get("Content-Security-Policy") != wantCSP {
			t.Errorf("%s: CSP %q", path, w.Header().Get("Content-Security-Policy"))
		}
		if !strings.Contains(body, "<h1>Not found</h1>") || !strings.Contains(body, back+">See all APIs") {
			t.Errorf("%s: page lacks its heading or a link back (%s):\n%s", path, back, body)
		}
	}
	if body := get(t, h, "GET", "/services/nope").Body.String(); !strings.Contains(body, "no API called “nope”") {
		t.Errorf("unknown service page does not name it:\n%s", body)
	}
	// Text that is no service's name is not repeated on the page.
	phish := "Your account is suspended: call +1 555 0100"
	w := get(t, h, "GET", "/services/"+url.PathEscape(phish))
	if body := w.Body.String(); w.Code != http.StatusNotFound || strings.Contains(body, "suspended") || !strings.Contains(body, "There is no page at this address.") {
		t.Errorf("a 404 repeats the address's text (%d):\n%s", w.Code, body)
	}
}

// TestETag: every page and the stylesheet carry an ETag and max-age, and
// a client holding the same version gets 304 with no body.
func TestETag(t *testing.T) {
	h := newHandler(t)
	for _, p := range []string{"/", "/?q=weather&tag=geo", "/services/weather", "/assets/storefront.css"} {
		w := get(t, h, "GET", p)
		etag := w.Header().Get("ETag")
		if w.Code != http.StatusOK || etag == "" {
			t.Fatalf("%s: %d, ETag %q", p, w.Code, etag)
		}
		if cc := w.Header().Get("Cache-Control"); cc != "public, max-age=60" {
			t.Errorf("%s: Cache-Control %q", p, cc)
		}
		again := get(t, h, "GET", p, "If-None-Match", `"other", W/`+etag)
		if again.Code != http.StatusNotModified || again.Body.Len() != 0 {
			t.Errorf("%s revalidated: %d with %d bytes, want 304 and none", p, again.Code, again.Body.Len())
		}
	}
	if a, b := get(t, h, "GET", "/").Header().Get("ETag"), get(t, h, "GET", "/?tag=weather").Header().Get("ETag"); a == b {
		t.Error("a filtered front page has the unfiltered page's ETag")
	}
}

// TestPolicy: the pages carry the strict policy, hold no script, no inline
// style and no event handler, and refuse writes.
func TestPolicy(t *testing.T) {
	h := newHandler(t)
	inline := regexp.MustCompile(`(?i)<script|<style|\sstyle=|\son[a-z]+=|javascript:`)
	for _, p := range []string{"/", "/services/weather", "/services/maps", "/services/nope"} {
		w := get(t, h, "GET", p)
		if got := w.Header().Get("Content-Security-Policy"); got != wantCSP {
			t.Errorf("%s: CSP %q", p, got)
		}
		if w.Header().Get("X-Frame-Options") != "DENY" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: framing or sniffing headers missing", p)
		}
		if m := inline.FindString(w.Body.String()); m != "" {
			t.Errorf("%s holds %q, which the policy would block", p, m)
		}
	}
	if w := get(t, h, "POST", "/"); w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d, Allow %q", w.Code, w.Header().Get("Allow"))
	}
	if w := get(t, h, "GET", "/services/weather/"); w.Code != http.StatusPermanentRedirect || w.Header().Get("Location") != "../weather" {
		t.Errorf("trailing slash: %d to %q", w.Code, w.Header().Get("Location"))
	}
}

// TestImages: a logo on a configured origin or on the site is an <img>
// with alt text; one elsewhere is not loaded, a monogram stands in.
func TestImages(t *testing.T) {
	h := newHandler(t)
	front := get(t, h, "GET", "/").Body.String()
	for _, want := range []string{
		`<img class="logo" src="https://cdn.example.com/w.png" alt="Weather logo"`,
		`<img class="logo" src="/img/maps.png" alt="Maps logo"`,
	} {
		if !strings.Contains(front, want) {
			t.Errorf("front page lacks %s", want)
		}
	}
	page := get(t, h, "GET", "/services/weather").Body.String()
	if strings.Contains(page, "elsewhere.example.net") {
		t.Error("the cover on an origin the policy does not allow is on the page")
	}
}

// TestSearchAndTags: the search matches every word in names,
// descriptions, tags and features; the tag narrows; both combine.
func TestSearchAndTags(t *testing.T) {
	h := newHandler(t)
	cases := []struct {
		target      string
		want, never []string
	}{
		{"/", []string{"Weather", "Maps", "2 APIs"}, nil},
		{"/?q=forecasts", []string{"Weather", "1 API matching “forecasts”"}, []string{`href="services/maps"`}},
		{"/?q=TILES+routes", []string{`href="services/maps"`}, []string{`href="services/weather"`}},
		{"/?q=240+countries", []string{`href="services/weather"`}, []string{`href="services/maps"`}},
		{"/?tag=weather", []string{`href="services/weather"`, `aria-current="page">weather`}, []string{`href="services/maps"`}},
		{"/?tag=geo&q=tiles", []string{`href="services/maps"`, `name="tag" value="geo"`}, []string{`href="services/weather"`}},
		{"/?q=nothing-like-it", []string{"No API matches", "0 APIs"}, []string{`href="services/`}},
		{"/?q=%3Cscript%3E", []string{"&lt;script&gt;"}, []string{"<script>"}},
	}
	for _, c := range cases {
		body := get(t, h, "GET", c.target).Body.String()
		for _, w := range c.want {
			if !strings.Contains(body, w) {
				t.Errorf("%s lacks %s", c.target, w)
			}
		}
		for _, n := range c.never {
			if strings.Contains(body, n) {
				t.Errorf("%s shows %s", c.target, n)
			}
		}
	}
}

// TestServicePage: features in display order with their tooltip visible,
// every listed plan with a price that names its currency or says Free,
// the endpoints, the API reference link and the sign-in call to action.
func TestServicePage(t *testing.T) {
	h := newHandler(t)
	body := get(t, h, "GET", "/services/weather").Body.String()
	if i, j := strings.Index(body, ">Global<"), strings.Index(body, ">Fast<"); i < 0 || j < 0 || i > j {
		t.Error("features not in display order")
	}
	for _, want := range []string{
		`<li title="240 countries"><span class="label">Global</span><span class="hint">240 countries</span>`,
		`<strong>29.00 USD</strong> <span class="per">per month</span>`,
		"14-day free trial",
		"10,000 requests included per month",
		"Past the quota: 0.002 USD per request",
		"Up to 10 requests per second, bursts of 10",
		"<strong>Prepaid credits</strong>",
		"Each token takes 2 credits from your prepaid balance",
		"<strong>Free</strong>",
		"Calls past the quota are refused until the next month",
		"<code>/api/service/weather/endpoint/forecast/invoke</code>",
		"<code>/api/service/weather/endpoint/report/invoke/async</code>",
		`href="/catalog/services/weather/docs"`,
		`href="/catalog/services/weather/openapi.json"`,
		`<a class="cta" href="/portal/">Sign in to the portal</a>`,
		"The plans of this service are not taken from this page",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("service page lacks %s", want)
		}
	}
	prices := regexp.MustCompile(`<p class="price"><strong>([^<]*)</strong>`).FindAllStringSubmatch(body, -1)
	if len(prices) != 3 {
		t.Fatalf("%d plans, want 3 (basic, credits, starter)", len(prices))
	}
	money := regexp.MustCompile(`^[0-9]+(\.[0-9]+)? [A-Z]{3}$`)
	for _, p := range prices {
		if !money.MatchString(p[1]) && p[1] != "Free" && p[1] != "Prepaid credits" {
			t.Errorf("price %q is neither money with its currency nor Free", p[1])
		}
	}
	if strings.Contains(body, "<button") || strings.Contains(body, "<form") {
		t.Error("the service page has a form or button, as if it could subscribe")
	}
}

// TestSubscribeCallToAction: a service with a plan callers take
// themselves says "Subscribe", to the portal's plans page of the
// service; one without keeps the plain note, and with no portal there is
// no Subscribe link to invent.
func TestSubscribeCallToAction(t *testing.T) {
	h := newHandler(t)
	body := get(t, h, "GET", "/services/maps").Body.String()
	if !strings.Contains(body, `<a class="cta" href="/portal/plans/maps">Subscribe</a>`) || strings.Contains(body, "not taken from this page") {
		t.Errorf("the maps page has no Subscribe to the portal:\n%s", body)
	}
	body = get(t, h, "GET", "/services/weather").Body.String()
	if strings.Contains(body, ">Subscribe<") || !strings.Contains(body, "The plans of this service are not taken from this page") {
		t.Error("the weather page, with no self-service plan, offers Subscribe")
	}
	// A sign-in URL with a query keeps it after the plans page's path.
	for signIn, want := range map[string]string{
		"/portal/?from=store":                       "/portal/plans/maps?from=store",
		"https://portal.example.com/p?from=store&a": "https://portal.example.com/p/plans/maps?from=store&amp;a",
	} {
		q := &Handler{SignInURL: signIn}
		if err := q.setup(testCatalog(t), "/api", zap.NewNop()); err != nil {
			t.Fatal(err)
		}
		if body := get(t, q, "GET", "/services/maps").Body.String(); !strings.Contains(body, `<a class="cta" href="`+want+`">Subscribe</a>`) {
			t.Errorf("sign_in_url %s: no Subscribe to %s", signIn, want)
		}
	}
	bare := &Handler{}
	if err := bare.setup(testCatalog(t), "/api", zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	if body := get(t, bare, "GET", "/services/maps").Body.String(); strings.Contains(body, ">Subscribe<") {
		t.Error("Subscribe with no portal to subscribe in")
	}
}

// TestNoSignInURL: without a portal the call to action says to ask the
// operator, and no sign-in link is invented.
func TestNoSignInURL(t *testing.T) {
	h := &Handler{}
	if err := h.setup(testCatalog(t), "/api", zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	body := get(t, h, "GET", "/services/weather").Body.String()
	if !strings.Contains(body, "Ask the operator of this gateway for a service key") || strings.Contains(body, "Sign in") {
		t.Errorf("page without sign_in_url:\n%s", body)
	}
	if strings.Contains(body, "/catalog/") {
		t.Error("a documentation link without catalog_url")
	}
	if !strings.Contains(body, "<title>Weather · "+DefaultTitle+"</title>") {
		t.Error("default title missing")
	}
	if got := get(t, h, "GET", "/").Header().Get("Content-Security-Policy"); !strings.Contains(got, "img-src 'self';") {
		t.Errorf("CSP without image origins: %q", got)
	}
}

// TestOptionsChecked: setup refuses links and origins that would break
// the page or loosen the policy.
func TestOptionsChecked(t *testing.T) {
	for name, h := range map[string]*Handler{
		"origin with path":     {ImageOrigins: []string{"https://cdn.example.com/x"}},
		"origin wildcard":      {ImageOrigins: []string{"https://*.example.com"}},
		"origin not http":      {ImageOrigins: []string{"data:"}},
		"sign-in javascript":   {SignInURL: "javascript:alert(1)"},
		"sign-in relative":     {SignInURL: "portal/"},
		"catalog scheme-less":  {CatalogURL: "//evil.example/catalog"},
		"contact javascript":   {ContactURL: "javascript:alert(1)"},
		"title with a newline": {Title: "a\nb"},
		"negative max_age":     {MaxAge: -1},
	} {
		if err := h.setup(testCatalog(t), "/api", zap.NewNop()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ok := &Handler{ContactURL: "mailto:sales@example.com", SignInURL: "https://portal.example.com/portal/"}
	if err := ok.setup(testCatalog(t), "/api", zap.NewNop()); err != nil {
		t.Errorf("mailto contact and absolute sign-in: %v", err)
	}
}

// TestZeroPeriodPriceIsFree: a plan whose period price is 0 and that
// prices nothing else costs nothing: its box says Free, as the portal
// does and as the catalog offers it (OfferFree), and the card counts it
// as the free plan; a usage plan with a period price of 0 leads with its
// unit price, not "0.00 USD per month".
func TestZeroPeriodPriceIsFree(t *testing.T) {
	q := billing.Whole(100)
	svc := &catalog.Service{
		ID: "zero", Backend: "http://10.0.0.7:9000", Secrets: []string{"backend-secret-0123456789"}, Public: true,
		Endpoints: []*catalog.Endpoint{{ID: "x", Methods: []string{"GET"}}},
		Products: []*billing.Product{
			{ID: "hobby", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: &q},
			{ID: "meter", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, UnitLabel: "request", Price: *units("0.01")},
		},
		ProductListings: []*catalog.ProductListing{
			{Product: "hobby", Currency: "USD", PeriodPrice: units("0"), SelfService: true},
			{Product: "meter", Currency: "USD", PeriodPrice: units("0")},
		},
	}
	c, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Service("zero")
	if offer := s.SelfServiceOffer("hobby"); offer != catalog.OfferFree {
		t.Fatalf("the catalog offers hobby as %d, not free", offer)
	}
	h := &Handler{}
	if err := h.setup(c, "/api", zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeHTTP(w, r, nil); err != nil {
			t.Error(err)
		}
	}))
	defer srv.Close()
	read := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	page := read("/services/zero")
	if strings.Contains(page, "0.00 USD") || strings.Contains(page, ">0 USD") {
		t.Errorf("a period price of 0 is shown as a price:\n%s", page)
	}
	for _, want := range []string{"<strong>Free</strong>", "<strong>0.01 USD</strong> <span class=\"per\">per request</span>"} {
		if !strings.Contains(page, want) {
			t.Errorf("service page lacks %s", want)
		}
	}
	if front := read("/"); !strings.Contains(front, "2 plans, including a free one") {
		t.Error("the card does not count the free plan")
	}
}
