package boltstore

import (
	"bytes"
	"context"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
)

// The listings read existing buckets: subscriptions are keyed user \0
// service, so one user's are a prefix range; ended jobs are keyed by id,
// open ones listed by id from the live index (jobslive.go), and both
// filtered while scanned, within store.JobScanBudget per call. No index
// bucket on disk.

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

// ListJobs pages through the jobs matching f, in id order: the ended
// jobs of bucketJobs and the open ones of the live index (jobslive.go),
// merged.
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
	// The index is read before the transaction starts: a job it names
	// that the transaction finds gone from the live bucket was moved to
	// bucketJobs, where the cursor meets it.
	live := s.live.inOrder()
	li, _ := slices.BinarySearchFunc(live, string(after), func(l liveJob, id string) int { return strings.Compare(l.id, id) })
	if li < len(live) && after != nil && live[li].id == string(after) {
		li++
	}
	err = s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketJobs).Cursor()
		lb := tx.Bucket(bucketLiveJobs)
		scanned := 0
		var last []byte
		k, v := seekAfter(c, nil, after)
		for k != nil || li < len(live) {
			if len(out) == limit || scanned == jobScanBudget {
				next = bytes.Clone(last)
				return nil
			}
			scanned++
			var rec jobRecord
			if k != nil && (li == len(live) || string(k) <= live[li].id) {
				if li < len(live) && string(k) == live[li].id {
					li++ // moved out of the live bucket: listed once, from here
				}
				last = k
				if err := decodeJSON(bucketJobs, k, v, &rec); err != nil {
					return err
				}
				k, v = c.Next()
			} else {
				l := live[li]
				li++
				key := u64(l.num)
				raw := lb.Get(key)
				if raw == nil {
					continue // moved to bucketJobs
				}
				if err := decodeJSON(bucketLiveJobs, key, raw, &rec); err != nil {
					return err
				}
				if rec.ID != l.id {
					continue
				}
				last = []byte(l.id)
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
