// Package apidoc keeps docs/openapi.json, the OpenAPI document of the
// gateway's own routes (callers, backends, the public catalog and the
// admin API), true to the gateway: its test starts a gateway and checks
// that every documented operation answers as documented and that every
// route of the admin API's route table is documented; Paths gives the
// handlers' tests the documented paths, to check the other direction. It
// holds no code the gateway runs.
package apidoc

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Paths are the path templates docs/openapi.json documents, for the
// handlers' tests that check every route they answer is documented
// (the other direction of this package's own test).
func Paths(tb testing.TB) map[string]json.RawMessage {
	tb.Helper()
	_, here, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "docs", "openapi.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var doc struct {
		Paths map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		tb.Fatalf("docs/openapi.json: %v", err)
	}
	return doc.Paths
}
