// Package ops is the operator's and the caller's operations over the
// store and the catalog, with no Caddy in them: creating and revoking
// service keys, setting subscriptions, granting credits, pruning the
// ledger, each validated alike and written to the audit log; and the
// views the admin API, the console, the portal and the CLI share (a key,
// a billing period, a stored record as operators read it, a usage row).
//
// The platform app builds one Ops per config over its engine.Runtime (the
// catalog, the store, the clock and the logger) and serves its admin API
// from it; the console and the portal take the same Ops, so their tests
// build one around a real store with no Caddy server (New).
package ops

import (
	"time"

	"github.com/platformgw/gateway/internal/engine"
)

// Ops are the operations over one runtime. Each returns an
// *apierror.Error for a request the operator (or caller) must correct,
// any other error for a failure of the store.
type Ops struct {
	rt *engine.Runtime
	// lastUsed is when a key last authenticated a request (KeyUse.Get),
	// nil when nobody keeps it.
	lastUsed func(keyID string) (time.Time, bool)
}

// New builds the operations over rt: its catalog, store, clock and
// logger. lastUsed tells when a key last authenticated a request (the
// KeyUse the runtime's KeyUsed feeds); nil knows of none.
func New(rt *engine.Runtime, lastUsed func(keyID string) (time.Time, bool)) *Ops {
	return &Ops{rt: rt, lastUsed: lastUsed}
}

// Runtime is the runtime the operations work over.
func (o *Ops) Runtime() *engine.Runtime { return o.rt }

// KeyLastUsed is when the service key id last authenticated a request on
// this gateway since it started (to the second), if it did.
func (o *Ops) KeyLastUsed(id string) (time.Time, bool) {
	if o.lastUsed == nil {
		return time.Time{}, false
	}
	return o.lastUsed(id)
}
