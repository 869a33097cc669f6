package platform

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
)

func init() {
	caddy.RegisterModule(storeAdminAPI{})
}

// storeAdminBase is where the routes about the store file itself live,
// below the platform's other admin routes (the longer pattern wins).
const storeAdminBase = adminAPIBase + "store/"

// storeAdminAPI is the admin.api.platform_store module: where the running
// gateway's store file is, and a hot backup of it.
type storeAdminAPI struct {
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (storeAdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.platform_store",
		New: func() caddy.Module { return new(storeAdminAPI) },
	}
}

// Provision sets up the logger.
func (a *storeAdminAPI) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger(a)
	return nil
}

// Routes returns the admin routes of the store.
func (a *storeAdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{
		Pattern: storeAdminBase,
		Handler: caddy.AdminHandlerFunc(a.serve),
	}}
}

// storeView is the store as GET /platform/store/ shows it.
type storeView struct {
	Path      string `json:"path"`
	SizeBytes int64  `json:"sizeBytes"`
	// Kind and Database are set for a PostgreSQL store: "postgres" and
	// the database and node it serves (never a password).
	Kind     string `json:"kind,omitempty"`
	Database string `json:"database,omitempty"`
}

func (a *storeAdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	app := runningApp()
	if app == nil {
		writeErrorStatus(w, http.StatusServiceUnavailable, apierror.New(codeNotConfigured,
			"the running config has no platform app; add a platform block (or apps.platform) and reload"))
		return nil
	}
	var handle func(*App, http.ResponseWriter, *http.Request) error
	switch r.URL.Path {
	case storeAdminBase:
		handle = a.info
	case storeAdminBase + "backup":
		handle = a.backup
	default:
		apierror.Write(w, apierror.New(apierror.NotFound, "no admin route "+r.URL.Path))
		return nil
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		apierror.Write(w, apierror.New(apierror.MethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path))
		return nil
	}
	if err := handle(app, w, r); err != nil {
		(&adminAPI{logger: a.logger}).writeError(w, r, err)
	}
	return nil
}

// info shows which file the running gateway serves.
func (a *storeAdminAPI) info(app *App, w http.ResponseWriter, _ *http.Request) error {
	v := storeView{Path: app.StorePath()}
	if app.StorePostgres != nil {
		v.Path, v.Kind = "", "postgres"
		v.Database = app.StorePath()
	} else if st, err := os.Stat(v.Path); err == nil {
		v.SizeBytes = st.Size()
	}
	return writeJSON(w, http.StatusOK, v)
}

// backup streams a consistent copy of the store, taken while the gateway
// serves: a tar of the store file and its ledger directory
// (boltstore.Backup). Its length is sent first, so a cut transfer is told
// from a whole one.
func (a *storeAdminAPI) backup(app *App, w http.ResponseWriter, r *http.Request) error {
	opened, err := app.openStore()
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	s, ok := opened.(storeBackup)
	if !ok {
		writeErrorStatus(w, http.StatusNotImplemented, apierror.New(codeNotSupported,
			"the store is PostgreSQL: back it up with PostgreSQL's own tools (pg_dump, or base backups with WAL archiving); see docs/fleet.md"))
		return nil
	}
	started := false
	n, err := s.Backup(w, func(size int64) {
		started = true
		h := w.Header()
		h.Set("Content-Type", "application/x-tar")
		h.Set("Content-Length", strconv.FormatInt(size, 10))
		h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="platform-%s.tar"`, time.Now().UTC().Format("20060102T150405Z")))
		h.Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
	})
	if err != nil && !started {
		return err
	}
	if err != nil {
		// Part of the copy is out: the short body (against its
		// Content-Length) tells the client; nothing more can be said.
		a.logger.Error("store backup cut short", zap.String("store", s.Path()), zap.Int64("sent", n), zap.Error(err))
		return nil
	}
	a.logger.Info("store backup sent", zap.String("store", s.Path()), zap.Int64("bytes", n), zap.String("remote", r.RemoteAddr))
	return nil
}

// Interface guards.
var (
	_ caddy.AdminRouter = (*storeAdminAPI)(nil)
	_ caddy.Provisioner = (*storeAdminAPI)(nil)
)
