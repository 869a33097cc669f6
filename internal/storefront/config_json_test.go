package storefront

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// TestJSONConfigMaxAge: a JSON config gets the Caddyfile's bounds of
// max_age. "max_age": 60 is 60 ns in JSON: it loaded and the pages said
// Cache-Control max-age=0. Out of bounds is refused at load, naming the
// option, and the running config keeps serving; in bounds loads.
func TestJSONConfigMaxAge(t *testing.T) {
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
			endpoint forecast {
				methods GET
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 1000 per month
			}
		}
	}
}
:%d {
	bind 127.0.0.1
	handle_path /store/* {
		platform_storefront {
			max_age 2m
		}
	}
}
`, adminPort, httpPort, t.TempDir(), httpPort)
	unloadOtherStore()
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")
	site := fmt.Sprintf("http://127.0.0.1:%d/store/", httpPort)
	for _, tc := range []struct {
		maxAge any
		ok     bool
		header string // Cache-Control served after the load
	}{
		{60, false, "max-age=120"},
		{"500ms", false, "max-age=120"},
		{"1500ms", false, "max-age=120"},
		{"366d", false, "max-age=120"},
		{"-1m", false, "max-age=120"},
		{"5m", true, "max-age=300"},
	} {
		status, body := loadStorefrontJSON(t, tc.maxAge)
		if ok := status == http.StatusOK; ok != tc.ok || (!ok && !strings.Contains(body, "platform_storefront: max_age")) {
			t.Errorf("max_age %v: load %d %s", tc.maxAge, status, body)
		}
		if resp, _ := fetch(t, site, ""); resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Cache-Control"), tc.header) {
			t.Errorf("max_age %v: then %d %q, want %s", tc.maxAge, resp.StatusCode, resp.Header.Get("Cache-Control"), tc.header)
		}
	}
}

// loadStorefrontJSON loads the running config again through the admin
// API with the storefront's max_age set, as JSON.
func loadStorefrontJSON(t *testing.T, maxAge any) (int, string) {
	t.Helper()
	admin := fmt.Sprintf("http://localhost:%d", adminPort)
	resp, err := http.Get(admin + "/config/")
	if err != nil {
		t.Fatal(err)
	}
	var cfg any
	err = json.NewDecoder(resp.Body).Decode(&cfg)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	h := findHandler(cfg, "platform_storefront")
	if h == nil {
		t.Fatal("no platform_storefront handler in the running config")
	}
	h["max_age"] = maxAge
	b, _ := json.Marshal(cfg)
	resp, err = http.Post(admin+"/load", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// findHandler is the first object of a JSON config whose "handler" is
// name.
func findHandler(v any, name string) map[string]any {
	switch v := v.(type) {
	case map[string]any:
		if v["handler"] == name {
			return v
		}
		for _, c := range v {
			if h := findHandler(c, name); h != nil {
				return h
			}
		}
	case []any:
		for _, c := range v {
			if h := findHandler(c, name); h != nil {
				return h
			}
		}
	}
	return nil
}
