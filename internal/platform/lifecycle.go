package platform

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/settlelog"
)

// stores shares one open bbolt file per path across config reloads: Caddy
// provisions the new config before cleaning up the old one, so the
// reference count goes 1→2→1 and the file is never closed mid-reload.
var stores = caddy.NewUsagePool()

// pooledStore is the store shared by every config that names it (a bbolt
// file, or a PostgreSQL database as this node), with what lives as long as
// it: when each key was last used.
type pooledStore struct {
	store.Store
	used     *ops.KeyUse
	outcomes *outcomeFlusher
}

// Destruct flushes the counted call outcomes into the store, then closes
// it.
func (p pooledStore) Destruct() error {
	p.outcomes.close()
	return p.Store.Close()
}

// Provision compiles the catalog and settles which store file this config
// serves, without opening it: `caddy validate` provisions too, and must
// neither wait for the running server's lock nor create a file. The store
// is opened (or shared with the running config) in Start.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	a.ctx = ctx
	if err := a.defaults(); err != nil {
		return err
	}
	a.headers = NewHeaders(a.HeaderBrand)
	repl := caddy.NewReplacer()
	cat, err := catalog.Compile(a.Services, func(s string) (string, error) {
		return repl.ReplaceOrErr(s, true, true)
	})
	if err != nil {
		return fmt.Errorf("platform catalog: %w", err)
	}
	a.catalog = cat
	for _, pair := range cat.SharedSecrets() {
		a.logger.Warn("two services share a secret, so each can sign usage reports, job updates and pre-flight requests as the other; give each service a secret of its own",
			zap.String("service", pair[0]), zap.String("shares_secret_with", pair[1]))
	}
	for _, svc := range a.Services {
		for _, p := range svc.Products {
			for _, w := range p.Warnings() {
				a.logger.Warn("product bills nothing here: "+w, zap.String("service", svc.ID), zap.String("product", p.ID))
			}
		}
	}
	if a.openAPI, err = loadOpenAPI(cat); err != nil {
		return fmt.Errorf("platform catalog: %w", err)
	}
	if a.jwt, err = a.JWT.verifier(repl, a.Now); err != nil {
		return fmt.Errorf("platform jwt: %w", err)
	}
	if err := a.provisionAlerts(repl); err != nil {
		return err
	}

	a.storePath = ResolveStorePath(a.Store)
	if a.StorePostgres != nil {
		if err := a.StorePostgres.provision(repl); err != nil {
			return err
		}
		a.storePath = a.StorePostgres.identity()
	}
	if running := runningApp(); running != nil && running.storePath != a.storePath {
		return fmt.Errorf("platform store %s: the running config serves store %s, and a reload never switches stores "+
			"(every key, subscription and credit lives in the store); restart the gateway to change stores, or keep "+
			"store %s (a {$VAR} placeholder takes the environment of whoever adapts the config; see docs/operations.md)",
			a.storePath, running.storePath, running.storePath)
	}
	a.metrics = newMetrics(ctx.GetMetricsRegistry())
	a.limiters, a.claims = newLimiterSet()
	a.rt = a.newRuntime()
	a.ops = ops.New(a.rt, a.keyLastUsed)
	if err := a.provisionPayments(repl); err != nil {
		return err
	}
	a.stop = make(chan struct{})
	return nil
}

// ResolveStorePath is the file a store setting names: a relative path is
// under Caddy's data directory (of the server, not of whoever runs a
// command), so the same config always names the same file.
func ResolveStorePath(p string) string {
	if !filepath.IsAbs(p) {
		p = filepath.Join(caddy.AppDataDir(), p)
	}
	return filepath.Clean(p)
}

