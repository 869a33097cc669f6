// Package engine is the gateway's plain runtime: the values the request
// handlers (platformgw, usagehandler) serve from, with no Caddy in them.
// The platform app builds one Runtime per config in its Provision (the
// catalog it compiled, the store it shares across reloads, the rate
// limiters, the metrics, the clock and the limits of its settings) and
// the handlers' Provision only takes it; everything a request does goes
// through the Runtime's fields and methods. Unit tests build a Runtime
// directly (New) around a real store, with no Caddy server.
package engine

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/jwtauth"
	"github.com/platformgw/gateway/internal/store"
)

// JobExpiredMessage is the errorMessage of a job that ran out of time.
const JobExpiredMessage = "job expired: no completion within its time limit"

// ErrJobFinished stops a job update (store.Jobs.UpdateJob, CompleteJob)
// that found the job COMPLETED or FAILED already: nothing is written. The
// gateway's failJob then leaves the backend's own ending in place; the
// usage routes answer 409 request_already_completed.
var ErrJobFinished = errors.New("job already finished")

// Limits are the size and time limits of the platform block's settings,
// with their defaults applied.
type Limits struct {
	// MaxBodyBytes caps an invoke request body (max_body_bytes).
	MaxBodyBytes int64
	// UsageMaxBodyBytes caps usage and core request bodies
	// (usage_max_body_bytes).
	UsageMaxBodyBytes int64
	// ResultMaxBytes caps an inline job result (result_max_bytes).
	ResultMaxBytes int
	// JobTTL is how long an async job may stay unfinished (job_ttl).
	JobTTL time.Duration
	// TimestampTolerance is how far a signed timestamp may be from now
	// (timestamp_tolerance).
	TimestampTolerance time.Duration
}

// Runtime is what the request handlers serve from. Its fields are set
// once, before the first request, and never changed afterwards.
type Runtime struct {
	// Catalog is the compiled service catalog.
	Catalog *catalog.Catalog
	// Headers are the brand's header names.
	Headers Headers
	// Prefixes the routes are served under.
	Prefixes Prefixes
	// PublicURL is the base URL of async jobs' URLs; "" builds them from
	// the caller's Host when the server knows it.
	PublicURL string
	// Limits are the size and time limits.
	Limits Limits
	// JWT verifies end users' JWTs; nil when none are accepted.
	JWT *jwtauth.Verifier
	// Logger is the runtime's logger (key lookups that failed).
	Logger *zap.Logger
	// Clock is the time; time.Now when nil.
	Clock func() time.Time
	// Data is the store, when it is open already (tests); OpenStore, when
	// set, is asked instead on every use (the platform app opens its
	// store in Start, after the handlers are provisioned).
	Data      store.Store
	OpenStore func() store.Store
	// KeyUsed, when set, is told when a service key authenticated a
	// request (the console's "last used").
	KeyUsed func(keyID string, at time.Time)
	// Limiters are the rate limiters' token buckets.
	Limiters *Limiters
	// Metrics are the Prometheus collectors.
	Metrics *Metrics
	// Calls are the recent call figures of the console's overview; nil
	// keeps none.
	Calls *Calls
	// Outcomes count every invoke call's outcome for the store's hourly
	// call outcomes (outcomes.go); nil counts none.
	Outcomes *OutcomeCounter
	// Claims are what callers' calls were recently charged for, which
	// their next calls hold (claims.go); nil holds the endpoint's cost.
	Claims *Claims
}

// New fills what rt leaves empty (a no-op logger, time.Now, fresh rate
// limiters, the shared metrics registered nowhere, the default prefixes
// and header names) and returns it. A Runtime needs a catalog and a store.
func New(rt Runtime) *Runtime {
	if rt.Logger == nil {
		rt.Logger = zap.NewNop()
	}
	if rt.Clock == nil {
		rt.Clock = time.Now
	}
	if rt.Limiters == nil {
		rt.Limiters = NewLimiters()
	}
	if rt.Metrics == nil {
		rt.Metrics = SharedMetrics(nil)
	}
	if rt.Claims == nil {
		rt.Claims = NewClaims()
	}
	if rt.Headers == (Headers{}) {
		rt.Headers = NewHeaders("Platform")
	}
	if rt.Prefixes.Gateway == nil && rt.Prefixes.Usage == nil && rt.Prefixes.Core == nil {
		rt.Prefixes = DefaultPrefixes()
	}
	return &rt
}

// HoldUnits is what a call of the account on endpoint ep holds before it
// is forwarded: the endpoint's cost, or what the caller's recent calls
// there were charged for when more (Claims).
func (rt *Runtime) HoldUnits(a store.Account, ep *catalog.Endpoint) billing.Units {
	return rt.Claims.Hold(a.UserID, a.ServiceID, ep.ID, ep.UnitCost())
}

// NoteCharge tells Claims what a call of the account on ep was charged
// for (before any hard limit cut it).
func (rt *Runtime) NoteCharge(a store.Account, ep *catalog.Endpoint, units billing.Units) {
	rt.Claims.Note(a.UserID, a.ServiceID, ep.ID, ep.UnitCost(), units)
}

// Now is the runtime's clock.
func (rt *Runtime) Now() time.Time { return rt.Clock() }

// Store is the store of keys, subscriptions, usage and jobs.
func (rt *Runtime) Store() store.Store {
	if rt.OpenStore != nil {
		return rt.OpenStore()
	}
	return rt.Data
}

// The store as each step of a request uses it: key authentication reads
// store.Keys, admission store.Subscriptions, reservation and settlement
// store.Meter, async jobs store.Jobs. A function that takes one of them
// says what it may touch, and a test may hand it a store of its own.

// Keys is the store's service keys.
func (rt *Runtime) Keys() store.Keys { return rt.Store() }

// Subscriptions is the store's subscriptions and credits.
func (rt *Runtime) Subscriptions() store.Subscriptions { return rt.Store() }

// Meter is the store's holds, settlements, reports and period state.
func (rt *Runtime) Meter() store.Meter { return rt.Store() }

// Jobs is the store's async jobs.
func (rt *Runtime) Jobs() store.Jobs { return rt.Store() }
