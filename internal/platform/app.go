// Package platform is the `platform` Caddy app: it owns the catalog (from the
// configuration) and the store (a bbolt file shared across config reloads),
// and hands both to the platform_gateway and platform_usage handlers, as an
// engine.Runtime, and to the console and the portal, with the operations
// over it (internal/ops). It also serves the admin API (admin.api.platform),
// an HTTP front of those operations, and the `caddy platform` CLI.
package platform

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/jwtauth"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/settlelog"
	"github.com/platformgw/gateway/internal/wire"
)

func init() {
	caddy.RegisterModule(new(App))
}

// Defaults of the app's settings.
const (
	DefaultBrand              = "Platform"
	DefaultTimestampTolerance = 5 * time.Minute
	DefaultJobTTL             = 24 * time.Hour
	DefaultResultMaxBytes     = 16 << 10
	DefaultMaxBodyBytes       = 10 << 20
	DefaultUsageMaxBodyBytes  = 1 << 20
)

// App is the `platform` app: global settings, the service catalog and the
// store. Configure it in the Caddyfile's global options with a `platform`
// block (see UnmarshalCaddyfile for the syntax).
type App struct {
	// HeaderBrand is the word in X-<Brand>-* headers; "Platform" by
	// default, "Tollara" for backends written for that platform.
	HeaderBrand string `json:"header_brand,omitempty"`
	// Store is the path of the bbolt file; by default platform/platform.db
	// under Caddy's data directory, and a relative path is under that
	// directory too. A reload cannot change it (see Provision).
	Store string `json:"store,omitempty"`
	// StorePostgres, when set, keeps everything in PostgreSQL instead of
	// the bbolt file, for a fleet of gateways (storepg.go, docs/fleet.md).
	StorePostgres *PostgresStore `json:"store_postgres,omitempty"`
	// Durability says when a settlement (a call's charge, a report, a job
	// change) is acknowledged: "sync" (the default) once an fdatasync of
	// the settlement log covers it, so it survives power loss; "write" once
	// it is written, so it survives the gateway being killed and loses at
	// most the last FlushInterval on power loss (docs/reliability.md). It
	// is read when the store opens; a reload keeps the running store's.
	Durability string `json:"durability,omitempty"`
	// FlushInterval is how often "write" durability fdatasyncs; 5ms.
	FlushInterval caddy.Duration `json:"flush_interval,omitempty"`
	// GroupCommit is how "sync" durability starts its fdatasyncs:
	// "paced" (the default) no sooner than three times the last one's
	// duration after it (at most 5 ms more), so that more settlements
	// share each; "eager" as soon as the one before ended
	// (docs/performance.md, "The settlement path").
	GroupCommit string `json:"group_commit,omitempty"`
	// PublicURL is the base URL (scheme://host[:port]) used to build the
	// absolute progress and callback URLs of async jobs. When empty they
	// are built from the scheme and Host of the invoking request, if that
	// Host is one the server is configured for (platformgw's knownHost).
	PublicURL string `json:"public_url,omitempty"`
	// Prefixes the routes are served under.
	Prefixes *Prefixes `json:"prefixes,omitempty"`
	// TimestampTolerance is how far a signed timestamp may be from now; 5m.
	TimestampTolerance caddy.Duration `json:"timestamp_tolerance,omitempty"`
	// JobTTL is how long an async job may stay unfinished; 24h.
	JobTTL caddy.Duration `json:"job_ttl,omitempty"`
	// LedgerRetention prunes raw ledger rows older than this (whole
	// segments, hourly); rollups stay. Unset keeps every row. Needs a
	// store with a segmented ledger (docs/operations.md).
	LedgerRetention caddy.Duration `json:"ledger_retention,omitempty"`
	// RollupRetention prunes hourly rollups older than this; unset keeps
	// them.
	RollupRetention caddy.Duration `json:"rollup_retention,omitempty"`
	// ResultMaxBytes caps an inline job result; 16 KiB.
	ResultMaxBytes int `json:"result_max_bytes,omitempty"`
	// MaxBodyBytes caps an invoke request body; 10 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// UsageMaxBodyBytes caps usage and core request bodies; 1 MiB.
	UsageMaxBodyBytes int64 `json:"usage_max_body_bytes,omitempty"`
	// Services is the catalog.
	Services []*catalog.Service `json:"services,omitempty"`
	// JWT lets end users' JWTs authenticate the billing estimate (jwt.go).
	JWT *JWTConfig `json:"jwt,omitempty"`
	// Alerts is where usage alerts are sent (alerts.go).
	Alerts *AlertsConfig `json:"alerts,omitempty"`
	// Payments takes money through Stripe (payments.go, docs/payments.md).
	Payments *payments.Config `json:"payments,omitempty"`
	// AllowSharedPorts lets this gateway start on an address another
	// process already listens on (ports.go), for a deliberate SO_REUSEPORT
	// setup; without it that start is refused.
	AllowSharedPorts bool `json:"allow_shared_ports,omitempty"`

	jwt     *jwtauth.Verifier
	catalog *catalog.Catalog
	alerter *alerter // nil without an alerts block
	// pay is the payments integration; nil without a payments block.
	pay *payments.Service
	// alertsDone is closed when the alert loops of Start are over.
	alertsDone chan struct{}
	// metersDone is closed when the Stripe meter shipper of Start is over.
	metersDone <-chan struct{}
	// storePath is the store file (Store resolved); bolt is that store
	// once open, and poolKey is set while this config holds a reference
	// to it in stores; cleanedUp once Cleanup ran (all under storeMu).
	storePath string
	storeMu   sync.Mutex
	held      atomic.Pointer[heldStore]
	keyUse    atomic.Pointer[ops.KeyUse] // with the pooled store
	poolKey   string
	cleanedUp bool
	// stopHooked are the servers answerAtStop registered a shutdown
	// hook on (each once, however many platform handlers it hosts).
	stopHooked map[*caddyhttp.Server]bool
	// store, when set, is served instead (unit tests build an App around
	// a store of their own).
	store store.Store
	// lastLedgerPrune is when the retentions were last applied (unix ns).
	lastLedgerPrune atomic.Int64

	// ctx is the config's context, for the http app's addresses at Start.
	ctx      caddy.Context
	headers  Headers
	logger   *zap.Logger
	metrics  *metrics
	limiters *engine.Limiters // held in limiterPool until Cleanup
	claims   *engine.Claims   // the callers' hold estimates, pooled with limiters
	rt       *engine.Runtime  // what the handlers serve from (runtime.go)
	ops      *ops.Ops         // the operations over rt (internal/ops)
	clock    clock            // rt's clock (clock.go)
	stop     chan struct{}
	// serverTimeouts are the timeouts hardenServers set, logged at Start.
	serverTimeouts []serverTimeouts

	// openAPI are the services' attached OpenAPI documents (openapi.go).
	openAPI map[string][]byte
}

