package console

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestJSONConfigOptions: a JSON config gets the Caddyfile's rules for
// prefix and refresh_seconds. A prefix without its leading slash loaded
// and every link and the CSRF cookie's path were wrong; a refresh past an
// hour or below zero loaded as well. Each is refused at load, naming the
// option, and the running console keeps serving; in bounds loads.
func TestJSONConfigOptions(t *testing.T) {
	e := start(t)
	for _, tc := range []struct {
		set  map[string]any
		want string // "" loads
	}{
		{map[string]any{"prefix": "console"}, "prefix"},
		{map[string]any{"refresh_seconds": 7200}, "refresh_seconds"},
		{map[string]any{"refresh_seconds": -5}, "refresh_seconds"},
		{map[string]any{"refresh_seconds": 3600}, ""},
	} {
		status, body := loadConsoleJSON(t, tc.set)
		if tc.want == "" && status != http.StatusOK {
			t.Errorf("%v: load %d %s", tc.set, status, body)
		}
		if tc.want != "" && (status == http.StatusOK || !strings.Contains(body, "platform_console: "+tc.want)) {
			t.Errorf("%v: load %d %s; want a refusal naming %s", tc.set, status, body, tc.want)
		}
		req, _ := http.NewRequest(http.MethodGet, e.base+"/console/", nil)
		req.SetBasicAuth(testOperator, testPassword)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), `href="/console/users"`) {
			t.Errorf("%v: then the console answers %d", tc.set, resp.StatusCode)
		}
	}
}

// loadConsoleJSON loads the running config again through the admin API
// with set in every platform_console handler, as JSON.
func loadConsoleJSON(t *testing.T, set map[string]any) (int, string) {
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
	n := 0
	eachHandler(cfg, "platform_console", func(h map[string]any) {
		n++
		for k, v := range set {
			h[k] = v
		}
	})
	if n == 0 {
		t.Fatal("no platform_console handler in the running config")
	}
	b, _ := json.Marshal(cfg)
	resp, err = http.Post(admin+"/load", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// eachHandler calls fn with every object of a JSON config whose
// "handler" is name.
func eachHandler(v any, name string, fn func(map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		if v["handler"] == name {
			fn(v)
		}
		for _, c := range v {
			eachHandler(c, name, fn)
		}
	case []any:
		for _, c := range v {
			eachHandler(c, name, fn)
		}
	}
}
