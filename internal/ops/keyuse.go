package ops

import (
	"sync"
	"sync/atomic"
	"time"
)

// KeyUse remembers when each service key last authenticated a request, in
// memory. The store does not record it: a write per call would cost more
// than the call. The platform app shares one by every config on the same
// store file (it lives with the pooled store, so a reload keeps it); it
// starts empty when the process starts, and is per node.
type KeyUse struct {
	mu   sync.RWMutex
	last map[string]*atomic.Int64 // key id → Unix seconds
}

// NewKeyUse is an empty KeyUse.
func NewKeyUse() *KeyUse { return &KeyUse{last: map[string]*atomic.Int64{}} }

// Touch records a use of key id at t. A key used again within the same
// second costs a read lock and an atomic load, no write and no allocation.
func (u *KeyUse) Touch(id string, t time.Time) {
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

// Get is when key id last authenticated a request since this process
// started, if it did.
func (u *KeyUse) Get(id string) (time.Time, bool) {
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
