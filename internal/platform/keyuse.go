package platform

import (
	"sync"
	"sync/atomic"
	"time"
)

// keyUse remembers when each service key last authenticated a request, in
// memory. The store does not record it: a write per call would cost more
// than the call. It is shared by every config on the same store file (it
// lives with the pooled store, so a reload keeps it), starts empty when the
// process starts, and is per node.
type keyUse struct {
	mu   sync.RWMutex
	last map[string]*atomic.Int64 // key id → Unix seconds
}

func newKeyUse() *keyUse { return &keyUse{last: map[string]*atomic.Int64{}} }

// touch records a use of key id at t. A key used again within the same
// second costs a read lock and an atomic load, no write and no allocation.
func (u *keyUse) touch(id string, t time.Time) {
	if u == nil {
		return
	}
	s := t.Unix()
	u.mu.RLock()
	v := u.last[id]
	u.mu.RUnlock()
	if v == nil {
		u.mu.Lock()
		if v = u.last[id]; v == nil {
			v = new(atomic.Int64)
			u.last[id] = v
		}
		u.mu.Unlock()
	}
	if old := v.Load(); old < s {
		v.CompareAndSwap(old, s)
	}
}

// get is when key id last authenticated a request since this process
// started, if it did.
func (u *keyUse) get(id string) (time.Time, bool) {
	if u == nil {
		return time.Time{}, false
	}
	u.mu.RLock()
	v := u.last[id]
	u.mu.RUnlock()
	if v == nil {
		return time.Time{}, false
	}
	return time.Unix(v.Load(), 0).UTC(), true
}

// KeyLastUsed is when the service key id last authenticated a request on
// this gateway since it started (to the second), if it did.
func (a *App) KeyLastUsed(id string) (time.Time, bool) {
	return a.keyUse.Load().get(id)
}
