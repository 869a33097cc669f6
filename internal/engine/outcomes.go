package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// The hourly call outcomes (store.Outcomes) are counted here, in memory,
// and added to the store in batches by Flush: a call costs a hash, a map
// lookup under a shard's read lock and a few atomic adds, and allocates
// only the first time its (hour, user, service, endpoint, product,
// outcome) is seen in a flush interval's hour. A batch that the store did
// not confirm is sent again with the same sequence number, so it is
// counted once; what a process counted since its last confirmed flush is
// lost if it is killed (the ledger, which is written before a call is
// answered, stays exact for what was charged).

// outcomeShards spreads the counters' locks so callers on different cores
// rarely share one.
const outcomeShards = 32

// OutcomeCall is what one call counts under.
type OutcomeCall struct {
	// Hour is the call's UTC hour, in Unix seconds.
	Hour                                   int64
	UserID, ServiceID, EndpointID, Product string
	Outcome                                string
}

type outcomeCell struct {
	calls            atomic.Int64
	gateway, backend [store.LatencyBuckets]atomic.Int64
	gatewaySum       atomic.Int64
	backendSum       atomic.Int64
}

type outcomeShard struct {
	mu    sync.RWMutex
	cells map[OutcomeCall]*outcomeCell
	_     [64]byte // a shard's lock on a cache line of its own
}

// OutcomeCounter counts call outcomes between flushes. Make it with
// NewOutcomeCounter; the platform app shares one across reloads and
// flushes it into the store it serves.
type OutcomeCounter struct {
	seed   maphash.Seed
	shards [outcomeShards]outcomeShard

	flushMu sync.Mutex
	writer  string
	seq     uint64
	pending *store.OutcomeBatch // sent, and not known to be applied
	// kept are batches an earlier process could not add by its stop,
	// read from keptPath (LoadKept): sent, in order, before anything
	// counted here (outcomes_keep.go).
	kept     []store.OutcomeBatch
	keptPath string
}

// NewOutcomeCounter returns an empty counter with a writer name of its
// own, new at each start, so its sequence numbers never meet an earlier
// process's.
func NewOutcomeCounter() *OutcomeCounter {
	var b [12]byte
	rand.Read(b[:])
	c := &OutcomeCounter{seed: maphash.MakeSeed(), writer: hex.EncodeToString(b[:])}
	for i := range c.shards {
		c.shards[i].cells = make(map[OutcomeCall]*outcomeCell)
	}
	return c
}

// Count counts one call: gateway is the time the gateway added, backend
// the time spent in the backend (zero if the call never reached it, and
// then it is left out of the backend's histogram).
func (c *OutcomeCounter) Count(k OutcomeCall, gateway, backend time.Duration) {
	// The shard by the user and the endpoint: maphash.Comparable would
	// move k to the heap on every call.
	sh := &c.shards[(maphash.String(c.seed, k.UserID)+maphash.String(c.seed, k.EndpointID))%outcomeShards]
	gw := gateway.Microseconds()
	be := backend.Microseconds()
	sh.mu.RLock()
	cell := sh.cells[k]
	if cell == nil {
		sh.mu.RUnlock()
		cell = sh.insert(k)
		sh.mu.RLock()
		if sh.cells[k] != cell { // drained and dropped in between
			sh.mu.RUnlock()
			c.Count(k, gateway, backend)
			return
		}
	}
	// Added under the read lock: a flush drains under the write lock, so
	// no count lands in a cell it has dropped.
	cell.calls.Add(1)
	cell.gateway[store.LatencyBucket(gw)].Add(1)
	cell.gatewaySum.Add(gw)
	if backend > 0 {
		cell.backend[store.LatencyBucket(be)].Add(1)
		cell.backendSum.Add(be)
	}
	sh.mu.RUnlock()
}

func (sh *outcomeShard) insert(k OutcomeCall) *outcomeCell {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	cell := sh.cells[k]
	if cell == nil {
		cell = new(outcomeCell)
		sh.cells[k] = cell
	}
	return cell
}

// drain takes every count out of the counter as rows, dropping the cells
// of hours before now's (a new call of such an hour makes its cell
// again).
func (c *OutcomeCounter) drain(now time.Time) []store.OutcomeRow {
	cur := now.Unix() / 3600 * 3600
	var rows []store.OutcomeRow
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for k, cell := range sh.cells {
			if n := cell.calls.Swap(0); n > 0 {
				r := store.OutcomeRow{OutcomeKey: store.OutcomeKey{Hour: time.Unix(k.Hour, 0).UTC(), UserID: k.UserID,
					ServiceID: k.ServiceID, EndpointID: k.EndpointID, ProductID: k.Product, Outcome: k.Outcome}, Calls: n}
				for b := range cell.gateway {
					r.Gateway.Buckets[b] = cell.gateway[b].Swap(0)
					r.Backend.Buckets[b] = cell.backend[b].Swap(0)
				}
				r.Gateway.SumMicros = cell.gatewaySum.Swap(0)
				r.Backend.SumMicros = cell.backendSum.Swap(0)
				rows = append(rows, r)
			}
			if k.Hour < cur {
				delete(sh.cells, k)
			}
		}
		sh.mu.Unlock()
	}
	return rows
}

// Flush adds what was counted since the last flush to s as one batch. A
// batch s did not confirm (an error) is kept and sent first, with the same
// sequence number, on the next Flush; counts made meanwhile wait for the
// batch after it. Batches an earlier process kept at its stop (LoadKept)
// go before all of them.
func (c *OutcomeCounter) Flush(ctx context.Context, s store.Outcomes, now time.Time) error {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	if err := c.sendKept(ctx, s); err != nil {
		return err
	}
	for range 2 { // the batch left over, then a fresh one
		fresh := c.pending == nil
		if fresh {
			rows := c.drain(now)
			if len(rows) == 0 {
				return nil
			}
			c.seq++
			c.pending = &store.OutcomeBatch{Writer: c.writer, Seq: c.seq, Rows: rows}
		}
		if _, err := s.AddOutcomes(ctx, *c.pending); err != nil {
			if errors.Is(err, store.ErrBadOutcomeBatch) {
				c.pending = nil // never accepted: sending it again would stop every batch after it
			}
			return err
		}
		c.pending = nil
		if fresh {
			return nil
		}
	}
	return nil
}

// CountOutcome counts an invoke call's outcome, when the runtime counts
// outcomes.
func (rt *Runtime) CountOutcome(k OutcomeCall, gateway, backend time.Duration) {
	if rt.Outcomes != nil {
		rt.Outcomes.Count(k, gateway, backend)
	}
}
