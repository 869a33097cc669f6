package boltstore

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// health tracks whether the store file takes writes. A commit that fails
// (a full disk, an I/O error) marks it unhealthy. While it is unhealthy a
// hold is refused at once with store.ErrUnavailable, so no call is
// forwarded whose charge cannot be recorded, except one probe per
// probeInterval: it first writes and syncs probeBytes to a scratch file
// beside the store, then holds as usual but waits for its commit to be
// durable before its caller is told. Only a probe that gets through both
// makes the store healthy again. A small commit alone proves nothing: on a
// full disk bbolt still commits a hold into pages it already has, and the
// next settlement, which appends to the ledger, fails; letting every call
// through after such a commit served a batch of calls unpaid each time.
//
// Failures are logged once per burst: the first with its error, then at
// most one line per logInterval with the count, and one when writes
// succeed again. During a full disk the store fails every write, and a
// line per write was tens of thousands of lines a second.
type health struct {
	unhealthy atomic.Bool
	lastProbe atomic.Int64 // unix nanoseconds of the last probe let through
	failed    atomic.Uint64

	mu         sync.Mutex
	logger     *zap.Logger
	observer   func(writes int)
	burst      uint64    // writes failed in this burst
	unlogged   uint64    // of which not yet in a log line
	lastLogged time.Time // of the last failure line
	// settlements that failed, by reservation id, retried once writes
	// succeed again
	pending map[string]pendingSettle
}

// pendingSettle is a Settle to retry.
type pendingSettle struct {
	r     store.Reservation
	units billing.Units
	e     store.LedgerEntry
}

// maxPending bounds the settlements remembered; the holds of the rest are
// released at the next start, as after a crash.
const maxPending = 1 << 16

// unsettled remembers a settlement that could not be written; a later one
// of the same hold replaces it.
func (h *health) unsettled(p pendingSettle) {
	h.mu.Lock()
	if h.pending == nil {
		h.pending = make(map[string]pendingSettle)
	}
	if _, ok := h.pending[p.r.ID]; ok || len(h.pending) < maxPending {
		h.pending[p.r.ID] = p
	}
	h.mu.Unlock()
}

// settled forgets a settlement to retry once a later attempt of the same
// hold succeeded (a release that needs no write).
func (h *health) settled(id string) {
	h.mu.Lock()
	if h.pending != nil {
		delete(h.pending, id)
	}
	h.mu.Unlock()
}

// probeInterval is how often one hold is let through to test an unhealthy
// store; logInterval how often a failure burst is summed up in the log.
var (
	probeInterval = time.Second
	probeBytes    = 1 << 20
	logInterval   = 10 * time.Second
	healthNow     = time.Now
)

// SetLogger sets where write failures are logged (rate-limited).
// The first logger set is also told what Open found worth saying: a torn
// record dropped from the end of the settlement log, the ledger bucket
// moved into the ledger directory, the directories of an interrupted
// backup or restore removed, the records of an earlier build's store
// given their checksum. The ledger logs through it too.
func (s *Store) SetLogger(l *zap.Logger) {
	s.health.mu.Lock()
	s.health.logger = l
	note, moved, stale, sealed := s.startNote, s.ledgerNote, s.staleNote, s.sealNote
	s.startNote, s.ledgerNote, s.staleNote, s.sealNote = "", "", "", ""
	s.health.mu.Unlock()
	if s.led != nil {
		s.led.SetLogger(l)
	}
	if l == nil {
		return
	}
	if note != "" {
		l.Warn(note)
	}
	if moved != "" {
		l.Info(moved)
	}
	if sealed != "" {
		l.Info(sealed)
	}
	switch {
	case stale != "" && s.staleWarn:
		l.Warn(stale)
	case stale != "":
		l.Info(stale)
	}
}

// ObserveWriteFailures sets a function told how many writes each failed
// commit took down (for an exact metric).
func (s *Store) ObserveWriteFailures(fn func(writes int)) {
	s.health.mu.Lock()
	s.health.observer = fn
	s.health.mu.Unlock()
}

// WriteFailures is how many writes failed to commit since Open.
func (s *Store) WriteFailures() uint64 { return s.health.failed.Load() }

// Healthy tells whether the last commit succeeded.
func (s *Store) Healthy() bool { return !s.health.unhealthy.Load() }

// admitHold tells whether a hold may be queued now, and whether it must
// wait for its commit to be durable (a probe of an unhealthy store).
func (s *Store) admitHold() (ok, probe bool) {
	h := &s.health
	if !h.unhealthy.Load() {
		return true, false
	}
	now := healthNow().UnixNano()
	last := h.lastProbe.Load()
	if now-last < int64(probeInterval) || !h.lastProbe.CompareAndSwap(last, now) {
		return false, false
	}
	return s.roomToWrite() == nil, true
}

// roomToWrite writes and syncs probeBytes to a scratch file in the store's
// directory, then removes it.
func (s *Store) roomToWrite() error {
	f, err := os.CreateTemp(filepath.Dir(s.path), ".platform-probe-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 64<<10)
	for n := 0; n < probeBytes; n += len(buf) {
		if _, err := f.Write(buf); err != nil {
			return err
		}
	}
	return f.Sync()
}

// commitFailed records a failed commit that took writes down with it and
// returns the error the writers get: it wraps store.ErrUnavailable.
func (h *health) commitFailed(writes int, err error) error {
	if !h.unhealthy.Swap(true) {
		h.lastProbe.Store(healthNow().UnixNano()) // the first probe after an interval
	}
	h.failed.Add(uint64(writes))
	h.mu.Lock()
	h.burst += uint64(writes)
	h.unlogged += uint64(writes)
	now := healthNow()
	switch {
	case h.burst == h.unlogged && h.lastLogged.IsZero():
		h.logf(func(l *zap.Logger) {
			l.Error("store write failed; holds for new calls are refused until a write succeeds",
				zap.Int("writes", writes), zap.Error(err))
		})
		h.unlogged, h.lastLogged = 0, now
	case now.Sub(h.lastLogged) >= logInterval:
		n, since := h.unlogged, now.Sub(h.lastLogged)
		h.logf(func(l *zap.Logger) {
			l.Error(fmt.Sprintf("%d store writes failed in the last %s", n, since.Round(time.Second)),
				zap.Uint64("failed_writes", n), zap.Error(err))
		})
		h.unlogged, h.lastLogged = 0, now
	}
	observe := h.observer
	h.mu.Unlock()
	if observe != nil {
		observe(writes)
	}
	if errors.Is(err, store.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}

// recovered clears an unhealthy state after a probe got through and
// returns the settlements left to retry, in the order of their holds (a
// map's order would lay the log out differently from run to run, and the
// storage simulation replays a seed bit for bit).
func (h *health) recovered() []pendingSettle {
	if !h.unhealthy.Load() {
		return nil
	}
	h.unhealthy.Store(false)
	h.mu.Lock()
	n := h.burst
	h.burst, h.unlogged, h.lastLogged = 0, 0, time.Time{}
	h.logf(func(l *zap.Logger) {
		l.Warn("store writes succeed again", zap.Uint64("failed_writes", n), zap.Int("holds_to_release", len(h.pending)))
	})
	pending := slices.SortedFunc(maps.Values(h.pending), func(a, b pendingSettle) int {
		return cmp.Or(cmp.Compare(len(a.r.ID), len(b.r.ID)), cmp.Compare(a.r.ID, b.r.ID))
	})
	h.pending = nil
	h.mu.Unlock()
	return pending
}

func (h *health) logf(fn func(*zap.Logger)) {
	if h.logger != nil {
		fn(h.logger)
	}
}
