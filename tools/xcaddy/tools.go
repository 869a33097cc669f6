//go:build tools

// Package tools pins the build tools of the gateway, so that `make xcaddy`
// builds xcaddy from the module proxy at a fixed version without
// `go install …@version`.
package tools

import _ "github.com/caddyserver/xcaddy/cmd/xcaddy"
