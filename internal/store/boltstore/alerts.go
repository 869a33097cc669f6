package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
)

// Usage alerts live in three buckets of their own:
//
//	alerts      seq(8) -> Alert            (the record, numbered in firing order)
//	alert_keys  user \0 service \0 period(8) \0 threshold -> seq(8)
//	alerts_due  next attempt(8) seq(8) -> nil   (pending alerts only)
//
// alert_keys is what makes an alert fire once: CreateAlert claims the key
// in the transaction that writes the record, so a second evaluator, or the
// same one after a restart, finds it taken.
var (
	bucketAlerts    = []byte("alerts")
	bucketAlertKeys = []byte("alert_keys")
	bucketAlertsDue = []byte("alerts_due")
)

// alertScanBudget is store.AlertScanBudget, lowered by tests.
var alertScanBudget = store.AlertScanBudget

func alertKey(userID, serviceID string, periodStart time.Time, threshold string) []byte {
	k := append(joinKey(userID, serviceID, ""), u64(uint64(periodStart.Unix()))...)
	return append(append(k, 0), threshold...)
}

func dueKey(at time.Time, seq uint64) []byte {
	return append(u64(uint64(max(at.UnixNano(), 0))), u64(seq)...)
}

func alertSeq(id string) (uint64, bool) {
	n, err := strconv.ParseUint(strings.TrimPrefix(id, "alt_"), 10, 64)
	return n, err == nil && strings.HasPrefix(id, "alt_") && n > 0
}

// CreateAlert records a fired alert once per user, service, period and
// threshold.
func (s *Store) CreateAlert(ctx context.Context, a store.Alert) (store.Alert, error) {
	if err := store.CtxErr(ctx); err != nil {
		return a, err
	}
	var out store.Alert
	err := s.update(func(tx *bolt.Tx) error {
		key := alertKey(a.UserID, a.ServiceID, a.PeriodStart, a.Threshold)
		if seq, err := getRaw(tx, bucketAlertKeys, key); err != store.ErrNotFound {
			if err != nil {
				return err
			}
			if err := getJSON(tx, bucketAlerts, seq, &out); err != nil {
				return err
			}
			return store.ErrExists
		}
		b := tx.Bucket(bucketAlerts)
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		out = a
		out.ID = "alt_" + strconv.FormatUint(seq, 10)
		out.Status = store.AlertPending
		if out.NextAttempt.IsZero() {
			out.NextAttempt = out.Created
		}
		if err := putRaw(tx, bucketAlertKeys, key, u64(seq)); err != nil {
			return err
		}
		if err := putRaw(tx, bucketAlertsDue, dueKey(out.NextAttempt, seq), nil); err != nil {
			return err
		}
		return putJSON(tx, bucketAlerts, u64(seq), out)
	})
	return out, err
}

// HasAlert reports whether the alert was recorded.
func (s *Store) HasAlert(ctx context.Context, userID, serviceID string, periodStart time.Time, threshold string) (bool, error) {
	if err := store.CtxErr(ctx); err != nil {
		return false, err
	}
	var found bool
	err := s.view(func(tx *bolt.Tx) error {
		_, err := getRaw(tx, bucketAlertKeys, alertKey(userID, serviceID, periodStart, threshold))
		if found = err == nil; err == store.ErrNotFound {
			return nil
		}
		return err
	})
	return found, err
}

// DueAlerts returns pending alerts due by now, in order of their next
// attempt.
func (s *Store) DueAlerts(ctx context.Context, now time.Time, limit int) ([]store.Alert, error) {
	if err := store.CtxErr(ctx); err != nil {
		return nil, err
	}
	var out []store.Alert
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketAlertsDue).Cursor()
		end := uint64(max(now.UnixNano(), 0))
		for k, v := c.First(); k != nil && len(out) < limit; k, v = c.Next() {
			if _, err := unseal(bucketAlertsDue, k, v); err != nil {
				return err
			}
			if len(k) != 16 || binary.BigEndian.Uint64(k) > end {
				break
			}
			var a store.Alert
			if err := getJSON(tx, bucketAlerts, k[8:], &a); err != nil {
				return fmt.Errorf("alert %d: %w", binary.BigEndian.Uint64(k[8:]), err)
			}
			out = append(out, a)
		}
		return nil
	})
	return out, err
}

