package openapidoc

import (
	"strings"
	"testing"
)

func TestLoadFile(t *testing.T) {
	doc, err := LoadFile("testdata/weather.openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s := string(doc); !strings.Contains(s, `"openapi":"3.1.0"`) || !strings.Contains(s, `"/forecast"`) {
		t.Errorf("YAML as JSON: %s", s)
	}
	for _, tc := range []struct{ file, want string }{
		{"testdata/broken.openapi.json", "openapi testdata/broken.openapi.json: invalid OpenAPI document"},
		{"testdata/noversion.openapi.json", "invalid OpenAPI document: invalid info: value of version must be a non-empty string"},
		{"testdata/swagger2.json", `openapi version "": 3.0.x or 3.1.x`},
		{"testdata/none.json", "openapi testdata/none.json: open"},
	} {
		if _, err := LoadFile(tc.file); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.file, err, tc.want)
		}
	}
}
