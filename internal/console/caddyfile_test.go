package console

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	// Caddyfile.example mounts the caller portal beside the console.
	_ "github.com/platformgw/gateway/internal/portal"
	// Caddyfile.example mounts the public catalog and the storefront too.
	_ "github.com/platformgw/gateway/internal/publiccatalog"
	_ "github.com/platformgw/gateway/internal/storefront"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	var h Handler
	d := caddyfile.NewTestDispenser("platform_console {\n prefix /ops\n refresh 30\n}")
	if err := h.UnmarshalCaddyfile(d); err != nil || h.Prefix != "/ops" || h.RefreshSeconds != 30 || h.AllowUnauthenticated || h.AllowPlainHTTP {
		t.Fatalf("%+v %v", h, err)
	}
	h = Handler{}
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("platform_console {\n allow_plain_http\n}")); err != nil || !h.AllowPlainHTTP {
		t.Fatalf("allow_plain_http: %+v %v", h, err)
	}
	for _, bad := range []string{
		"platform_console arg",
		"platform_console {\n prefix ops\n}",
		"platform_console {\n refresh 0\n}",
		"platform_console {\n prefix /a\n prefix /b\n}",
		"platform_console {\n open\n}",
		"platform_console {\n allow_unauthenticated yes\n}",
		"platform_console {\n allow_plain_http yes\n}",
		"platform_console {\n allow_plain_http\n allow_plain_http\n}",
	} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Caddyfile.example never serves the console open: its route
// authenticates (basic_auth) before platform_console, which is not told to
// allow unauthenticated requests.
func TestCaddyfileExampleConsoleBehindAuth(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "Caddyfile.example"))
	if err != nil {
		t.Fatal(err)
	}
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatal(err)
	}
	// The handlers in order as they appear in the adapted JSON.
	var walk func(v any, out *[]map[string]any)
	walk = func(v any, out *[]map[string]any) {
		switch x := v.(type) {
		case map[string]any:
			if _, ok := x["handler"]; ok {
				*out = append(*out, x)
			}
			for _, k := range []string{"handle", "routes"} {
				if c, ok := x[k]; ok {
					walk(c, out)
				}
			}
		case []any:
			for _, c := range x {
				walk(c, out)
			}
		}
	}
	var cfg map[string]any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	var handlers []map[string]any
	walk(cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["srv0"], &handlers)
	var names []string
	for _, h := range handlers {
		names = append(names, h["handler"].(string))
		if h["handler"] == "platform_console" && h["allow_unauthenticated"] == true {
			t.Fatal("Caddyfile.example serves the console unauthenticated")
		}
	}
	got := strings.Join(names, " ")
	auth, console := strings.Index(got, "authentication"), strings.Index(got, "platform_console")
	if console < 0 || auth < 0 || auth > console {
		t.Fatalf("handlers %q: want authentication before platform_console", got)
	}
}