// Prefixes are the path prefixes of each group of routes (engine.Prefixes).
type Prefixes = engine.Prefixes

// DefaultPrefixes serves the default and the ECS layouts side by side.
func DefaultPrefixes() Prefixes { return engine.DefaultPrefixes() }

// Headers are the branded header names, computed once per config
// (engine.Headers).
type Headers = engine.Headers

// NewHeaders builds the header names for a brand (engine.NewHeaders).
func NewHeaders(brand string) Headers { return engine.NewHeaders(brand) }

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "platform", New: func() caddy.Module { return new(App) }}
}

func (a *App) defaults() error {
	if a.HeaderBrand == "" {
		a.HeaderBrand = DefaultBrand
	}
	if err := wire.CheckBrand(a.HeaderBrand); err != nil {
		return err
	}
	if a.StorePostgres != nil && a.Store != "" {
		return fmt.Errorf("store %q and store_postgres both set: a gateway serves one store", a.Store)
	}
	if a.Store == "" && a.StorePostgres == nil {
		a.Store = filepath.Join(caddy.AppDataDir(), "platform", "platform.db")
	}
	// A group left out keeps its defaults, as in the Caddyfile.
	def := DefaultPrefixes()
	if a.Prefixes == nil {
		a.Prefixes = new(Prefixes)
	}
	if len(a.Prefixes.Gateway) == 0 {
		a.Prefixes.Gateway = def.Gateway
	}
	if len(a.Prefixes.Usage) == 0 {
		a.Prefixes.Usage = def.Usage
	}
	if len(a.Prefixes.Core) == 0 {
		a.Prefixes.Core = def.Core
	}
	seen := map[string]bool{}
	for _, group := range [][]string{a.Prefixes.Gateway, a.Prefixes.Usage, a.Prefixes.Core} {
		for _, p := range group {
			if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") && p != "/" {
				return fmt.Errorf("prefix %q must start with / and not end with /", p)
			}
			if seen[p] {
				return fmt.Errorf("prefix %q is used twice; each group needs prefixes of its own", p)
			}
			seen[p] = true
		}
	}
	if a.TimestampTolerance <= 0 {
		a.TimestampTolerance = caddy.Duration(DefaultTimestampTolerance)
	}
	if a.JobTTL <= 0 {
		a.JobTTL = caddy.Duration(DefaultJobTTL)
	}
	if _, err := settlelog.ParseMode(a.Durability); err != nil {
		return err
	}
	if a.GroupCommit != "" && a.GroupCommit != "paced" && a.GroupCommit != "eager" {
		return fmt.Errorf("group_commit %q: want paced or eager", a.GroupCommit)
	}
	if a.FlushInterval < 0 {
		return fmt.Errorf("flush_interval %s: must be positive", time.Duration(a.FlushInterval))
	}
	if a.ResultMaxBytes <= 0 {
		a.ResultMaxBytes = DefaultResultMaxBytes
	}
	if a.MaxBodyBytes <= 0 {
		a.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if a.UsageMaxBodyBytes <= 0 {
		a.UsageMaxBodyBytes = DefaultUsageMaxBodyBytes
	}
	if a.PublicURL != "" {
		a.PublicURL = strings.TrimRight(a.PublicURL, "/")
		if !strings.HasPrefix(a.PublicURL, "http://") && !strings.HasPrefix(a.PublicURL, "https://") {
			return fmt.Errorf("public_url '%s' must be an http or https URL", catalog.ShownURL(a.PublicURL))
		}
	}
	return nil
}
