package storefront

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/platformgw/gateway/internal/catalog"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	var h Handler
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`platform_storefront {
		title "Acme APIs"
		sign_in_url /portal/
		contact_url mailto:sales@example.com
		catalog_url /catalog
		image_origins https://cdn.example.com http://127.0.0.1:8080
		max_age 5m
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if h.Title != "Acme APIs" || h.SignInURL != "/portal/" || h.ContactURL != "mailto:sales@example.com" || h.CatalogURL != "/catalog" ||
		!slices.Equal(h.ImageOrigins, []string{"https://cdn.example.com", "http://127.0.0.1:8080"}) || h.MaxAge != caddy.Duration(5*time.Minute) {
		t.Errorf("parsed %+v", h)
	}
	var empty Handler
	if err := empty.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`platform_storefront`)); err != nil {
		t.Errorf("no block: %v", err)
	}
}

// TestUnmarshalCaddyfileErrors: each mistake is refused, naming its option.
func TestUnmarshalCaddyfileErrors(t *testing.T) {
	for input, want := range map[string]string{
		`platform_storefront extra`:                                      "takes no arguments",
		"platform_storefront {\n bogus 1\n}":                             "unrecognized subdirective 'bogus'",
		"platform_storefront {\n title a\n title b\n}":                   "title given twice (first on line 2)",
		"platform_storefront {\n title Acme APIs\n}":                     "quote a title",
		"platform_storefront {\n title\n}":                               "wrong argument count",
		"platform_storefront {\n sign_in_url javascript:alert(1)\n}":     "sign_in_url",
		"platform_storefront {\n catalog_url catalog\n}":                 "catalog_url",
		"platform_storefront {\n contact_url ftp://x\n}":                 "contact_url",
		"platform_storefront {\n image_origins\n}":                       "wrong argument count",
		"platform_storefront {\n image_origins https://a.example/img\n}": "image_origins",
		"platform_storefront {\n max_age 0s\n}":                          "max_age '0s'",
		"platform_storefront {\n max_age 1.5s\n}":                        "whole seconds",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error with %q", input, err, want)
		}
	}
}

// TestCaddyfileAdapt: the directive in a handle_path block adapts to the
// handler with its options, as an operator writes it in a site.
func TestCaddyfileAdapt(t *testing.T) {
	src := `:8080 {
	handle_path /store/* {
		platform_storefront {
			title "Acme APIs"
			sign_in_url /portal/
			catalog_url /catalog
			image_origins https://cdn.example.com
		}
	}
}`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"catalog_url":"/catalog","handler":"platform_storefront","image_origins":["https://cdn.example.com"],"sign_in_url":"/portal/","title":"Acme APIs"}`
	if !strings.Contains(string(out), `"strip_path_prefix":"/store"`) || !strings.Contains(string(out), want) {
		t.Errorf("adapted:\n%s\nwant the prefix stripped and %s", out, want)
	}
}

// TestLinkErrorsKeepSecrets: a refused link or origin is named by its
// scheme and host only; a config error is logged, and a link may carry
// credentials or a token (a review of security by default).
func TestLinkErrorsKeepSecrets(t *testing.T) {
	for _, check := range []func(string) error{
		func(s string) error { return catalog.CheckLink(s, false) },
		func(s string) error { return catalog.CheckLink(s, true) },
		CheckOrigin,
	} {
		for _, s := range []string{"ftp://u:link-SECRET@cdn.example.com/x", "javascript:link-SECRET", "https://cdn.example.com/x?token=link-SECRET#"} {
			err := check(s)
			if err != nil && strings.Contains(err.Error(), "link-SECRET") {
				t.Errorf("the error repeats the link's secret: %s", err)
			}
		}
	}
	if err := catalog.CheckLink("ftp://u:link-SECRET@cdn.example.com/x", false); err == nil || !strings.Contains(err.Error(), "'ftp://cdn.example.com/…'") {
		t.Errorf("CheckLink error %v does not name the scheme and host", err)
	}
}
