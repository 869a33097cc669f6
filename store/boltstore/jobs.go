package boltstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

func openJobKey(j store.Job) []byte {
	return append(u64(uint64(j.ExpiresAt.UnixNano())), j.ID...)
}

// CreateJob stores a new job that holds nothing and indexes it for expiry.
func (s *Store) CreateJob(ctx context.Context, j store.Job) error {
	if err := ctxErr(ctx); err != nil {
		return err
	}
	j.ReservationID = "" // only CreateJobReserved ties a hold to a job
	return s.update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketJobs).Get([]byte(j.ID)) != nil {
			return store.ErrConflict
		}
		return putNewJob(tx, j)
	})
}

// CreateJobReserved holds units for a and stores the job in the same
// transaction, the hold and the job naming each other; see store.Jobs.
func (s *Store) CreateJobReserved(ctx context.Context, j store.Job, a store.Account, units billing.Units, now time.Time) (store.Reservation, billing.Decision, billing.State, error) {
	if err := checkUnits(units); err != nil {
		return store.Reservation{}, billing.Decision{}, billing.State{}, err
	}
	if j.Terminal() {
		return store.Reservation{}, billing.Decision{}, billing.State{},
			fmt.Errorf("create job %s: a job holding units must start open, not %s", j.ID, j.Status)
	}
	if err := ctxErr(ctx); err != nil {
		return store.Reservation{}, billing.Decision{}, billing.State{}, err
	}
	var (
		res   store.Reservation
		dec   billing.Decision
		state billing.State
	)
	err := s.update(func(tx *bolt.Tx) error {
		res, dec, state = store.Reservation{}, billing.Decision{}, billing.State{}
		if tx.Bucket(bucketJobs).Get([]byte(j.ID)) != nil {
			return store.ErrConflict
		}
		job := j
		job.ReservationID = ""
		if a.Free {
			res, dec = store.Reservation{Account: a, JobID: j.ID}, billing.Decision{Allowed: true, Units: units}
		} else {
			var err error
			if res, dec, state, err = s.hold(tx, a, units, now, j.ID, nil); err != nil || !dec.Allowed {
				return err // refused: nothing was written
			}
			job.ReservationID = res.ID
		}
		return putNewJob(tx, job)
	})
	return res, dec, state, err
}

// putNewJob writes a job that is not yet stored and indexes it for expiry.
func putNewJob(tx *bolt.Tx, j store.Job) error {
	if err := putJSON(tx.Bucket(bucketJobs), []byte(j.ID), toJobRecord(j)); err != nil {
		return err
	}
	if j.Terminal() {
		return nil
	}
	return tx.Bucket(bucketOpenJobs).Put(openJobKey(j), nil)
}

// GetJob reads a job. Callers poll their jobs' status, so jobs are served
// from the read cache.
func (s *Store) GetJob(_ context.Context, id string) (store.Job, error) {
	j, ok, gen := s.cache.job(id)
	if ok {
		return j, nil
	}
	var rec jobRecord
	err := s.view(func(tx *bolt.Tx) error {
		return getJSON(tx.Bucket(bucketJobs), []byte(id), &rec)
	})
	if err != nil {
		return rec.job(), err
	}
	j = rec.job()
	s.cache.fillJob(j, gen) // a job not yet stored is never cached, so creating one drops nothing
	return j, nil
}

// UpdateJob changes a job through fn in one transaction.
func (s *Store) UpdateJob(ctx context.Context, id string, fn func(*store.Job) error) (store.Job, error) {
	return s.CompleteJob(ctx, id, store.Account{}, store.LedgerEntry{}, fn)
}

// CompleteJob changes a job through fn and, when fn ends it, settles the
// job's hold and meters e to a in the same transaction, so a completion's
// units are charged exactly once; see store.Jobs.
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
		j.ReservationID = before.ReservationID // the store's, whatever fn did
		if wasOpen && j.Terminal() {
			if err := s.endJob(tx, &j, a, e); err != nil {
				return err
			}
		}
		if err := putJSON(jobs, []byte(id), toJobRecord(j)); err != nil {
			return err
		}
		s.written.job(id)
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
			if err := s.endJob(tx, &j, store.Account{}, store.LedgerEntry{}); err != nil {
				return err
			}
			if err := putJSON(jobs, id, toJobRecord(j)); err != nil {
				return err
			}
			s.written.job(string(id))
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

// endJob ends the hold of a job that has just become terminal, in the
// transaction that stores it: a COMPLETED job's units (e.Units) are
// settled against the hold and charged to a, capped at the hard limits; a
// FAILED job, or one without units, only gives the hold back. A job with
// no hold (an owner's, or one created by CreateJob) is charged the same
// way, from nothing held. j gets the units and cost charged.
func (s *Store) endJob(tx *bolt.Tx, j *store.Job, a store.Account, e store.LedgerEntry) error {
	h, err := takeHold(tx, j.ReservationID)
	if err != nil {
		return err
	}
	units := e.Units
	if j.Status != store.JobCompleted {
		units = 0
	}
	if units == 0 || a.Free {
		if h != nil {
			if err := s.releaseHold(tx, h); err != nil {
				return err
			}
		}
		if units == 0 {
			return nil
		}
		entry := e
		entry.ProductID = ""
		if err := s.appendLedger(tx, &entry); err != nil {
			return err
		}
		j.Units, j.Cost = entry.Units, 0
		return nil
	}
	userID, serviceID := a.UserID, a.ServiceID
	if h != nil {
		userID, serviceID = h.UserID, h.ServiceID
	}
	entry, err := s.settle(tx, userID, serviceID, h, a.Product, units, e)
	if err != nil {
		return err
	}
	j.Units, j.Cost = entry.Units, entry.Cost
	return nil
}

// takeHold reads and deletes the hold named id; nil when there is none
// (no id, or the hold already ended).
func takeHold(tx *bolt.Tx, id string) (*reservation, error) {
	if id == "" {
		return nil, nil
	}
	seq, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("job's reservation id %q: %w", id, err)
	}
	rb := tx.Bucket(bucketReservations)
	raw := rb.Get(u64(seq))
	if raw == nil {
		return nil, nil
	}
	var h reservation
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Errorf("reservation %s: %w", id, err)
	}
	return &h, rb.Delete(u64(seq))
}

// jobHolds reports whether the hold stored under key still belongs to an
// open job: the job exists, is not terminal, and names this hold.
func jobHolds(tx *bolt.Tx, jobID string, key []byte) (bool, error) {
	var rec jobRecord
	if err := getJSON(tx.Bucket(bucketJobs), []byte(jobID), &rec); err != nil {
		if err == store.ErrNotFound {
			return false, nil
		}
		return false, err
	}
	j := rec.job()
	return !j.Terminal() && j.ReservationID == strconv.FormatUint(binary.BigEndian.Uint64(key), 10), nil
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
