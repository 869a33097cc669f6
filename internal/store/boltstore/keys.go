package boltstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// CreateKey stores a new key under its hash, with its audit entries in the
// same transaction.
func (s *Store) CreateKey(ctx context.Context, k store.KeyRecord, audit ...store.AuditEntry) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		keys := tx.Bucket(bucketKeys)
		if keys.Get(k.Hash[:]) != nil || tx.Bucket(bucketKeyIDs).Get([]byte(k.ID)) != nil {
			return fmt.Errorf("key %s: %w", k.ID, store.ErrExists)
		}
		if err := putJSON(tx, bucketKeys, k.Hash[:], toKeyRecord(k)); err != nil {
			return err
		}
		s.written.key(k.Hash)
		if err := putRaw(tx, bucketKeyIDs, []byte(k.ID), k.Hash[:]); err != nil {
			return err
		}
		if err := putRaw(tx, bucketKeyUsers, joinKey(k.UserID, k.ID), k.Hash[:]); err != nil {
			return err
		}
		return appendAudit(tx, slices.Clone(audit))
	})
}

func readKey(tx *bolt.Tx, hash []byte) (store.KeyRecord, error) {
	var rec keyRecord
	if err := getJSON(tx, bucketKeys, hash, &rec); err != nil {
		return store.KeyRecord{}, err
	}
	k := rec.key()
	copy(k.Hash[:], hash)
	return k, nil
}

// KeyByHash finds a key by the SHA-256 of its text. Every call looks its
// key up, so found keys are served from the read cache.
func (s *Store) KeyByHash(_ context.Context, hash [32]byte) (store.KeyRecord, error) {
	k, ok, gen := s.cache.key(hash)
	if ok {
		return k, nil
	}
	err := s.view(func(tx *bolt.Tx) (err error) {
		k, err = readKey(tx, hash[:])
		return err
	})
	if err == nil {
		s.cache.fillKey(k, gen)
	}
	return k, err
}

// KeyByID finds a key by its id: a UUID in any case, or an id of the
// older "key_…" form, which stores made before ids were UUIDs still hold.
func (s *Store) KeyByID(_ context.Context, id string) (store.KeyRecord, error) {
	var k store.KeyRecord
	err := s.view(func(tx *bolt.Tx) (err error) {
		h, err := getRaw(tx, bucketKeyIDs, []byte(servicekey.CanonicalID(id)))
		if err != nil {
			return err
		}
		k, err = readKey(tx, h)
		return err
	})
	return k, err
}

// ListKeys lists a user's keys (every key when userID is empty) in id order.
func (s *Store) ListKeys(_ context.Context, userID string) ([]store.KeyRecord, error) {
	var out []store.KeyRecord
	err := s.view(func(tx *bolt.Tx) error {
		if userID == "" {
			return tx.Bucket(bucketKeyIDs).ForEach(func(id, v []byte) error {
				h, err := unseal(bucketKeyIDs, id, v)
				if err != nil {
					return err
				}
				k, err := readKey(tx, h)
				out = append(out, k)
				return err
			})
		}
		prefix := append([]byte(userID), 0)
		c := tx.Bucket(bucketKeyUsers).Cursor()
		for key, v := c.Seek(prefix); key != nil && bytes.HasPrefix(key, prefix); key, v = c.Next() {
			h, err := unseal(bucketKeyUsers, key, v)
			if err != nil {
				return err
			}
			k, err := readKey(tx, h)
			if err != nil {
				return err
			}
			out = append(out, k)
		}
		return nil
	})
	return out, err
}

