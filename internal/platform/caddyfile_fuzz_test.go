package platform

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/platformgw/gateway/internal/catalog"
)

// platformBlockOf returns the inside of the first `platform { … }` block of
// a Caddyfile, or "" when there is none.
func platformBlockOf(caddyfile string) string {
	i := strings.Index(caddyfile, "platform {")
	if i < 0 {
		return ""
	}
	start := i + len("platform {")
	depth := 1
	for j := start; j < len(caddyfile); j++ {
		switch caddyfile[j] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return caddyfile[start:j]
			}
		}
	}
	return ""
}

// FuzzCaddyfile feeds arbitrary `platform { … }` blocks through the real
// Caddyfile adapter. It must never panic, and whatever it accepts must load
// back into the app (no unknown JSON fields) and compile into a catalog: an
// operator's config that adapts must not fail later at provision for a
// reason the parser could have told.
func FuzzCaddyfile(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "adapt", "*.caddyfiletest"))
	seeds = append(seeds, filepath.Join("..", "..", "Caddyfile.example"))
	for _, file := range seeds {
		if data, err := os.ReadFile(file); err == nil {
			if block := platformBlockOf(string(data)); block != "" {
				f.Add(block)
			}
		}
	}
	f.Add("service s {\n backend http://h:1\n secret x\n endpoint e {\n cost 1e9\n }\n}")
	f.Add("service s {\n backend http://h\n secret {env.X}\n product p {\n billing PREPAID\n price -1\n }\n}")
	f.Add("prefixes {\n gateway /a /a\n}\n")
	f.Add("max_body_bytes 99999999999999999999GiB")
	f.Add("service ../x {\n backend file:///etc/passwd\n secret \"\"\n}")
	f.Fuzz(func(t *testing.T, block string) {
		cfg := platformConfig("platform {\n" + block + "\n}")
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
		if err != nil {
			return
		}
		var parsed struct {
			Apps struct {
				Platform json.RawMessage `json:"platform"`
			} `json:"apps"`
		}
		if err := json.Unmarshal(out, &parsed); err != nil {
			t.Fatalf("adapter output is not JSON: %v", err)
		}
		if parsed.Apps.Platform == nil {
			return // e.g. the block was closed early and platform got nothing
		}
		var app App
		dec := json.NewDecoder(bytes.NewReader(parsed.Apps.Platform))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&app); err != nil {
			t.Fatalf("accepted block does not load into the app: %v\n%s", err, parsed.Apps.Platform)
		}
		// Secrets are checked once resolved, at provision (the design has
		// them come from placeholders): stand in a long enough value that
		// keeps two different secrets different.
		resolve := func(s string) (string, error) { return "secret-from-the-environment:" + s, nil }
		if _, err := catalog.Compile(app.Services, resolve); err != nil {
			t.Fatalf("catalog refuses what the Caddyfile accepted: %v\n%s", err, block)
		}
	})
}
