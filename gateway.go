// Package gateway is the platform gateway as Caddy modules: importing it
// registers all of them, so that
//
//	xcaddy build --with github.com/platformgw/gateway=.
//
// (whose generated main imports this package) builds Caddy with the
// gateway, as `go build ./caddy` does. The modules:
//
//   - platform (package platform): the app holding the catalog, store and
//     settings, its admin API (admin.api.platform, and
//     admin.api.platform_store for the store's backup route) and the
//     `caddy platform` command;
//   - http.handlers.platform_gateway, http.reverse_proxy.upstreams.platform
//     and http.reverse_proxy.transport.platform (package platformgw): the
//     invoke handler and the upstream source and transport it hands
//     reverse_proxy;
//   - http.handlers.platform_usage (package usagehandler): usage reports,
//     async progress and completion, job status and result, pre-flight
//     routes;
//   - http.handlers.platform_console (package console): the operator's web
//     console (docs/console.md).
//   - http.handlers.platform_portal (package portal): the caller portal,
//     where callers sign in with a service key and see their own usage
//     (docs/portal.md).
//   - http.handlers.platform_catalog (package publiccatalog): the public
//     catalog, the public services, their products and OpenAPI documents
//     as JSON anyone may read (docs/wire-contract.md), and
//     admin.api.platform_catalog (package platform), the whole catalog
//     for the operator.
//   - http.handlers.platform_storefront (package storefront): the
//     storefront, the public services as pages callers browse: cards,
//     search and tags, plans side by side (docs/storefront.md).
//   - http.handlers.platform_stripe_webhook (package stripewebhook): the
//     endpoint Stripe posts its signed events to, when the platform app
//     takes payments (docs/payments.md).
//
// docs/configuration.md describes their Caddyfile directives.
package gateway

import (
	_ "github.com/platformgw/gateway/internal/console"
	_ "github.com/platformgw/gateway/internal/platform"
	_ "github.com/platformgw/gateway/internal/platformgw"
	_ "github.com/platformgw/gateway/internal/portal"
	_ "github.com/platformgw/gateway/internal/publiccatalog"
	_ "github.com/platformgw/gateway/internal/storefront"
	_ "github.com/platformgw/gateway/internal/stripewebhook"
	_ "github.com/platformgw/gateway/internal/usagehandler"
)
