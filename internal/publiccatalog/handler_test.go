package publiccatalog

import (
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/openapidoc"
	"github.com/platformgw/gateway/internal/wire"
)

func units(s string) *billing.Units {
	u, err := billing.ParseUnits(s)
	if err != nil {
		panic(err)
	}
	return &u
}

// testCatalog has a public service with a listed, a private and a
// prepaid product, and a service that is not public.
func testCatalog(t *testing.T) *catalog.Catalog {
	t.Helper()
	q := billing.Whole(10000)
	weather := &catalog.Service{
		ID: "weather", Backend: "http://10.0.0.7:9000", Secrets: []string{"backend-secret-0123456789"},
		Owners: []string{"owner-alice"}, Public: true, DisplayName: "Weather", Description: "Forecasts.",
		LogoURL: "https://cdn.example.com/w.png", CoverImageURL: "/img/c.jpg", Tags: []string{"geo"},
		Features: []*catalog.Feature{{ID: "fast", Label: "Fast", DisplayOrder: 2}, {ID: "global", Label: "Global", DisplayOrder: 1, InfoTooltip: "240 countries"}},
		Endpoints: []*catalog.Endpoint{
			{ID: "forecast", Methods: []string{"GET"}},
			{ID: "report", Methods: []string{"POST"}, Async: true, AsyncOnly: true, Cost: units("5")},
			{ID: "wrapped", Methods: []string{"GET", "POST"}, SyncResponse: catalog.SyncWrapped},
		},
		Products: []*billing.Product{
			{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &q,
				Overage: "allow", Price: *units("0.002"), RateLimit: &billing.RateLimit{Requests: 10}},
			{ID: "enterprise", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: *units("0.001")},
			{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, Price: *units("2")},
		},
		ProductListings: []*catalog.ProductListing{
			{Product: "basic", DisplayName: "Basic", Currency: "USD", PeriodPrice: units("29"), TrialDays: 14, SelfService: true},
			{Product: "enterprise", Currency: "USD", Private: true},
		},
	}
	hidden := &catalog.Service{ID: "internal-only", Backend: "http://10.0.0.8", Secrets: []string{"other-secret-0123456789"},
		Endpoints: []*catalog.Endpoint{{ID: "x"}}}
	c, err := catalog.Compile([]*catalog.Service{weather, hidden}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newHandler(t *testing.T) *Handler {
	t.Helper()
	h := new(Handler)
	if err := h.setup(testCatalog(t), DocOptions{Options: Options{GatewayPrefix: "/api"}, Headers: wire.NewHeaders("Platform")}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	return h
}

func get(t *testing.T, h *Handler, method, path string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, nil); err != nil {
		t.Fatal(err)
	}
	return w
}

func TestListShowsOnlyWhatIsPublic(t *testing.T) {
	w := get(t, newHandler(t), "GET", "/services")
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	body := w.Body.String()
	for _, secret := range []string{"10.0.0.7", "backend-secret", "owner-alice", "internal-only", "enterprise", "secrets", "backend"} {
		if strings.Contains(body, secret) {
			t.Errorf("the public list shows %q:\n%s", secret, body)
		}
	}
	var list ServiceList
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Services) != 1 {
		t.Fatalf("services: %+v", list.Services)
	}
	s := list.Services[0]
	if s.LogoURL != "https://cdn.example.com/w.png" || s.CoverImageURL != "/img/c.jpg" || s.DisplayName != "Weather" {
		t.Errorf("card: %+v", s)
	}
	if f := s.CardMarketing.Features; len(f) != 2 || f[0].ID != "global" || f[0].InfoTooltip != "240 countries" || f[1].DisplayOrder != 2 {
		t.Errorf("features by displayOrder: %+v", f)
	}
	if len(s.Products) != 2 {
		t.Fatalf("products (the private one left out): %+v", s.Products)
	}
	basic := s.Products[0]
	want := Product{ID: "basic", DisplayName: "Basic", BillingModel: "SUBSCRIPTION", MeasurementType: "PER_REQUEST",
		Currency: "USD", Price: "29.00", Period: "month", Quota: "10000", Overage: "allow", OveragePrice: "0.002",
		RateLimit: &RateLimit{Requests: 10, WindowSeconds: 1, Burst: 10}, TrialDays: 14, SelfService: true}
	if got, _ := json.Marshal(basic); string(got) != string(must(json.Marshal(want))) {
		t.Errorf("basic:\n got %s\nwant %s", got, must(json.Marshal(want)))
	}
	if c := s.Products[1]; c.CreditsPerUnit != "2" || c.Currency != "" || c.UnitPrice != "" {
		t.Errorf("a prepaid price is credits, not money: %+v", c)
	}
	if e := s.Endpoints[1]; e.InvokePath != "" || e.AsyncInvokePath != "/api/service/weather/endpoint/report/invoke/async" || e.Cost != "5" {
		t.Errorf("async-only endpoint: %+v", e)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestDetailAndRefusals(t *testing.T) {
	h := newHandler(t)
	if w := get(t, h, "GET", "/services/weather"); w.Code != 200 || !strings.Contains(w.Body.String(), `"id":"weather"`) {
		t.Errorf("detail: %d %s", w.Code, w.Body)
	}
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/services/internal-only", 404, "service_not_found"},
		{"GET", "/services/internal-only/openapi.json", 404, "service_not_found"},
		{"GET", "/services/nope", 404, "service_not_found"},
		{"GET", "/", 404, "not_found"},
		{"GET", "/services/weather/x/y", 404, "not_found"},
		{"POST", "/services", 405, "method_not_allowed"},
	} {
		w := get(t, h, tc.method, tc.path)
		var e struct{ Code string }
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != tc.status || e.Code != tc.code {
			t.Errorf("%s %s: %d %s, want %d %s", tc.method, tc.path, w.Code, w.Body, tc.status, tc.code)
		}
	}
}

func TestETagRevalidation(t *testing.T) {
	h := newHandler(t)
	w := get(t, h, "GET", "/services")
	etag := w.Header().Get("ETag")
	if etag == "" || w.Header().Get("Cache-Control") != "public, max-age=60" {
		t.Fatalf("headers: %v", w.Header())
	}
	for _, inm := range []string{etag, "W/" + etag, `"other", ` + etag, "*"} {
		if w := get(t, h, "GET", "/services", "If-None-Match", inm); w.Code != 304 || w.Body.Len() != 0 || w.Header().Get("ETag") != etag {
			t.Errorf("If-None-Match %s: %d %q", inm, w.Code, w.Body)
		}
	}
	if w := get(t, h, "GET", "/services", "If-None-Match", `"stale"`); w.Code != 200 {
		t.Errorf("a stale tag gets the body: %d", w.Code)
	}
	if w := get(t, h, "HEAD", "/services/weather"); w.Code != 200 || w.Body.Len() != 0 || w.Header().Get("Content-Length") == "0" {
		t.Errorf("HEAD: %d %q %v", w.Code, w.Body, w.Header())
	}
	if d := get(t, h, "GET", "/services/weather").Header().Get("ETag"); d == etag {
		t.Error("the list and the detail share an ETag")
	}
}

func TestGeneratedOpenAPIIsValid(t *testing.T) {
	w := get(t, newHandler(t), "GET", "/services/weather/openapi.json")
	if w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if _, err := openapidoc.Check(w.Body.Bytes()); err != nil {
		t.Fatalf("the generated document does not validate: %v\n%s", err, w.Body)
	}
	var doc struct {
		OpenAPI string                               `json:"openapi"`
		Paths   map[string]map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("version %s", doc.OpenAPI)
	}
	want := map[string][]string{
		"/api/service/weather/endpoint/forecast/invoke":     {"get"},
		"/api/service/weather/endpoint/report/invoke/async": {"post"},
		"/api/service/weather/endpoint/wrapped/invoke":      {"get", "post"},
	}
	if len(doc.Paths) != len(want) {
		t.Errorf("paths: %v", doc.Paths)
	}
	for p, methods := range want {
		for _, m := range methods {
			op, ok := doc.Paths[p][m]
			if !ok {
				t.Errorf("no %s %s", m, p)
				continue
			}
			responses, _ := op["responses"].(map[string]any)
			for _, status := range []string{"401", "403", "404", "429"} {
				if _, ok := responses[status]; !ok {
					t.Errorf("%s %s does not document %s", m, p, status)
				}
			}
		}
	}
}

func TestAttachedOpenAPIIsServed(t *testing.T) {
	doc, err := openapidoc.LoadFile("../openapidoc/testdata/weather.openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	attached := func(id string) []byte {
		if id == "weather" {
			return doc
		}
		return nil
	}
	h := new(Handler)
	if err := h.setup(testCatalog(t), DocOptions{Options: Options{GatewayPrefix: "/api"}, Attached: attached}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	w := get(t, h, "GET", "/services/weather/openapi.json")
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"title":"Weather"`) || !strings.Contains(w.Body.String(), `"/forecast"`) {
		t.Errorf("%d %s", w.Code, w.Body)
	}
}

func TestMatches(t *testing.T) {
	if ETagMatches([]string{`"a"`}, `"b"`) || !ETagMatches([]string{`"x", W/"b"`}, `"b"`) || ETagMatches(nil, `"b"`) {
		t.Error("If-None-Match matching")
	}
}

func TestDocsPage(t *testing.T) {
	c := testCatalog(t)
	s, _ := c.Service("weather")
	s.Description = "Forecasts. <script>alert(1)</script>"
	h := new(Handler)
	if err := h.setup(c, DocOptions{Options: Options{GatewayPrefix: "/api"}}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	w := get(t, h, "GET", "/services/weather/docs")
	if w.Code != 200 || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") {
		t.Errorf("CSP %q", csp)
	}
	page := w.Body.String()
	for _, want := range []string{
		"<title>Weather · API reference</title>",
		`<code>/api/service/weather/endpoint/forecast/invoke</code>`,
		`<span class="method m-POST">POST</span> <code>/api/service/weather/endpoint/report/invoke/async</code>`,
		"Authorization: Bearer &lt;serviceKey&gt;",
		"&lt;script&gt;alert(1)&lt;/script&gt;",
		`href="../../assets/docs.css"`,
		`href="openapi.json"`,
		"<h3>Try it</h3>",
		"Bearer $SERVICE_KEY",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page, "<script>") {
		t.Error("a description is rendered as HTML")
	}
	if w := get(t, h, "GET", "/assets/docs.css"); w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/css") {
		t.Errorf("stylesheet: %d %v", w.Code, w.Header())
	}
	if w := get(t, h, "GET", "/services/weather/docs/"); w.Code != http.StatusPermanentRedirect || w.Header().Get("Location") != "../docs" {
		t.Errorf("trailing slash: %d %v", w.Code, w.Header())
	}
	if w := get(t, h, "GET", "/services/internal-only/docs"); w.Code != 404 {
		t.Errorf("docs of a service that is not public: %d", w.Code)
	}
}

// TestDocsLinkToTheStorefront: with storefront_url, a person who landed on
// an API reference (from a search, a link in a README) finds the way to
// the service's plans and to the other services; without it the page
// links nowhere, as the catalog may be published where no storefront is.
// A storefront_url a config gives as JSON is checked as the Caddyfile's.
func TestDocsLinkToTheStorefront(t *testing.T) {
	c := testCatalog(t)
	h := &Handler{StorefrontURL: "/store/"}
	if err := h.setup(c, DocOptions{Options: Options{GatewayPrefix: "/api"}}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	page := get(t, h, "GET", "/services/weather/docs").Body.String()
	want := `<nav aria-label="Marketplace"><a href="/store/">All services</a> · <a href="/store/services/weather">Plans and pricing</a></nav>`
	if !strings.Contains(page, want) {
		t.Errorf("the page lacks the links to the storefront %q:\n%s", want, page)
	}
	plain := newHandler(t)
	if page := get(t, plain, "GET", "/services/weather/docs").Body.String(); strings.Contains(page, "<nav") || strings.Contains(page, "/store") {
		t.Errorf("links to a storefront no config named:\n%s", page)
	}
	for _, bad := range []string{"store", "javascript:alert(1)", "//evil.example", "https://user:pw@shop.example"} {
		h := &Handler{StorefrontURL: bad}
		err := h.setup(c, DocOptions{Options: Options{GatewayPrefix: "/api"}}, zap.NewNop())
		if err == nil || !strings.Contains(err.Error(), "platform_catalog: storefront_url") {
			t.Errorf("storefront_url %q: %v", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("the error repeats a password: %v", err)
		}
	}
}

// TestCurlExample: the command a reference page offers for an operation:
// its method, the server and path with parameters as placeholders (curl
// would read braces as a glob), the key from the environment in the
// header the operation's security names, a JSON body when it takes one
// (any type of body among them), never a media range as a Content-Type.
func TestCurlExample(t *testing.T) {
	for _, tc := range []struct {
		servers []string
		o       docsOperation
		want    string
	}{
		{nil, docsOperation{Method: "GET", Path: "/api/service/weather/endpoint/forecast/invoke", Auth: "Authorization: Bearer <serviceKey>"},
			`curl 'https://gateway.example/api/service/weather/endpoint/forecast/invoke' -H "Authorization: Bearer $SERVICE_KEY"`},
		{[]string{"https://api.example.com/"}, docsOperation{Method: "POST", Path: "/jobs/{job-id}/cancel", Auth: "X-Api-Key (header)", Body: []string{"application/json", "text/plain"}},
			`curl -X POST 'https://api.example.com/jobs/JOB_ID/cancel' -H "X-Api-Key: $SERVICE_KEY" -H 'Content-Type: application/json' -d '{}'`},
		{nil, docsOperation{Method: "PUT", Path: "/upload", Body: []string{"application/octet-stream"}},
			`curl -X PUT 'https://gateway.example/upload' -H 'Content-Type: application/octet-stream'`},
		// The gateway's own document without public_url has server "/":
		// "curl '/api/…'" has no host, and curl refuses it.
		{[]string{"/"}, docsOperation{Method: "GET", Path: "/api/service/weather/endpoint/forecast/invoke", Auth: "Authorization: Bearer <serviceKey>"},
			`curl 'https://gateway.example/api/service/weather/endpoint/forecast/invoke' -H "Authorization: Bearer $SERVICE_KEY"`},
		{[]string{"/v2"}, docsOperation{Method: "GET", Path: "/items"},
			`curl 'https://gateway.example/v2/items'`},
		// A body of any type (the document the gateway builds from its
		// endpoints says */*): a media range is no Content-Type a request
		// may send; JSON is one of the types it takes, as the portal's
		// "Try it" sends. A range of text types: no header to guess.
		{nil, docsOperation{Method: "POST", Path: "/hello", Body: []string{"*/*"}},
			`curl -X POST 'https://gateway.example/hello' -H 'Content-Type: application/json' -d '{}'`},
		{nil, docsOperation{Method: "POST", Path: "/hello", Body: []string{"text/*"}},
			`curl -X POST 'https://gateway.example/hello'`},
	} {
		if got := curlExample(tc.servers, tc.o); got != tc.want {
			t.Errorf("curlExample(%v, %s %s):\n got %s\nwant %s", tc.servers, tc.o.Method, tc.o.Path, got, tc.want)
		}
	}
}

// TestNoOveragePriceWithoutQuota: a SUBSCRIPTION with overage allowed and
// a price but no quota is never charged (billing prices only the units
// past a quota, and there is none), so the catalog states no overage
// price for it, and a caller takes it as the free plan it is rather than
// paying or asking for it.
func TestNoOveragePriceWithoutQuota(t *testing.T) {
	p := &billing.Product{ID: "open", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Overage: "allow", Price: *units("0.002")}
	for _, n := range []billing.Units{billing.Whole(1), billing.Whole(1_000_000)} {
		if d := billing.DecideCharge(*p, billing.State{Used: billing.Whole(5000)}, n); d.Cost != 0 {
			t.Fatalf("billing charges %s for %s units of %s", d.Cost, n, p.ID)
		}
	}
	svc := &catalog.Service{
		ID: "open", Backend: "http://10.0.0.7:9000", Secrets: []string{"backend-secret-0123456789"}, Public: true,
		Endpoints:       []*catalog.Endpoint{{ID: "x", Methods: []string{"GET"}}},
		Products:        []*billing.Product{p},
		ProductListings: []*catalog.ProductListing{{Product: "open", Currency: "USD", SelfService: true}},
	}
	c, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := new(Handler)
	if err := h.setup(c, DocOptions{Options: Options{GatewayPrefix: "/api"}}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeHTTP(w, r, nil); err != nil {
			t.Error(err)
		}
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/services/open")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got Service
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || len(got.Products) != 1 {
		t.Fatalf("%v: %+v", err, got)
	}
	if pv := got.Products[0]; pv.OveragePrice != "" || pv.Currency != "" {
		t.Errorf("the catalog states overagePrice %q %s for a product billing never charges", pv.OveragePrice, pv.Currency)
	}
	s, _ := c.Service("open")
	if offer := s.SelfServiceOffer("open"); offer != catalog.OfferFree {
		t.Errorf("a plan that charges nothing is offered as %d, want OfferFree (%d)", offer, catalog.OfferFree)
	}
}

// TestGeneratedDocumentValidWithLookalikeIDs: endpoint ids may hold '_',
// so one endpoint's id can be another's operationId with its method or
// "_async" added ("run" async beside "run_async", "search" on GET and
// POST beside "search_get"). OpenAPI requires operationIds unique in a
// document; the generated document stays valid, and its reference page
// has an anchor per operation.
func TestGeneratedDocumentValidWithLookalikeIDs(t *testing.T) {
	svc := &catalog.Service{
		ID: "look", Backend: "http://10.0.0.7:9000", Secrets: []string{"backend-secret-0123456789"}, Public: true,
		Endpoints: []*catalog.Endpoint{
			{ID: "run", Methods: []string{"POST"}, Async: true},
			{ID: "run_async", Methods: []string{"POST"}},
			{ID: "search", Methods: []string{"GET", "POST"}},
			{ID: "search_get", Methods: []string{"GET"}},
		},
	}
	c, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := new(Handler)
	if err := h.setup(c, DocOptions{Options: Options{GatewayPrefix: "/api"}}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeHTTP(w, r, nil); err != nil {
			t.Error(err)
		}
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/services/look/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if _, err := openapidoc.Check(body); err != nil {
		t.Errorf("the generated document is not valid OpenAPI: %v", err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for path, ops := range doc.Paths {
		for m, op := range ops {
			if prev, dup := seen[op.OperationID]; dup {
				t.Errorf("operationId %q on %s %s and %s", op.OperationID, m, path, prev)
			}
			seen[op.OperationID] = m + " " + path
		}
	}
	if len(seen) != 6 {
		t.Errorf("%d operations, want 6: %v", len(seen), seen)
	}
}

// TestDocsNotFoundForAPerson: a browser following a link to the API
// reference of a service that does not exist or is not public (an old
// bookmark, a service made private) gets a page saying so, 404, under the
// reference's own policy and stylesheet; a client that does not ask for
// HTML gets the JSON error as before, and so does every other path.
func TestDocsNotFoundForAPerson(t *testing.T) {
	h := newHandler(t)
	accept := "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
	for _, id := range []string{"nope", "internal-only", "<b>x"} {
		w := get(t, h, "GET", "/services/"+url.PathEscape(id)+"/docs", "Accept", accept)
		body := w.Body.String()
		if w.Code != 404 || w.Header().Get("Content-Type") != "text/html; charset=utf-8" ||
			w.Header().Get("Content-Security-Policy") != docsContentSecurityPolicy {
			t.Errorf("%s: %d %v\n%s", id, w.Code, w.Header(), body)
		}
		for _, want := range []string{"<h1>No such API reference</h1>", "“" + html.EscapeString(id) + "”", `href="../../assets/docs.css"`, "service_not_found"} {
			if !strings.Contains(body, want) {
				t.Errorf("%s: the page lacks %q:\n%s", id, want, body)
			}
		}
		if strings.Contains(body, "<b>") {
			t.Errorf("%s: the id is not escaped:\n%s", id, body)
		}
	}
	if w := get(t, h, "GET", "/services/nope/docs"); w.Code != 404 || !strings.Contains(w.Body.String(), `"code":"service_not_found"`) {
		t.Errorf("without Accept: %d %s", w.Code, w.Body)
	}
	if w := get(t, h, "GET", "/services/nope", "Accept", accept); w.Code != 404 || !strings.Contains(w.Body.String(), `"code":"service_not_found"`) {
		t.Errorf("the JSON route: %d %s", w.Code, w.Body)
	}
}
