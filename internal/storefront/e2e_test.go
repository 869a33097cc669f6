package storefront

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"

	_ "github.com/platformgw/gateway/internal/platformgw"
	_ "github.com/platformgw/gateway/internal/publiccatalog"
)

// The ports of the in-process server, moved by E2E_ADMIN_PORT and
// E2E_HTTP_PORT as in the e2e package.
var (
	adminPort = e2etest.EnvInt("E2E_ADMIN_PORT", 2999)
	httpPort  = e2etest.EnvInt("E2E_HTTP_PORT", 9080)
)

// TestServedByCaddy loads a Caddyfile with the storefront under /store/
// and the public catalog under /catalog/, as Caddyfile.example has them,
// and reads the pages over real HTTP: the public service and its listed
// plan, nothing of the private service or product, the API reference
// link answered by the catalog, the 404 page and a 304.
func TestServedByCaddy(t *testing.T) {
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
	platform {
		store %s/platform.db
		service weather {
			backend http://127.0.0.1:1
			secret weather-secret-0123456789abcdef
			public
			display_name "Weather"
			description "Forecasts for every city."
			logo_url https://cdn.example.com/weather.png
			tags weather geo
			feature global "Every country" "Cities from 240 countries"
			endpoint forecast {
				methods GET
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 1000 per month
				display_name "Basic"
				currency EUR
				period_price 9.5
				trial 7d
			}
			product vip {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				price 0.01
				currency EUR
				display_name "VIP deal"
				private
			}
		}
		service internal {
			display_name "Payroll"
			backend http://127.0.0.1:3
			secret internal-secret-0123456789abcdef
			endpoint x
		}
	}
}
:%d {
	bind 127.0.0.1
	redir /store /store/
	handle_path /store/* {
		platform_storefront {
			title "Acme APIs"
			sign_in_url /portal/
			catalog_url /catalog
			image_origins https://cdn.example.com
			max_age 2m
		}
	}
	handle_path /catalog/* {
		platform_catalog {
			storefront_url /store
		}
	}
}
`, adminPort, httpPort, t.TempDir(), httpPort)
	unloadOtherStore()
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	site := fmt.Sprintf("http://127.0.0.1:%d", httpPort)

	resp, body := fetch(t, site+"/store/", "")
	if resp.StatusCode != 200 || resp.Header.Get("Cache-Control") != "public, max-age=120" ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "img-src 'self' https://cdn.example.com;") {
		t.Fatalf("front page: %d %v\n%s", resp.StatusCode, resp.Header, body)
	}
	for _, want := range []string{"<title>Acme APIs</title>", `href="services/weather"`, `alt="Weather logo"`, `href="assets/storefront.css"`} {
		if !strings.Contains(body, want) {
			t.Errorf("front page lacks %s", want)
		}
	}
	if resp, _ := fetch(t, site+"/store/", resp.Header.Get("ETag")); resp.StatusCode != http.StatusNotModified {
		t.Errorf("front page revalidated: %d, want 304", resp.StatusCode)
	}
	if resp, _ := fetch(t, site+"/store", ""); resp.StatusCode != http.StatusFound {
		t.Errorf("/store: %d, want the redirect to /store/", resp.StatusCode)
	}

	resp, page := fetch(t, site+"/store/services/weather", "")
	if resp.StatusCode != 200 {
		t.Fatalf("service page: %d", resp.StatusCode)
	}
	for _, want := range []string{"<strong>9.50 EUR</strong>", "7-day free trial", "/api/service/weather/endpoint/forecast/invoke", `href="/portal/"`} {
		if !strings.Contains(page, want) {
			t.Errorf("service page lacks %s", want)
		}
	}
	for _, p := range []string{"/store/", "/store/?q=payroll", "/store/services/weather"} {
		_, b := fetch(t, site+p, "")
		for _, hidden := range []string{"Payroll", "internal", "VIP deal", "127.0.0.1:", "secret-0123"} {
			if strings.Contains(b, hidden) {
				t.Errorf("%s shows %q", p, hidden)
			}
		}
	}
	// The documentation link is answered by the catalog beside it, and
	// the reference links back to this page.
	if resp, b := fetch(t, site+"/catalog/services/weather/docs", ""); resp.StatusCode != 200 || !strings.Contains(page, `href="/catalog/services/weather/docs"`) || !strings.Contains(b, "API reference") ||
		!strings.Contains(b, `<a href="/store/services/weather">Plans and pricing</a>`) {
		t.Errorf("the API reference the page links to: %d", resp.StatusCode)
	}
	if resp, b := fetch(t, site+"/store/services/internal", ""); resp.StatusCode != 404 || !strings.Contains(b, "<h1>Not found</h1>") {
		t.Errorf("the private service's page: %d\n%s", resp.StatusCode, b)
	}
	if resp, b := fetch(t, site+"/store/assets/storefront.css", ""); resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/css") || !strings.Contains(b, ".plans") {
		t.Errorf("stylesheet: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// unloadOtherStore unloads the config a previous test left running: a
// reload never switches stores, and each test has a store of its own.
func unloadOtherStore() {
	admin := fmt.Sprintf("localhost:%d", adminPort)
	if resp, err := http.Post("http://"+admin+"/load", "application/json",
		strings.NewReader(fmt.Sprintf(`{"admin": {"listen": %q}}`, admin))); err == nil {
		resp.Body.Close()
	}
}

func fetch(t *testing.T, url, ifNoneMatch string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ifNoneMatch != "" {
		req.Header.Set("If-None-Match", ifNoneMatch)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestPlanTermsAsCharged: what a plan's box says a call costs is what
// the gateway's billing decision charges. A usage or prepaid plan's quota
// includes nothing (billing prices every unit, inside the quota too), a
// prepaid plan's spending cap is counted in credits, and on a plan that
// measures its units an endpoint's cost is only what is held up front.
func TestPlanTermsAsCharged(t *testing.T) {
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
	platform {
		store %s/platform.db
		service geo {
			backend http://127.0.0.1:1
			secret geo-secret-0123456789abcdef
			public
			endpoint lookup {
				methods GET
			}
			product payg {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				unit request
				quota 1000 per month
				overage allow
				price 0.002
				currency USD
				display_name "Pay as you go"
			}
			product capped {
				billing USAGE_INSTANT
				measurement PER_REQUEST
				unit request
				quota 500 per month
				price 0.01
				currency EUR
			}
			product credits {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 0.5
				spending_cap 100
				currency EUR
			}
			product credits-plain {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				quota 200 per day
				price 2
				spending_cap 50 
			}
		}
		service llm {
			backend http://127.0.0.1:2
			secret llm-secret-0123456789abcdef
			public
			endpoint chat {
				methods POST
				cost 100
			}
			product tokens {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				unit token
				price 0.00001
				currency USD
			}
		}
	}
}
:%d {
	bind 127.0.0.1
	handle_path /store/* {
		platform_storefront
	}
}
`, adminPort, httpPort, t.TempDir(), httpPort)
	unloadOtherStore()
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	site := fmt.Sprintf("http://127.0.0.1:%d", httpPort)

	// The gateway's own decision: the first request of a period, well
	// inside the quota, costs the unit price on a usage plan and credits
	// on a prepaid one. Nothing of the quota is included.
	q := billing.Whole(1000)
	payg := billing.Product{ID: "payg", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Quota: &q, Overage: "allow", Price: billing.Whole(2) / 1000}
	if d := billing.DecideCharge(payg, billing.State{}, billing.Whole(1)); d.Cost != payg.Price {
		t.Fatalf("the first request of a usage plan costs %s, want %s", d.Cost, payg.Price)
	}

	resp, page := fetch(t, site+"/store/services/geo", "")
	if resp.StatusCode != 200 {
		t.Fatalf("service page: %d", resp.StatusCode)
	}
	for _, never := range []string{
		"1,000 requests included per month", // each is charged 0.002 USD
		"Past the quota: 0.002 USD",         // as if less were charged inside it
		"500 requests included per month",
		"200 requests included per day",
		"100.00 EUR", // the prepaid cap is 100 credits, not money
	} {
		if strings.Contains(page, never) {
			t.Errorf("geo page says %q", never)
		}
	}
	for _, want := range []string{
		"Quota of 1,000 requests per month, each one charged",
		"Calls past the quota go on at the same price",
		"Quota of 500 requests per month, each one charged",
		"Calls past the quota are refused until the next month",
		"Spending capped at 100 credits per month",
		"Spending capped at 50 credits per day",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("geo page lacks %q", want)
		}
	}

	_, page = fetch(t, site+"/store/services/llm", "")
	if strings.Contains(page, "100 units per call") {
		t.Error("llm page says a chat call costs its 100 reserved units; its only plan charges the tokens the backend states")
	}
	if !strings.Contains(page, "Charged by what each call uses (100 units held while it runs)") {
		t.Errorf("llm page does not say its calls are measured:\n%s", page)
	}
}

// TestOddRequestTargets: the storefront at the root of a site (no path
// matcher, as on a marketing site) answers request targets that are not
// a path starting with / ("*", which Go's server passes on for any
// method) with its 404 page, not a panic that drops the connection.
func TestOddRequestTargets(t *testing.T) {
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
	platform {
		store %s/platform.db
	}
}
:%d {
	bind 127.0.0.1
	platform_storefront
}
`, adminPort, httpPort, t.TempDir(), httpPort)
	unloadOtherStore()
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	for _, target := range []string{"*"} {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", httpPort))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", target)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			conn.Close()
			t.Errorf("GET %s: no answer (%v)", target, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		conn.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "<h1>Not found</h1>") {
			t.Errorf("GET %s: %d\n%s", target, resp.StatusCode, body)
		}
	}
}
