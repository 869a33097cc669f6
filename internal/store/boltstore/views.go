package boltstore

import (
	"bytes"
	"context"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
)

// The listings read existing buckets: subscriptions are keyed user \0
// service, so one user's are a prefix range; jobs are keyed by id and
// filtered while scanned, within store.JobScanBudget per call. No index
// bucket, hence no migration of existing files.

// jobScanBudget is store.JobScanBudget, lowered by tests.
var jobScanBudget = store.JobScanBudget

// seekAfter positions c on the first key after cursor, or on the first
// key at or after start without one.
func seekAfter(c *bolt.Cursor, start, after []byte) (k, v []byte) {
	if after == nil {
		if start == nil {
			return c.First()
		}
		return c.Seek(start)
	}
	k, v = c.Seek(after)
	if k != nil && bytes.Equal(k, after) {
		k, v = c.Next()
	}
	return k, v
}

// ListSubscriptions pages through the subscriptions of one user, or all.
func (s *Store) ListSubscriptions(ctx context.Context, userID, cursor string, limit int) ([]store.Subscription, string, error) {
	if err := store.CtxErr(ctx); err != nil {
		return nil, "", err
	}
	after, err := store.DecodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	var prefix []byte
	if userID != "" {
		prefix = append([]byte(userID), 0)
		if after != nil && !bytes.HasPrefix(after, prefix) {
			return nil, "", store.ErrBadCursor
		}
	}
	limit = max(limit, 1)
	out := make([]store.Subscription, 0, min(limit, 256))
	var next []byte
	err = s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketSubs).Cursor()
		var last []byte
		for k, v := seekAfter(c, prefix, after); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if len(out) == limit {
				next = bytes.Clone(last)
				return nil
			}
			last = k
			var rec subRecord
			if err := decodeJSON(bucketSubs, k, v, &rec); err != nil {
				return err
			}
			out = append(out, s.overlay(rec.subscription()))
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, store.EncodeCursor(next), nil
}

// ListJobs pages through the jobs matching f, in id order.
func (s *Store) ListJobs(ctx context.Context, f store.JobFilter, cursor string, limit int) ([]store.Job, string, error) {
	if err := s.applyAll(); err != nil { // jobs changed and not yet applied
		return nil, "", err
	}
	if err := store.CtxErr(ctx); err != nil {
		return nil, "", err
	}
	after, err := store.DecodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	limit = max(limit, 1)
	out := make([]store.Job, 0, min(limit, 256))
	var next []byte
	err = s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketJobs).Cursor()
		scanned := 0
		var last []byte
		for k, v := seekAfter(c, nil, after); k != nil; k, v = c.Next() {
			if len(out) == limit || scanned == jobScanBudget {
				next = bytes.Clone(last)
				return nil
			}
			scanned++
			last = k
			var rec jobRecord
			if err := decodeJSON(bucketJobs, k, v, &rec); err != nil {
				return err
			}
			if j := rec.job(); f.Matches(j) {
				out = append(out, j)
			}
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, store.EncodeCursor(next), nil
}