// RevokeKey marks a key revoked; a second revocation keeps the first time.
// The id is read as KeyByID reads it. The audit entries are appended in
// the same transaction.
func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time, audit ...store.AuditEntry) (store.KeyRecord, error) {
	if err := store.CtxErr(ctx); err != nil {
		return store.KeyRecord{}, err
	}
	var out store.KeyRecord
	err := s.update(func(tx *bolt.Tx) error {
		h, err := getRaw(tx, bucketKeyIDs, []byte(servicekey.CanonicalID(id)))
		if err != nil {
			return err
		}
		k, err := readKey(tx, h)
		if err != nil {
			return err
		}
		if k.RevokedAt.IsZero() {
			k.RevokedAt = at.UTC()
			if err := putJSON(tx, bucketKeys, h, toKeyRecord(k)); err != nil {
				return err
			}
			s.written.key(k.Hash)
		}
		out = k
		return appendAudit(tx, slices.Clone(audit))
	})
	return out, err
}

func subKey(userID, serviceID string) []byte { return joinKey(userID, serviceID) }

// readSub reads a subscription in tx. The commit loop's transactions take
// it from the read cache when no write of the current commit changed it
// (what the cache holds is then what tx sees); read-only transactions
// always read the file, as they cannot tell whether the cache is newer
// than their snapshot.
func (s *Store) readSub(tx *bolt.Tx, userID, serviceID string) (store.Subscription, error) {
	key := subKey(userID, serviceID)
	cacheable := tx.Writable() && !s.written.hasSub(key)
	var gen uint64
	if cacheable {
		var sub store.Subscription
		var ok bool
		if sub, ok, gen = s.cache.sub(key); ok {
			return sub, nil
		}
	}
	var rec subRecord
	err := getJSON(tx, bucketSubs, key, &rec)
	if err == store.ErrNotFound {
		return store.Subscription{}, store.ErrNoAccount
	}
	if err != nil {
		return store.Subscription{}, err
	}
	sub := rec.subscription()
	if cacheable {
		s.cache.fillSub(key, sub, gen)
	}
	return sub, nil
}

func (s *Store) writeSub(tx *bolt.Tx, sub store.Subscription) error {
	key := subKey(sub.UserID, sub.ServiceID)
	s.written.sub(key)
	s.changes.stage(sub.UserID, sub.ServiceID)
	return putJSON(tx, bucketSubs, key, toSubRecord(sub))
}

// PutSubscription creates or updates a subscription, keeping its start
// (the period anchor) and credit balance, with its audit entries in the
// same transaction.
func (s *Store) PutSubscription(ctx context.Context, sub store.Subscription, audit ...store.AuditEntry) (store.Subscription, error) {
	return s.putSubscription(ctx, sub, nil, audit)
}

// PutSubscriptionIf is PutSubscription only over the stored revision
// given: the commit loop's one write transaction reads and writes it.
func (s *Store) PutSubscriptionIf(ctx context.Context, sub store.Subscription, revision uint64, audit ...store.AuditEntry) (store.Subscription, error) {
	return s.putSubscription(ctx, sub, &revision, audit)
}

// putSubscription puts sub, over the stored revision *ifRev when not
// nil (else over whatever is stored).
func (s *Store) putSubscription(ctx context.Context, sub store.Subscription, ifRev *uint64, audit []store.AuditEntry) (store.Subscription, error) {
	if err := store.CtxErr(ctx); err != nil {
		return sub, err
	}
	var out store.Subscription
	var stale bool
	err := s.update(func(tx *bolt.Tx) error {
		stale = false // a group's failure runs fn again, alone
		next := sub
		next.RestartPeriodsAt = time.Time{}
		next.Revision = 1
		cur, err := s.readSub(tx, sub.UserID, sub.ServiceID)
		if ifRev != nil && err == nil && cur.Revision != *ifRev {
			out, stale = cur, true
			return store.ErrStale
		} else if ifRev != nil && err == store.ErrNoAccount {
			return err
		}
		if err == nil {
			next.Revision = cur.Revision + 1
			next.StartedAt = cur.StartedAt
			if !sub.RestartPeriodsAt.IsZero() {
				next.StartedAt = sub.RestartPeriodsAt.UTC()
			}
			next.Credits = cur.Credits
			next.CreditsHeld = cur.CreditsHeld
		} else if err != store.ErrNoAccount {
			return err
		} else if next.StartedAt.IsZero() {
			next.StartedAt = sub.UpdatedAt
		}
		if err := s.writeSub(tx, next); err != nil {
			return err
		}
		out = next
		return appendAudit(tx, slices.Clone(audit))
	})
	if err == nil && !sub.RestartPeriodsAt.IsZero() {
		// The loaded account counts its periods from its own copy of
		// the anchor.
		key := append(append([]byte(sub.UserID), 0), sub.ServiceID...)
		if acc := s.mem.peek(key); acc != nil {
			acc.mu.Lock()
			acc.startedAt = out.StartedAt
			acc.mu.Unlock()
		}
	}
	if stale {
		return s.overlay(out), store.ErrStale
	}
	return s.overlay(out), err
}

