package portal

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestJSONConfigBounds: a JSON config (what `caddy adapt` makes, or an
// operator writes for the admin API) gets the bounds the Caddyfile
// enforces. session_ttl 1800 is 1800 ns in JSON: it loaded and made
// every session end at once. Each is refused at load, naming the option,
// and the running portal keeps serving; values in bounds load.
func TestJSONConfigBounds(t *testing.T) {
	e := start(t, "sign_in_limit 1000")
	key, _ := e.user("alice", "basic")
	for _, tc := range []struct {
		name string
		set  map[string]any
		want string // "" loads
	}{
		{"session_ttl in nanoseconds", map[string]any{"session_ttl": 1800}, "session_ttl"},
		{"session_ttl past a day", map[string]any{"session_ttl": "25h"}, "session_ttl"},
		{"negative session_ttl", map[string]any{"session_ttl": "-10m"}, "session_ttl"},
		{"negative sign_in_limit", map[string]any{"sign_in_limit": -1}, "sign_in_limit"},
		{"sign_in_limit too high", map[string]any{"sign_in_limit": 10001}, "sign_in_limit"},
		{"max_active_keys too high", map[string]any{"max_active_keys": 1001}, "max_active_keys"},
		{"negative max_active_keys", map[string]any{"max_active_keys": -3}, "max_active_keys"},
		{"key_create_limit too high", map[string]any{"key_create_limit": 5000}, "key_create_limit"},
		{"oidc name too long", map[string]any{"oidc": map[string]any{
			"issuer": "http://127.0.0.1:1", "client_id": "portal", "redirect_url": "http://127.0.0.1:1/portal/oidc/callback",
			"name": strings.Repeat("x", 65)}}, "oidc name"},
		{"in bounds", map[string]any{"session_ttl": "10m", "sign_in_limit": 1000, "max_active_keys": 1000, "key_create_limit": 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := loadPortalJSON(t, tc.set)
			if tc.want == "" {
				if status != http.StatusOK {
					t.Fatalf("load: %d %s", status, body)
				}
			} else if status == http.StatusOK || !strings.Contains(body, "platform_portal: "+tc.want) {
				t.Fatalf("load: %d %s; want a refusal naming %s", status, body, tc.want)
			}
			newClient(t).signIn(key)
		})
	}
}

// loadPortalJSON loads the running config again through the admin API
// with the portal handler's options set to set, as JSON, and returns the
// answer.
func loadPortalJSON(t *testing.T, set map[string]any) (int, string) {
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
	h := findHandler(cfg, "platform_portal")
	if h == nil {
		t.Fatal("no platform_portal handler in the running config")
	}
	for k, v := range set {
		h[k] = v
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
