// Package openapidoc reads and checks the OpenAPI documents operators
// attach to services: a valid OpenAPI 3.0 or 3.1 document, JSON or YAML,
// referring to nothing outside itself, returned as the JSON the public
// catalog serves. It is apart from the catalog so that the catalog, which
// the SDK imports, pulls in no OpenAPI library.
package openapidoc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/getkin/kin-openapi/openapi3"
)

// MaxBytes caps an attached OpenAPI document.
const MaxBytes = 4 << 20

// LoadFile reads the OpenAPI document attached to a service (JSON or
// YAML), checks it is a valid OpenAPI 3.0 or 3.1 document that refers to
// nothing outside itself (it is served to callers as one file), and
// returns it as JSON, the form the public catalog serves.
func LoadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %w", path, err)
	}
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("openapi %s: larger than %d bytes", path, MaxBytes)
	}
	out, err := Check(data)
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %w", path, err)
	}
	return out, nil
}

// Check validates an OpenAPI 3.0 or 3.1 document (JSON or YAML)
// and returns it as JSON.
func Check(data []byte) ([]byte, error) {
	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = false
	doc, err := loader.LoadFromData(data)
	if err != nil {
		return nil, fmt.Errorf("invalid OpenAPI document: %w", err)
	}
	if v := doc.OpenAPIMajorMinor(); v != "3.0" && v != "3.1" {
		return nil, fmt.Errorf("openapi version %q: 3.0.x or 3.1.x", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("invalid OpenAPI document: %w", err)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("OpenAPI document as JSON: %w", err)
	}
	return out, nil
}