// GetSubscription reads a subscription; store.ErrNoAccount when none.
// Every call reads its subscription, so it is served from the read cache.
func (s *Store) GetSubscription(_ context.Context, userID, serviceID string) (store.Subscription, error) {
	key := subKey(userID, serviceID)
	sub, ok, gen := s.cache.sub(key)
	if ok {
		return s.overlay(sub), nil
	}
	err := s.view(func(tx *bolt.Tx) (err error) {
		sub, err = s.readSub(tx, userID, serviceID)
		return err
	})
	if err == nil {
		s.cache.fillSub(key, sub, gen)
	}
	return s.overlay(sub), err
}

// AddCredits changes a prepaid balance by amount: a settlement record,
// as the balance lives in memory with the calls that draw on it. The
// audit entries travel in the same record (its grant part, as a credit
// grant's do): the log takes both at once, the applier writes both in one
// transaction, and a replay at start restores both.
func (s *Store) AddCredits(ctx context.Context, userID, serviceID string, amount billing.Units, at time.Time, audit ...store.AuditEntry) (store.Subscription, error) {
	if err := store.CtxErr(ctx); err != nil {
		return store.Subscription{}, err
	}
	if err := s.usable(); err != nil {
		return store.Subscription{}, err
	}
	// The record's encoding cannot fail once it is made: an entry that
	// cannot be written is refused here, with nothing changed.
	if _, err := json.Marshal(audit); err != nil {
		return store.Subscription{}, fmt.Errorf("audit entry of a credit change: %w", err)
	}
	acc, err := s.account(userID, serviceID)
	if err != nil {
		return store.Subscription{}, err
	}
	rec := &settlement{acct: &acctChange{userID: userID, serviceID: serviceID, updated: at.UTC(),
		ops: []acctOp{{kind: opCredit, units: amount}}}}
	acc.mu.Lock()
	if c := acc.credits + amount; (amount > 0) != (c > acc.credits) {
		acc.mu.Unlock()
		return store.Subscription{}, store.ErrBalanceRange
	}
	acc.credits += amount
	if len(audit) > 0 {
		rec.grant = &grantChange{Audit: store.WithBalance(audit, acc.credits)}
	}
	before := acc.updated
	acc.updated = at.UTC()
	_, b, err := s.commitRecord(rec, nil)
	acc.mu.Unlock()
	if err == nil {
		err = s.await(b)
	}
	if err != nil {
		acc.mu.Lock()
		acc.credits -= amount
		if acc.updated.Equal(at.UTC()) {
			acc.updated = before
		}
		acc.mu.Unlock()
		return store.Subscription{}, err
	}
	s.noteChange(userID, serviceID)
	// The entries reach the file (and ListAudit) at once, as a grant's;
	// if this apply fails the log keeps them and the next applies.
	if len(audit) > 0 && applyGrantsAtOnce {
		s.applyAll()
	}
	return s.GetSubscription(ctx, userID, serviceID)
}
