package boltstore

import (
	"slices"
	"sync"

	"github.com/platformgw/gateway/internal/store"
)

// cacheMax bounds each kind of cached record, so a store of a million
// keys keeps a bounded working set in memory and not the whole bucket.
const cacheMax = 1 << 16

// Jobs are cached for their callers' status polls: fewer of them, and only
// those whose inline result is small, so the cache stays a few MiB.
const (
	jobCacheMax       = 1 << 13
	jobCacheMaxResult = 1 << 10
)

// readCache holds service keys, subscriptions and async jobs as last
// committed, so the lookups every call makes (its key, its subscription,
// a caller polling its job) skip a read transaction and a JSON decode.
//
// The commit loop is the only writer of both. Whatever a commit wrote is
// dropped from the cache after the commit and before any of its writers is
// answered, so once RevokeKey returns, the very next call reads the key
// afresh and is refused. A reader that missed must not put back what it
// read from a snapshot older than such a drop: every drop bumps the
// generation of its kind, and a fill is accepted only while the generation
// is still the one the reader saw before it opened its read transaction.
type readCache struct {
	mu     sync.RWMutex
	keyGen uint64
	subGen uint64
	jobGen uint64
	keys   map[[32]byte]store.KeyRecord
	subs   map[string]store.Subscription // subKey(user, service)
	jobs   map[string]store.Job
}

func newReadCache() *readCache {
	return &readCache{keys: make(map[[32]byte]store.KeyRecord), subs: make(map[string]store.Subscription),
		jobs: make(map[string]store.Job)}
}

// job returns a cached job, or the generation to fill it with.
func (c *readCache) job(id string) (store.Job, bool, uint64) {
	c.mu.RLock()
	j, ok := c.jobs[id]
	gen := c.jobGen
	c.mu.RUnlock()
	return j, ok, gen
}

// fillJob caches a job read in a transaction opened after job returned
// gen, unless its inline result is large.
func (c *readCache) fillJob(j store.Job, gen uint64) {
	if len(j.Result) > jobCacheMaxResult {
		return
	}
	c.mu.Lock()
	if c.jobGen == gen {
		if len(c.jobs) >= jobCacheMax {
			for id := range c.jobs {
				delete(c.jobs, id)
				break
			}
		}
		c.jobs[j.ID] = j
	}
	c.mu.Unlock()
}

// key returns a cached key record, or the generation to fill it with.
func (c *readCache) key(hash [32]byte) (store.KeyRecord, bool, uint64) {
	c.mu.RLock()
	k, ok := c.keys[hash]
	gen := c.keyGen
	c.mu.RUnlock()
	return k, ok, gen
}

// fillKey caches a key record read in a transaction opened after key
// returned gen. Roles are clipped so a caller appending to them copies
// instead of writing into the cached array.
func (c *readCache) fillKey(k store.KeyRecord, gen uint64) {
	k.Roles = slices.Clip(k.Roles)
	c.mu.Lock()
	if c.keyGen == gen {
		if len(c.keys) >= cacheMax {
			for h := range c.keys { // map order is random: evict any one
				delete(c.keys, h)
				break
			}
		}
		c.keys[k.Hash] = k
	}
	c.mu.Unlock()
}

// sub returns a cached subscription, or the generation to fill it with.
func (c *readCache) sub(key []byte) (store.Subscription, bool, uint64) {
	c.mu.RLock()
	s, ok := c.subs[string(key)]
	gen := c.subGen
	c.mu.RUnlock()
	return s, ok, gen
}

// fillSub caches a subscription read in a transaction opened after sub
// returned gen.
func (c *readCache) fillSub(key []byte, s store.Subscription, gen uint64) {
	c.mu.Lock()
	if c.subGen == gen {
		if len(c.subs) >= cacheMax {
			for k := range c.subs {
				delete(c.subs, k)
				break
			}
		}
		c.subs[string(key)] = s
	}
	c.mu.Unlock()
}

// drop forgets what a commit wrote.
func (c *readCache) drop(keys [][32]byte, subs map[string]struct{}, jobs []string) {
	if len(keys) == 0 && len(subs) == 0 && len(jobs) == 0 {
		return
	}
	c.mu.Lock()
	if len(jobs) > 0 {
		c.jobGen++
		for _, id := range jobs {
			delete(c.jobs, id)
		}
	}
	if len(keys) > 0 {
		c.keyGen++
		for _, h := range keys {
			delete(c.keys, h)
		}
	}
	if len(subs) > 0 {
		c.subGen++
		for k := range subs {
			delete(c.subs, k)
		}
	}
	c.mu.Unlock()
}

// written is what the transactions of one commit wrote to cached buckets.
// Only the commit loop touches it.
type written struct {
	keys [][32]byte
	subs map[string]struct{}
	jobs []string
}

func (w *written) job(id string) { w.jobs = append(w.jobs, id) }

func (w *written) key(hash [32]byte) { w.keys = append(w.keys, hash) }

func (w *written) sub(key []byte) {
	if w.subs == nil {
		w.subs = make(map[string]struct{})
	}
	w.subs[string(key)] = struct{}{}
}

func (w *written) hasSub(key []byte) bool {
	_, ok := w.subs[string(key)]
	return ok
}

// flush drops what was written from the cache and starts afresh.
func (w *written) flush(c *readCache) {
	c.drop(w.keys, w.subs, w.jobs)
	w.keys = w.keys[:0]
	w.jobs = w.jobs[:0]
	clear(w.subs)
}
