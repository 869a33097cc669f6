package platform

import (
	"regexp"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// The timeouts a server that hosts a platform handler gets when its
// operator set none. Caddy's own defaults (read_header 1m, idle 5m) let a
// site without a `timeouts` block keep 2,000 slowloris connections for a
// minute (none of them closed after 20 s); these are the values of
// Caddyfile.example. Variables so that tests can scale them down.
var (
	ServerReadHeaderTimeout = 10 * time.Second
	ServerIdleTimeout       = 2 * time.Minute
)

// serverTimeouts is what hardenServers set on one server, for the line
// Start logs.
type serverTimeouts struct {
	server           string
	readHeader, idle time.Duration // 0: the operator's value was kept
}

// platformHandler matches a handler of this project in a route's raw JSON
// (a route whose handlers are not loaded yet, a subroute's included).
var platformHandler = regexp.MustCompile(`"handler"\s*:\s*"platform_(gateway|usage|console|portal|catalog|storefront)"`)

// hardenServers gives every server of the http app being provisioned that
// hosts a platform handler ServerReadHeaderTimeout and ServerIdleTimeout
// where its operator set none. FromContext runs it from each platform
// handler's Provision, the one moment that works on every load and
// reload: Caddy's http app provisions a server's handlers and only then
// fills the timeouts its operator left zero with Caddy's defaults, so a
// zero seen here is the operator's "none", and the values are in place
// before the http app's Start builds the net/http server from them. A
// server provisioned earlier holds Caddy's values by now (its own platform
// handlers, if any, already ran this) and is left alone, as is one whose
// operator set a value. The http app is taken from the provisioning
// lineage, never asked for by name: that would provision it early.
func (a *App) hardenServers(ctx caddy.Context) {
	app := provisioningHTTPApp(ctx)
	if app == nil {
		return
	}
	for name, srv := range app.Servers {
		if srv == nil || srv.ReadHeaderTimeout != 0 && srv.IdleTimeout != 0 || !hostsPlatform(srv) {
			continue
		}
		set := serverTimeouts{server: name}
		if srv.ReadHeaderTimeout == 0 {
			srv.ReadHeaderTimeout = caddy.Duration(ServerReadHeaderTimeout)
			set.readHeader = ServerReadHeaderTimeout
		}
		if srv.IdleTimeout == 0 {
			srv.IdleTimeout = caddy.Duration(ServerIdleTimeout)
			set.idle = ServerIdleTimeout
		}
		a.serverTimeouts = append(a.serverTimeouts, set)
	}
}

// logServerTimeouts says, once per server at Start, which timeouts the
// platform set and to what.
func (a *App) logServerTimeouts() {
	for _, s := range a.serverTimeouts {
		fields := []zap.Field{zap.String("server", s.server)}
		if s.readHeader > 0 {
			fields = append(fields, zap.Duration("read_header", s.readHeader))
		}
		if s.idle > 0 {
			fields = append(fields, zap.Duration("idle", s.idle))
		}
		a.logger.Info("the server hosting the platform handlers sets no read_header or idle limit for slow clients: the platform's are used (set them in the global servers options to choose)", fields...)
	}
}

// provisioningHTTPApp is the http app whose handlers are being provisioned
// with ctx, taken from the provisioning lineage (never asked for by name,
// which would provision it early); nil outside one.
func provisioningHTTPApp(ctx caddy.Context) *caddyhttp.App {
	var app *caddyhttp.App
	for _, m := range ctx.Modules() {
		if h, ok := m.(*caddyhttp.App); ok {
			app = h
		}
	}
	return app
}

// hostsPlatform says whether a platform handler is among srv's routes,
// loaded or not.
func hostsPlatform(srv *caddyhttp.Server) bool {
	if routesHostPlatform(srv.Routes) {
		return true
	}
	if srv.Errors != nil && routesHostPlatform(srv.Errors.Routes) {
		return true
	}
	for _, r := range srv.NamedRoutes {
		if r != nil && routesHostPlatform(caddyhttp.RouteList{*r}) {
			return true
		}
	}
	return false
}

func routesHostPlatform(routes caddyhttp.RouteList) bool {
	for _, r := range routes {
		for _, raw := range r.HandlersRaw {
			if platformHandler.Match(raw) {
				return true
			}
		}
		for _, h := range r.Handlers {
			if sub, ok := h.(*caddyhttp.Subroute); ok && routesHostPlatform(sub.Routes) {
				return true
			}
			if m, ok := h.(caddy.Module); ok && platformHandler.MatchString(`"handler":"`+caddy.GetModuleName(m)+`"`) {
				return true
			}
		}
	}
	return false
}
