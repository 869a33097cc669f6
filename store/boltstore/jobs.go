package boltstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/store"
)

func openJobKey(j store.Job) []byte {
	return append(u64(uint64(j.ExpiresAt.UnixNano())), j.ID...)
}

// CreateJob stores a new job and indexes it for expiry.
func (s *Store) CreateJob(ctx context.Context, j store.Job) error {
	if err := ctxErr(ctx); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		jobs := tx.Bucket(bucketJobs)
		if jobs.Get([]byte(j.ID)) != nil {
			return store.ErrConflict
		}
		if err := putJSON(jobs, []byte(j.ID), toJobRecord(j)); err != nil {
			return err
		}
		if j.Terminal() {
			return nil
		}
		return tx.Bucket(bucketOpenJobs).Put(openJobKey(j), nil)
	})
}

// GetJob reads a job.
func (s *Store) GetJob(_ context.Context, id string) (store.Job, error) {
	var rec jobRecord
	err := s.view(func(tx *bolt.Tx) error {
		return getJSON(tx.Bucket(bucketJobs), []byte(id), &rec)
	})
	return rec.job(), err
}

// UpdateJob changes a job through fn in one transaction.
func (s *Store) UpdateJob(ctx context.Context, id string, fn func(*store.Job) error) (store.Job, error) {
	return s.CompleteJob(ctx, id, store.Account{}, store.LedgerEntry{}, fn)
}

// CompleteJob changes a job through fn and meters e to a in the same
// transaction, so a completion's units are charged exactly once.
func (s *Store) CompleteJob(ctx context.Context, id string, a store.Account, e store.LedgerEntry, fn func(*store.Job) error) (store.Job, error) {
	if err := checkUnits(e.Units); err != nil {
		return store.Job{}, err
	}
	if err := ctxErr(ctx); err != nil {
		return store.Job{}, err
	}
	var out store.Job
	err := s.update(func(tx *bolt.Tx) error {
		jobs := tx.Bucket(bucketJobs)
		var rec jobRecord
		if err := getJSON(jobs, []byte(id), &rec); err != nil {
			return err
		}
		j := rec.job()
		wasOpen := !j.Terminal()
		before := j
		if err := fn(&j); err != nil {
			return err
		}
		if e.Units > 0 && wasOpen && j.Terminal() {
			entry := e
			if _, err := s.charge(tx, a, &entry); err != nil {
				return err
			}
			j.Units, j.Cost = entry.Units, entry.Cost
		}
		if err := putJSON(jobs, []byte(id), toJobRecord(j)); err != nil {
			return err
		}
		if wasOpen && (j.Terminal() || !j.ExpiresAt.Equal(before.ExpiresAt)) {
			if err := tx.Bucket(bucketOpenJobs).Delete(openJobKey(before)); err != nil {
				return err
			}
			if !j.Terminal() {
				if err := tx.Bucket(bucketOpenJobs).Put(openJobKey(j), nil); err != nil {
					return err
				}
			}
		}
		out = j
		return nil
	})
	return out, err
}

// ExpireJobs fails every open job whose deadline has passed.
func (s *Store) ExpireJobs(ctx context.Context, now time.Time, message string) (int, error) {
	if err := ctxErr(ctx); err != nil {
		return 0, err
	}
	var n int
	err := s.update(func(tx *bolt.Tx) error {
		n = 0
		open := tx.Bucket(bucketOpenJobs)
		jobs := tx.Bucket(bucketJobs)
		var done [][]byte
		c := open.Cursor()
		for k, _ := c.First(); k != nil && int64(binary.BigEndian.Uint64(k)) < now.UnixNano(); k, _ = c.Next() {
			done = append(done, append([]byte(nil), k...))
			id := k[8:]
			var rec jobRecord
			if err := getJSON(jobs, id, &rec); err != nil {
				if err == store.ErrNotFound {
					continue
				}
				return err
			}
			j := rec.job()
			if j.Terminal() {
				continue
			}
			j.Status = store.JobFailed
			j.ErrorMessage = message
			j.UpdatedAt = now.UTC()
			j.CompletedAt = now.UTC()
			if err := putJSON(jobs, id, toJobRecord(j)); err != nil {
				return err
			}
			n++
		}
		for _, k := range done {
			if err := open.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

// PruneIdempotency forgets idempotency keys claimed before cutoff.
func (s *Store) PruneIdempotency(ctx context.Context, cutoff time.Time) (int, error) {
	if err := ctxErr(ctx); err != nil {
		return 0, err
	}
	var n int
	err := s.update(func(tx *bolt.Tx) error {
		n = 0
		b := tx.Bucket(bucketIdempotency)
		var old [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var rec idemRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return err
			}
			if rec.Created.Before(cutoff) {
				old = append(old, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		n = len(old)
		return nil
	})
	return n, err
}
