package platform

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/catalog"
	"github.com/platformgw/gateway/store"
	"github.com/platformgw/gateway/store/boltstore"
)

// stores shares one open bbolt file per path across config reloads: Caddy
// provisions the new config before cleaning up the old one, so the
// reference count goes 1→2→1 and the file is never closed mid-reload.
var stores = caddy.NewUsagePool()

type pooledStore struct{ *boltstore.Store }

func (p pooledStore) Destruct() error { return p.Store.Close() }

// now is the clock of the app; tests replace it.
var now = time.Now

// Provision compiles the catalog and opens (or shares) the store.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
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

	path, err := filepath.Abs(a.Store)
	if err != nil {
		return fmt.Errorf("store path %s: %w", a.Store, err)
	}
	path = filepath.Clean(path)
	val, _, err := stores.LoadOrNew(path, func() (caddy.Destructor, error) {
		s, err := boltstore.Open(path)
		if err != nil {
			return nil, err
		}
		return pooledStore{s}, nil
	})
	if err != nil {
		return err
	}
	a.poolKey = path
	a.bolt = val.(pooledStore).Store
	a.store = a.bolt
	a.metrics = newMetrics(ctx.GetMetricsRegistry())
	a.bolt.ObserveCommits(a.metrics.observeCommit)
	a.bolt.SetLogger(a.logger.Named("store"))
	a.bolt.ObserveWriteFailures(a.metrics.observeWriteFailures)
	a.limiters = newLimiterSet()
	a.stop = make(chan struct{})
	a.logger.Info("platform ready",
		zap.String("store", path),
		zap.Int("services", cat.Len()),
		zap.String("header_brand", a.HeaderBrand))
	return nil
}

// Start launches the background maintenance: expiring overdue jobs and
// forgetting old idempotency keys.
func (a *App) Start() error {
	go a.maintain(a.stop)
	return nil
}

// Stop ends the background maintenance.
func (a *App) Stop() error {
	if a.stop != nil {
		close(a.stop)
		a.stop = nil
	}
	return nil
}

// Cleanup drops this config's reference to the store; the file closes when
// no config uses it any more.
func (a *App) Cleanup() error {
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
const JobExpiredMessage = "job expired: no completion within its time limit"

// RunMaintenance expires overdue jobs and prunes idempotency keys once.
func (a *App) RunMaintenance(ctx context.Context) {
	t := now()
	if n, err := a.store.ExpireJobs(ctx, t, JobExpiredMessage); err != nil {
		a.logger.Error("expiring jobs", zap.Error(err))
	} else if n > 0 {
		a.logger.Info("expired jobs", zap.Int("count", n))
		a.metrics.jobStates.WithLabelValues(store.JobFailed).Add(float64(n))
	}
	if _, err := a.store.PruneIdempotency(ctx, t.Add(-IdempotencyRetention)); err != nil {
		a.logger.Error("pruning idempotency keys", zap.Error(err))
	}
}

// Catalog is the compiled service catalog of this config.
func (a *App) Catalog() *catalog.Catalog { return a.catalog }

// DataStore is the shared store of keys, subscriptions, usage and jobs.
func (a *App) DataStore() store.Store { return a.store }

// Headers are the branded header names.
func (a *App) Headers() Headers { return a.headers }

// Logger is the app's logger.
func (a *App) Logger() *zap.Logger { return a.logger }

// Now is the app's clock.
func (a *App) Now() time.Time { return now() }

// SetClock replaces the clock of every platform app (tests only).
func SetClock(fn func() time.Time) { now = fn }

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)

// FromContext returns the platform app of the config being provisioned,
// for the handlers that serve from it; who names the asking module in the
// error.
func FromContext(ctx caddy.Context, who string) (*App, error) {
	a, err := ctx.App("platform")
	if err != nil {
		return nil, fmt.Errorf("%s needs the platform app: %w", who, err)
	}
	return a.(*App), nil
}