// UpdateAlert records a delivery attempt, unless another sender recorded
// one since attempts were read.
func (s *Store) UpdateAlert(ctx context.Context, a store.Alert, attempts int) (store.Alert, error) {
	if err := store.CtxErr(ctx); err != nil {
		return a, err
	}
	seq, ok := alertSeq(a.ID)
	if !ok {
		return a, store.ErrNotFound
	}
	var out store.Alert
	err := s.update(func(tx *bolt.Tx) error {
		var cur store.Alert
		if err := getJSON(tx, bucketAlerts, u64(seq), &cur); err != nil {
			return err
		}
		if cur.Status != store.AlertPending || cur.Attempts != attempts {
			out = cur
			return store.ErrStale
		}
		due := tx.Bucket(bucketAlertsDue)
		if err := due.Delete(dueKey(cur.NextAttempt, seq)); err != nil {
			return err
		}
		out = cur
		out.Status, out.Attempts, out.LastError = a.Status, a.Attempts, a.LastError
		out.NextAttempt, out.DeliveredAt = a.NextAttempt, a.DeliveredAt
		if out.Status == store.AlertPending {
			if err := putRaw(tx, bucketAlertsDue, dueKey(out.NextAttempt, seq), nil); err != nil {
				return err
			}
		} else {
			out.NextAttempt = time.Time{}
		}
		return putJSON(tx, bucketAlerts, u64(seq), out)
	})
	return out, err
}

// ListAlerts pages through the alerts matching f, newest first.
func (s *Store) ListAlerts(ctx context.Context, f store.AlertFilter, cursor string, limit int) ([]store.Alert, string, error) {
	if err := store.CtxErr(ctx); err != nil {
		return nil, "", err
	}
	before, err := store.DecodeAlertCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	limit = max(limit, 1)
	out := make([]store.Alert, 0, min(limit, 256))
	var next []byte
	err = s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketAlerts).Cursor()
		var k, v []byte
		if before == nil {
			k, v = c.Last()
		} else {
			k, v = c.Seek(before)
			if k == nil {
				k, v = c.Last()
			}
			for k != nil && bytes.Compare(k, before) >= 0 {
				k, v = c.Prev()
			}
		}
		for scanned := 0; k != nil; k, v = c.Prev() {
			if len(out) == limit || scanned == alertScanBudget {
				next = bytes.Clone(before)
				return nil
			}
			scanned++
			before = k
			var a store.Alert
			if err := decodeJSON(bucketAlerts, k, v, &a); err != nil {
				return fmt.Errorf("alert %d: %w", binary.BigEndian.Uint64(k), err)
			}
			if f.Matches(a) {
				out = append(out, a)
			}
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, store.EncodeCursor(next), nil
}

// changeSet collects the subscriptions whose counters or credits the
// commit loop wrote. stage runs inside a write transaction (commit loop
// only); publish, once the commit is over, hands them to the evaluator.
// A commit that failed publishes too: the evaluator then reads an
// unchanged state and finds nothing new, which costs one read.
type changeSet struct {
	// on is set by the first ChangedAccounts: a gateway without alerts
	// never pays for the bookkeeping.
	on     atomic.Bool
	staged map[store.AccountRef]struct{} // commit loop only

	mu      sync.Mutex
	pending map[store.AccountRef]struct{}
	ready   chan struct{}
	once    sync.Once
}

func (c *changeSet) init() {
	c.once.Do(func() { c.ready = make(chan struct{}, 1) })
}

func (c *changeSet) stage(userID, serviceID string) {
	if !c.on.Load() {
		return
	}
	if c.staged == nil {
		c.staged = make(map[store.AccountRef]struct{})
	}
	c.staged[store.AccountRef{UserID: userID, ServiceID: serviceID}] = struct{}{}
}

func (c *changeSet) publish() {
	if len(c.staged) == 0 {
		return
	}
	c.init()
	c.mu.Lock()
	if c.pending == nil {
		c.pending = make(map[store.AccountRef]struct{}, len(c.staged))
	}
	for ref := range c.staged {
		c.pending[ref] = struct{}{}
	}
	c.mu.Unlock()
	clear(c.staged)
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// RequeueChanged puts refs back among the changed subscriptions.
func (s *Store) RequeueChanged(refs []store.AccountRef) {
	if len(refs) == 0 {
		return
	}
	c := &s.changes
	c.init()
	c.mu.Lock()
	if c.pending == nil {
		c.pending = make(map[store.AccountRef]struct{}, len(refs))
	}
	for _, ref := range refs {
		c.pending[ref] = struct{}{}
	}
	c.mu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// ChangedAccounts returns and forgets the subscriptions changed since the
// last call.
func (s *Store) ChangedAccounts() ([]store.AccountRef, <-chan struct{}) {
	c := &s.changes
	c.init()
	c.on.Store(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]store.AccountRef, 0, len(c.pending))
	for ref := range c.pending {
		out = append(out, ref)
	}
	clear(c.pending)
	// What is taken needs no signal; one sent meanwhile for changes taken
	// here costs an empty round.
	select {
	case <-c.ready:
	default:
	}
	return out, c.ready
}
