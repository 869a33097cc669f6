package engine

import (
	"sync"
	"sync/atomic"

	"github.com/platformgw/gateway/internal/billing"
)

// Claims follows, for each caller's subscription and endpoint, what its
// calls were charged for (units a backend stated, bytes or seconds
// measured), so that a call holds what it is likely to use rather than
// only the endpoint's cost (docs/wire-contract.md, "Claims past a hard
// limit"). Near a hard limit a call that would be cut short is then
// refused up front instead of served and left partly uncharged.
//
// The estimate rises to a larger call at once and falls an eighth of the
// way to a smaller one. It is kept per caller: one caller's large calls
// never make another's small ones refused. Only callers whose calls were
// charged more than the cost are kept, at most maxClaims of them; when
// full the table starts again (every hold back at the cost, which is
// where a new process starts too): an estimate only makes holds larger,
// never a charge.
type Claims struct {
	mu sync.RWMutex
	m  map[claimKey]*atomic.Int64
	// n is len(m), read without the lock: where no caller's calls ever
	// passed their cost (every PER_REQUEST deployment whose backends
	// state no units), a call's hold costs no lock at all.
	n atomic.Int64
}

type claimKey struct{ user, service, endpoint string }

// maxClaims bounds the table (about 100 bytes an entry).
var maxClaims = 100_000

// NewClaims returns an empty table.
func NewClaims() *Claims { return &Claims{m: map[claimKey]*atomic.Int64{}} }

// Hold is what a call of user on service's endpoint holds: cost, or what
// that caller's recent calls there were charged for when more.
func (c *Claims) Hold(user, service, endpoint string, cost billing.Units) billing.Units {
	if c == nil || c.n.Load() == 0 {
		return cost
	}
	c.mu.RLock()
	v := c.m[claimKey{user, service, endpoint}]
	c.mu.RUnlock()
	if v == nil {
		return cost
	}
	return max(cost, billing.Units(v.Load()))
}

// Note records that a call was charged for units (before any hard limit
// cut it), for the caller's next holds.
func (c *Claims) Note(user, service, endpoint string, cost, units billing.Units) {
	if c == nil || units <= cost && c.n.Load() == 0 {
		return // the common call: charged its cost, and nobody's estimate to lower
	}
	k := claimKey{user, service, endpoint}
	c.mu.RLock()
	v := c.m[k]
	c.mu.RUnlock()
	if v == nil {
		if units <= cost {
			return // the cost holds it already
		}
		c.mu.Lock()
		if v = c.m[k]; v == nil {
			if len(c.m) >= maxClaims {
				clear(c.m)
			}
			v = new(atomic.Int64)
			c.m[k] = v
			c.n.Store(int64(len(c.m)))
		}
		c.mu.Unlock()
	}
	for {
		old := v.Load()
		next := int64(units)
		if next < old {
			next = old - (old-next)/8
		}
		if next == old || v.CompareAndSwap(old, next) {
			return
		}
	}
}
