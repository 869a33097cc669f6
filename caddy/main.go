// Command caddy is Caddy with the platform gateway modules plugged in: what
// `xcaddy build --with github.com/platformgw/gateway=.` produces, buildable
// with plain `go build ./caddy`.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// Caddy's standard modules: the HTTP server, reverse_proxy, TLS, metrics.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// The platform gateway: app, handlers, admin API and CLI (the root
	// package imports each module package, as xcaddy's main does).
	_ "github.com/platformgw/gateway"
)

func main() {
	caddycmd.Main()
}
