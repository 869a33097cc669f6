// Package usagehandler is the platform_usage HTTP handler: usage reports,
// async job progress and completion, job status and result, and the core
// pre-flight routes (key validation and usage estimates).
package usagehandler

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/platform"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// Handler is the platform_usage handler; its settings come from the
// platform app.
type Handler struct {
	app    *platform.App
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.platform_usage",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision takes the catalog and store from the platform app.
func (h *Handler) Provision(ctx caddy.Context) error {
	appIface, err := ctx.App("platform")
	if err != nil {
		return fmt.Errorf("platform_usage needs the platform app: %w", err)
	}
	h.app = appIface.(*platform.App)
	h.logger = ctx.Logger()
	return nil
}

// ServeHTTP passes everything on until the usage routes are written.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	return next.ServeHTTP(w, r)
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
