package platform

import (
	"context"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// sharedCalls are the recent call figures of the console's overview, kept
// across reloads.
var sharedCalls = new(engine.Calls)

// newRuntime builds what the handlers serve from out of this config's
// settings (defaults applied), catalog, metrics and rate limiters. The
// store is asked for on each use (DataStore), because it is opened in
// Start, after the handlers are provisioned.
func (a *App) newRuntime() *engine.Runtime {
	return engine.New(engine.Runtime{
		Catalog:   a.catalog,
		Headers:   a.headers,
		Prefixes:  *a.Prefixes,
		PublicURL: a.PublicURL,
		Limits: engine.Limits{
			MaxBodyBytes:       a.MaxBodyBytes,
			UsageMaxBodyBytes:  a.UsageMaxBodyBytes,
			ResultMaxBytes:     a.ResultMaxBytes,
			JobTTL:             time.Duration(a.JobTTL),
			TimestampTolerance: time.Duration(a.TimestampTolerance),
		},
		JWT:       a.jwt,
		Logger:    a.logger,
		Clock:     a.Now,
		OpenStore: a.DataStore,
		KeyUsed:   func(id string, at time.Time) { a.keyUse.Load().Touch(id, at) },
		Limiters:  a.limiters,
		Metrics:   a.metrics.Metrics,
		Calls:     sharedCalls,
		Outcomes:  sharedOutcomes,
		Claims:    a.claims,
	})
}

// Runtime is what the platform_gateway and platform_usage handlers serve
// from; set by Provision.
func (a *App) Runtime() *engine.Runtime { return a.rt }

// Ops are the operator's and the caller's operations over the runtime
// (internal/ops): the admin API, the console and the portal run them.
func (a *App) Ops() *ops.Ops { return a.ops }

// keyLastUsed is when key id last authenticated a request, as the pooled
// store's KeyUse remembers (the runtime's KeyUsed feeds it).
func (a *App) keyLastUsed(id string) (time.Time, bool) { return a.keyUse.Load().Get(id) }

// CallStats are the figures of the last minute (engine.CallStats).
type CallStats = engine.CallStats

// RecentCalls returns the invoke calls' figures of the last minute.
func (a *App) RecentCalls() CallStats { return sharedCalls.Recent() }

// AuthenticateServiceKey resolves a service key given as text
// (engine.Runtime.AuthenticateServiceKey); the portal signs in with it.
func (a *App) AuthenticateServiceKey(ctx context.Context, token string) (store.KeyRecord, *apierror.Error) {
	return a.rt.AuthenticateServiceKey(ctx, token)
}
