package publiccatalog

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/openapidoc"

	_ "github.com/platformgw/gateway/internal/platformgw"
	_ "github.com/platformgw/gateway/internal/usagehandler"
)

// The ports of the in-process server, moved by E2E_ADMIN_PORT and
// E2E_HTTP_PORT as in the e2e package.
var (
	adminPort = e2etest.EnvInt("E2E_ADMIN_PORT", 2999)
	httpPort  = e2etest.EnvInt("E2E_HTTP_PORT", 9080)
)

// TestServedByCaddy loads a Caddyfile with a public and a private service
// and the catalog under /catalog/, and reads it over real HTTP as a
// storefront would, then the operator's view through the admin API.
func TestServedByCaddy(t *testing.T) {
	dir := t.TempDir()
	openapi, err := filepath.Abs("../openapidoc/testdata/weather.openapi.yaml")
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
		service weather {
			backend http://127.0.0.1:1
			secret weather-secret-0123456789abcdef
			owners alice
			public
			display_name "Weather"
			logo_url https://cdn.example.com/weather.png
			cover_image_url https://cdn.example.com/weather-cover.jpg
			tags weather
			feature global "Every country" "Cities from 240 countries"
			feature fast "Answers in 50 ms"
			openapi %s
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
				self_service
			}
			product vip {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				price 0.01
				currency EUR
				private
			}
		}
		service translate {
			backend http://127.0.0.1:2
			secret translate-secret-0123456789abcdef
			public
			endpoint text {
				methods POST
				async
			}
		}
		service internal {
			backend http://127.0.0.1:3
			secret internal-secret-0123456789abcdef
			endpoint x
		}
	}
}
:%d {
	bind 127.0.0.1
	handle_path /catalog/* {
		platform_catalog {
			max_age 5m
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
`, adminPort, httpPort, dir, openapi, httpPort)
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	base := fmt.Sprintf("http://127.0.0.1:%d/catalog", httpPort)

	resp, body := fetch(t, base+"/services", "")
	if resp.StatusCode != 200 || resp.Header.Get("Cache-Control") != "public, max-age=300" {
		t.Fatalf("list: %d %v\n%s", resp.StatusCode, resp.Header, body)
	}
	for _, hidden := range []string{"secret", "127.0.0.1", "alice", "internal", "vip"} {
		if strings.Contains(body, hidden) {
			t.Errorf("the public list shows %q:\n%s", hidden, body)
		}
	}
	var list ServiceList
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Services) != 2 || list.Services[0].ID != "weather" || list.Services[1].ID != "translate" {
		t.Fatalf("public services: %s", body)
	}
	w := list.Services[0]
	if w.LogoURL == "" || w.CoverImageURL == "" || len(w.CardMarketing.Features) != 2 || w.CardMarketing.Features[0].ID != "global" {
		t.Errorf("card: %+v", w)
	}
	if len(w.Products) != 1 || w.Products[0].Price != "9.50" || w.Products[0].Currency != "EUR" || w.Products[0].TrialDays != 7 || !w.Products[0].SelfService {
		t.Errorf("products: %+v", w.Products)
	}

	etag := resp.Header.Get("ETag")
	if resp, _ := fetch(t, base+"/services", etag); resp.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match with the ETag: %d, want 304", resp.StatusCode)
	}

	if resp, body := fetch(t, base+"/services/weather", ""); resp.StatusCode != 200 || !strings.Contains(body, `"id":"weather"`) {
		t.Errorf("detail: %d %s", resp.StatusCode, body)
	}
	if resp, body := fetch(t, base+"/services/internal", ""); resp.StatusCode != 404 || !strings.Contains(body, `"code":"service_not_found"`) {
		t.Errorf("a service that is not public: %d %s", resp.StatusCode, body)
	}

	// The attached document, as JSON; the built one, valid OpenAPI 3.1.
	if resp, body := fetch(t, base+"/services/weather/openapi.json", ""); resp.StatusCode != 200 || !strings.Contains(body, `"/forecast"`) {
		t.Errorf("attached OpenAPI: %d %s", resp.StatusCode, body)
	}
	resp, body = fetch(t, base+"/services/translate/openapi.json", "")
	if resp.StatusCode != 200 || !strings.Contains(body, "/api/service/translate/endpoint/text/invoke/async") {
		t.Fatalf("built OpenAPI: %d %s", resp.StatusCode, body)
	}
	if _, err := openapidoc.Check([]byte(body)); err != nil {
		t.Errorf("built OpenAPI does not validate: %v", err)
	}

	// The API reference pages, from the attached and the built document.
	if resp, body := fetch(t, base+"/services/weather/docs", ""); resp.StatusCode != 200 || !strings.Contains(body, "<code>/forecast</code>") {
		t.Errorf("docs page of the attached document: %d %s", resp.StatusCode, body)
	}
	if resp, body := fetch(t, base+"/services/translate/docs", ""); resp.StatusCode != 200 || !strings.Contains(body, "/invoke/async</code>") {
		t.Errorf("docs page of the built document: %d %s", resp.StatusCode, body)
	}
	if resp, _ := fetch(t, base+"/assets/docs.css", ""); resp.StatusCode != 200 {
		t.Errorf("the docs stylesheet: %d", resp.StatusCode)
	}

	// The operator sees everything but the secrets.
	resp, body = fetch(t, fmt.Sprintf("http://localhost:%d/platform/catalog/", adminPort), "")
	if resp.StatusCode != 200 || strings.Contains(body, "secret-0123") {
		t.Fatalf("admin catalog: %d %s", resp.StatusCode, body)
	}
	var admin struct {
		Services []struct {
			ID              string   `json:"id"`
			Backend         string   `json:"backend"`
			SecretCount     int      `json:"secret_count"`
			OpenAPIAttached bool     `json:"openapi_attached"`
			ListedProducts  []string `json:"listed_products"`
		} `json:"services"`
	}
	if err := json.Unmarshal([]byte(body), &admin); err != nil {
		t.Fatal(err)
	}
	if len(admin.Services) != 3 || admin.Services[0].Backend != "http://127.0.0.1:1" || admin.Services[0].SecretCount != 1 ||
		!admin.Services[0].OpenAPIAttached || strings.Join(admin.Services[0].ListedProducts, ",") != "basic" {
		t.Errorf("admin catalog: %s", body)
	}
	if resp, _ := fetch(t, fmt.Sprintf("http://localhost:%d/platform/catalog/internal", adminPort), ""); resp.StatusCode != 200 {
		t.Errorf("admin detail of a private service: %d", resp.StatusCode)
	}
	if resp, _ := fetch(t, fmt.Sprintf("http://localhost:%d/platform/catalog/nope", adminPort), ""); resp.StatusCode != 404 {
		t.Errorf("admin detail of no service: %d", resp.StatusCode)
	}

	// A reload that changes what is shown changes the tag: a client
	// revalidating with the old one gets the new list at once.
	tester.InitServer(strings.Replace(cfg, `display_name "Weather"`, `display_name "Weather Pro"`, 1), "caddyfile")
	resp, body = fetch(t, base+"/services", etag)
	if resp.StatusCode != 200 || resp.Header.Get("ETag") == etag || !strings.Contains(body, `"displayName":"Weather Pro"`) {
		t.Errorf("after a reload, the old ETag: %d %s %s", resp.StatusCode, resp.Header.Get("ETag"), body)
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
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}
