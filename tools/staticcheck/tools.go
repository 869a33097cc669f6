//go:build tools

// Package tools pins staticcheck for `make lint`: the module proxy refuses
// `go install …@version` here, so the tool is built from this module.
package tools

import _ "honnef.co/go/tools/cmd/staticcheck"