// strandedStore refuses to start a new store at path (setting resolved)
// when setting is relative and names an existing file under the working
// directory: where gateways before relative paths were taken under Caddy's
// data directory kept it. After such an upgrade the same setting names a
// missing file, and an empty store started there would turn every key into
// invalid_key and hide every credit (the switch a reload is refused for).
func strandedStore(setting, path string) error {
	if filepath.IsAbs(setting) {
		return nil
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	old, err := filepath.Abs(setting)
	if err != nil || old == path {
		return nil
	}
	if st, err := os.Stat(old); err != nil || !st.Mode().IsRegular() {
		return nil
	}
	return fmt.Errorf("platform store %s does not exist, but %s does: a relative store path is under Caddy's data directory, "+
		"and gateways before took it under the working directory; an empty store is not started in its place. "+
		"Stop the gateway, move %s to %s, with its .ledger directory and any settlement log segments beside it "+
		"(or set store to the absolute path of the file to serve) and start it again; see docs/operations.md",
		path, old, old, path)
}

// openStore opens the store (the bbolt file, or the PostgreSQL database
// as this node), or shares the one the running config has open. Start
// calls it; so does DataStore when a request comes in before this app has
// started (Caddy starts apps in no set order).
func (a *App) openStore() (store.Store, error) {
	a.storeMu.Lock()
	defer a.storeMu.Unlock()
	if h := a.held.Load(); h != nil {
		return h.Store, nil
	}
	if a.cleanedUp {
		// A reference taken now would never be dropped.
		return nil, fmt.Errorf("platform store %s: this config has been unloaded", a.storePath)
	}
	path := a.storePath
	val, _, err := stores.LoadOrNew(path, func() (caddy.Destructor, error) {
		if a.StorePostgres != nil {
			mode, err := settlelog.ParseMode(a.Durability)
			if err != nil {
				return nil, err
			}
			s, err := a.StorePostgres.open(a.logger.Named("store"), mode, time.Duration(a.FlushInterval), a.GroupCommit == "eager")
			if err != nil {
				return nil, err
			}
			return pooledStore{s, ops.NewKeyUse(), startOutcomeFlusher(s, outcomeKeepFile(a.StorePostgres.logDir(), true), a.logger.Named("outcomes"))}, nil
		}
		if err := strandedStore(a.Store, path); err != nil {
			return nil, err
		}
		mode, err := settlelog.ParseMode(a.Durability)
		if err != nil {
			return nil, err
		}
		s, err := boltstore.OpenWith(path, boltstore.Options{Durability: mode, FlushInterval: time.Duration(a.FlushInterval),
			EagerSync: a.GroupCommit == "eager"})
		if err != nil {
			return nil, err
		}
		return pooledStore{s, ops.NewKeyUse(), startOutcomeFlusher(s, outcomeKeepFile(path, false), a.logger.Named("outcomes"))}, nil
	})
	if err != nil {
		return nil, err
	}
	pooled := val.(pooledStore)
	s := pooled.Store
	if h, ok := s.(storeHealth); ok {
		if err := h.Err(); err != nil {
			// Shared with the running config, which found it damaged: only
			// a restart (and the checks of a fresh open) may serve it again.
			stores.Delete(path)
			return nil, err
		}
	}
	a.poolKey = path
	if o, ok := s.(commitObserved); ok {
		o.ObserveCommits(a.metrics.observeCommit)
		o.SetLogger(a.logger.Named("store"))
		o.ObserveWriteFailures(a.metrics.observeWriteFailures)
	}
	a.keyUse.Store(pooled.used)
	a.held.Store(&heldStore{s})
	a.logger.Info("platform ready",
		zap.String("store", path),
		zap.Int("services", a.catalog.Len()),
		zap.String("header_brand", a.HeaderBrand))
	return s, nil
}

// Start opens the store, records in the audit log the settings that
// changed (auditConfig), and launches the background maintenance:
// expiring overdue jobs and forgetting old idempotency keys. A store that
// cannot be opened (damaged, locked by another process) fails the start,
// and so does another process listening on this gateway's addresses
// (ports.go), unless allow_shared_ports says it is meant to.
func (a *App) Start() error {
	if !a.AllowSharedPorts {
		if err := checkSharedPorts(a.ctx); err != nil {
			return fmt.Errorf("platform: %w", err)
		}
	}
	if _, err := a.openStore(); err != nil {
		return err
	}
	// A change of where alerts go or of a retention is in the audit log
	// before the config serves; one that cannot be recorded is not made
	// (a reload is refused and the running config stays).
	if err := a.auditConfig(context.Background()); err != nil {
		return fmt.Errorf("platform: recording the config's changed settings in the audit log: %w", err)
	}
	if err := a.startPayments(); err != nil {
		return err
	}
	a.logServerTimeouts()
	go a.maintain(a.stop)
	go a.sweepSubscriptions(a.stop)
	if a.alerter != nil {
		done, stop := make(chan struct{}), a.stop
		a.alertsDone = done
		go func() {
			defer close(done)
			a.runAlerts(stop)
		}()
	}
	if a.pay != nil {
		// The meter shipper (one node of a fleet at a time, by the store's
		// lease); Stop waits for it to let the lease go.
		a.metersDone = a.pay.StartMeters(a.stop)
	}
	return nil
}

// Stop ends the background maintenance.
func (a *App) Stop() error {
	if a.stop != nil {
		close(a.stop)
		a.stop = nil
	}
	if a.alertsDone != nil {
		<-a.alertsDone // an attempt under way ends (its timeout at most) and is recorded
		a.alertsDone = nil
	}
	if a.metersDone != nil {
		<-a.metersDone // a run under way is cancelled; its plan stays in the cursor
		a.metersDone = nil
	}
	return nil
}

// Cleanup drops this config's reference to the store; the file closes when
// no config uses it any more.
func (a *App) Cleanup() error {
	a.storeMu.Lock()
	defer a.storeMu.Unlock()
	a.cleanedUp = true
	a.releaseLimiters()
	if a.poolKey == "" {
		return nil
	}
	key := a.poolKey
	a.poolKey = ""
	_, err := stores.Delete(key)
	return err
}

// MaintenanceInterval is how often overdue jobs are failed.
var MaintenanceInterval = 30 * time.Second

// IdempotencyRetention is how long an idempotency key is remembered; the
// contract promises at least 24 hours.
const IdempotencyRetention = 48 * time.Hour

func (a *App) maintain(stop <-chan struct{}) {
	t := time.NewTicker(MaintenanceInterval)
	defer t.Stop()
	for {
		a.RunMaintenance(context.Background())
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// JobExpiredMessage is the errorMessage of a job that ran out of time.
const JobExpiredMessage = engine.JobExpiredMessage

// RunMaintenance expires overdue jobs, prunes idempotency keys and
// expires due credit grants once.
func (a *App) RunMaintenance(ctx context.Context) {
	t := a.Now()
	if n, err := a.DataStore().ExpireJobs(ctx, t, JobExpiredMessage); err != nil {
		a.logger.Error("expiring jobs", zap.Error(err))
	} else if n > 0 {
		a.logger.Info("expired jobs", zap.Int("count", n))
		a.metrics.jobStates.WithLabelValues(store.JobFailed).Add(float64(n))
	}
	if _, err := a.DataStore().PruneIdempotency(ctx, t.Add(-IdempotencyRetention)); err != nil {
		a.logger.Error("pruning idempotency keys", zap.Error(err))
	}
	a.pruneLedger(ctx, t)
	a.expireCredits(ctx, t)
}

// Catalog is the compiled service catalog of this config.
func (a *App) Catalog() *catalog.Catalog { return a.catalog }

// DataStore is the shared store of keys, subscriptions, usage and jobs. It
// is open once the app has started; asked before, it opens the store, and
// a store that cannot be opened answers every call with why.
func (a *App) DataStore() store.Store {
	if a.store != nil {
		return a.store
	}
	if h := a.held.Load(); h != nil {
		return h.Store
	}
	s, err := a.openStore()
	if err != nil {
		return boltstore.Unusable(a.storePath, err)
	}
	return s
}

// StorePath is the file of the store this config serves (for PostgreSQL,
// the database and node, without credentials).
func (a *App) StorePath() string { return a.storePath }

// Headers are the branded header names.
func (a *App) Headers() Headers { return a.headers }

// Logger is the app's logger.
func (a *App) Logger() *zap.Logger { return a.logger }

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)

// FromContext returns the platform app of the config being provisioned,
// for the handlers that serve from it; who names the asking module in the
// error.
//
// Every handler of the platform asks, while its server is being
// provisioned: the app gives the servers that host them safe timeouts
// where their operator set none (hardenServers).
func FromContext(ctx caddy.Context, who string) (*App, error) {
	a, err := ctx.App("platform")
	if err != nil {
		return nil, fmt.Errorf("%s needs the platform app: %w", who, err)
	}
	app := a.(*App)
	app.hardenServers(ctx)
	app.answerAtStop(ctx)
	return app, nil
}
