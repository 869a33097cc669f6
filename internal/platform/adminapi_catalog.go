package platform

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/catalog"
)

func init() {
	caddy.RegisterModule(catalogAdminAPI{})
}

// catalogAdminBase is where the operator reads the running catalog,
// below the platform's other admin routes (the longer pattern wins).
const catalogAdminBase = adminAPIBase + "catalog/"

// catalogAdminAPI is the admin.api.platform_catalog module: the running
// gateway's catalog as loaded, every service and product, public or not,
// with what the public catalog shows of it; never a secret.
type catalogAdminAPI struct {
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (catalogAdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.platform_catalog",
		New: func() caddy.Module { return new(catalogAdminAPI) },
	}
}

// Provision sets up the logger.
func (a *catalogAdminAPI) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger(a)
	return nil
}

// Routes returns the admin routes of the catalog.
func (a *catalogAdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{
		Pattern: catalogAdminBase,
		Handler: caddy.AdminHandlerFunc(a.serve),
	}}
}

// catalogView is GET /platform/catalog/.
type catalogView struct {
	Services []catalogServiceView `json:"services"`
}

// catalogServiceView is a service as configured (the config's own field
// names), its secrets left out, with what the operator checks before a
// release: how many secrets it has (two during a rotation), whether an
// OpenAPI document is attached, and which products the public catalog
// lists.
type catalogServiceView struct {
	*catalog.Service
	// Secrets hides the embedded field: a shallower field wins in
	// encoding/json, and this one is always empty.
	Secrets         []string `json:"secrets,omitempty"`
	SecretCount     int      `json:"secret_count"`
	OpenAPIAttached bool     `json:"openapi_attached"`
	ListedProducts  []string `json:"listed_products"`
}

func serviceView(app *App, s *catalog.Service) catalogServiceView {
	v := catalogServiceView{
		Service:         s,
		SecretCount:     len(s.VerifySecrets()),
		OpenAPIAttached: app.OpenAPIDocument(s.ID) != nil,
		ListedProducts:  []string{},
	}
	for _, p := range s.Products {
		if s.Listed(p.ID) {
			v.ListedProducts = append(v.ListedProducts, p.ID)
		}
	}
	return v
}

func (a *catalogAdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	app := runningApp()
	if app == nil {
		writeErrorStatus(w, http.StatusServiceUnavailable, apierror.New(codeNotConfigured,
			"the running config has no platform app; add a platform block (or apps.platform) and reload"))
		return nil
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		apierror.Write(w, apierror.New(apierror.MethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path))
		return nil
	}
	if err := checkQuery(r.URL.Query()); err != nil {
		(&adminAPI{logger: a.logger}).writeError(w, r, err)
		return nil
	}
	c := app.Catalog()
	id := strings.TrimPrefix(r.URL.Path, catalogAdminBase)
	if id == "" {
		v := catalogView{Services: []catalogServiceView{}}
		for _, s := range c.Services() {
			v.Services = append(v.Services, serviceView(app, s))
		}
		return writeJSON(w, http.StatusOK, v)
	}
	s, ok := c.Service(id)
	if !ok {
		apierror.Write(w, apierror.New(apierror.ServiceNotFound, "no service '"+id+"' in the catalog"))
		return nil
	}
	return writeJSON(w, http.StatusOK, serviceView(app, s))
}
