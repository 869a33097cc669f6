package boltstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

func openJobKey(j store.Job) []byte {
	return append(u64(uint64(j.ExpiresAt.UnixNano())), j.ID...)
}

// Job changes are settlement records (settle.go): a job is durable once
// its record is in the settlement log, with the hold it took, and its end
// settles that hold in the same record. Until applied, the job's latest
// state is in s.jobs; jobMu serialises the changes.
//
// A change is seen by no one until its record is durable: not a poll
// (GetJob), not the job's next change (whose fn would find a completion's
// digest and have its retry acknowledged, or refuse a different one as
// late), not the check that a new id is free. Otherwise a completion
// whose fdatasync then failed had been shown to the caller and
// acknowledged to the backend, and was undone: a result delivered and
// never charged. Whoever reads or changes a job whose change is in
// flight waits for it (lockJob) without holding jobMu, so only that job
// waits; the changes of other jobs still share one fdatasync.

// lockJob takes jobMu once the latest change of job id, if any, is
// durable or refused, and returns with jobMu held unless ctx ended first.
func (s *Store) lockJob(ctx context.Context, id string) error {
	for {
		s.jobMu.Lock()
		m := s.jobs[id]
		if m == nil || m.settled() {
			return nil
		}
		s.jobMu.Unlock()
		if err := waitSettled(ctx, m); err != nil {
			return err
		}
	}
}

// waitSettled waits until m's record is durable or refused, or ctx ends.
func waitSettled(ctx context.Context, m *memJob) error {
	if ctx == nil {
		<-m.durable
		return nil
	}
	select {
	case <-m.durable:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loadJob returns the job's latest state and hold. jobMu is held, taken
// by lockJob(id): the state is durable.
func (s *Store) loadJob(id string) (*memJob, error) {
	if j := s.jobs[id]; j != nil {
		return j, nil
	}
	var m *memJob
	err := s.viewJob(id, func(tx *bolt.Tx, rec jobRecord) error {
		m = &memJob{job: rec.job()}
		if rid := m.job.ReservationID; rid != "" {
			n, err := strconv.ParseUint(rid, 10, 64)
			if err != nil {
				return fmt.Errorf("job %s: reservation id %q: %w", id, rid, err)
			}
			if raw := tx.Bucket(bucketReservations).Get(u64(n)); raw != nil {
				h := &jobHold{id: n}
				if err := decodeJSON(bucketReservations, u64(n), raw, &h.rec); err != nil {
					return fmt.Errorf("reservation %s: %w", rid, err)
				}
				h.rec.Product.Currency = h.rec.Currency
				m.hold = h
			}
		}
		return nil
	})
	return m, err
}

// jobIDs is a filter of the ids of every job the store has, in the file
// or still in the settlement log: a 64-bit hash of each id (seeded per
// store, so a caller cannot aim at collisions). An id whose hash is not
// in it is certainly new, and creating a job then reads nothing from the
// file; one whose hash is in it (a duplicate, or two ids sharing a hash,
// about one in 10^9 with a million jobs) is looked up in the file as
// before. It is built from the jobs bucket's keys at Open and grows with
// every job created; a job refused after it was added stays in it, which
// costs only a lookup. Guarded by jobMu. About 10-20 bytes a job.
type jobIDs struct {
	seed maphash.Seed
	set  map[uint64]struct{}
}

func (f *jobIDs) add(id string) { f.set[maphash.String(f.seed, id)] = struct{}{} }

func (f *jobIDs) mayHave(id string) bool {
	_, ok := f.set[maphash.String(f.seed, id)]
	return ok
}

// indexJobIDs builds the filter of job ids from the file, once the
// settlement log is replayed onto it (no job is pending then): the ended
// jobs' keys and the live index.
func (s *Store) indexJobIDs() error {
	f := jobIDs{seed: maphash.MakeSeed()}
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		f.set = make(map[uint64]struct{}, b.Stats().KeyN+tx.Bucket(bucketLiveJobs).Stats().KeyN)
		c := b.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			f.set[maphash.Bytes(f.seed, k)] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("open store %s: index the jobs: %w", s.path, err)
	}
	s.live.mu.RLock()
	for id := range s.live.ids {
		f.add(id)
	}
	s.live.mu.RUnlock()
	s.jobMu.Lock()
	s.jobIDs = f
	s.jobMu.Unlock()
	return nil
}

// jobExists tells whether a job of that id is stored or pending. jobMu is
// held. A new id (the gateway names jobs by random UUIDs) is told apart
// by the filter alone.
func (s *Store) jobExists(id string) (bool, error) {
	if !s.jobIDs.mayHave(id) {
		return false, nil
	}
	_, err := s.loadJob(id)
	if err == store.ErrNotFound {
		return false, nil
	}
	return err == nil, err
}

// putJob appends the record of a job's new state (prev: the state before,
// nil for a new job) and makes it the job's latest, unsettled: lockJob
// waits for it. jobMu is held. The returned function waits for the record
// and, if it was refused, puts the job back as it was and takes back what
// the record did to the account; either way it then lets the job's
// readers go. It must be called.
//
// p is the product rec's account change was made under, which a refused
// record takes back under (undo); nil when rec changes no account. It is
// a pointer so that neither it nor j is copied to the heap for the
// returned function on every job change (an async invoke's allocations,
// docs/performance.md).
func (s *Store) putJob(rec *settlement, j store.Job, hold *jobHold, prev *memJob, p *billing.Product) (func() error, error) {
	raw, err := encodeJob(j)
	if err != nil {
		return nil, err
	}
	jc := rec.job
	jc.raw = raw
	wasOpen := prev != nil && !prev.job.Terminal()
	moved := prev == nil || wasOpen && (j.Terminal() || !j.ExpiresAt.Equal(prev.job.ExpiresAt))
	if wasOpen && moved {
		jc.oldOpen = openJobKey(prev.job)
	}
	if !j.Terminal() && moved {
		jc.newOpen = openJobKey(j)
	}
	pos, b, err := s.commitRecord(rec, nil)
	if err != nil {
		if p != nil {
			s.undo(rec.acct, *p)
		}
		return nil, err
	}
	m := &memJob{job: j, hold: hold, pos: pos, durable: make(chan struct{})}
	id := j.ID
	s.jobs[id] = m
	if prev == nil {
		s.jobIDs.add(id)
	}
	return func() error {
		err := s.await(b)
		if err != nil {
			s.jobMu.Lock()
			if cur := s.jobs[id]; cur == m {
				if prev != nil && prev.pos != 0 {
					s.jobs[id] = prev
				} else {
					delete(s.jobs, id)
				}
			}
			s.jobMu.Unlock()
			if p != nil {
				s.undo(rec.acct, *p)
			}
		}
		close(m.durable)
		return err
	}, nil
}

// CreateJob stores a new job that holds nothing and indexes it for expiry.
func (s *Store) CreateJob(ctx context.Context, j store.Job) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	if err := s.usable(); err != nil {
		return err
	}
	j.ReservationID = "" // only CreateJobReserved ties a hold to a job
	if err := s.lockJob(ctx, j.ID); err != nil {
		return err
	}
	if ok, err := s.jobExists(j.ID); err != nil || ok {
		s.jobMu.Unlock()
		if err == nil {
			err = store.ErrExists
		}
		return err
	}
	wait, err := s.putJob(&settlement{job: &jobChange{id: j.ID, newJob: true}}, j, nil, nil, nil)
	s.jobMu.Unlock()
	if err != nil {
		return err
	}
	return wait()
}

// CreateJobReserved holds units for a and stores the job in one settlement
// record, the hold and the job naming each other; see store.Jobs.
func (s *Store) CreateJobReserved(ctx context.Context, j store.Job, a store.Account, units billing.Units, now time.Time) (store.Reservation, error) {
	if err := store.CheckUnits(units); err != nil {
		return store.Reservation{}, err
	}
	if j.Terminal() {
		return store.Reservation{},
			fmt.Errorf("create job %s: a job holding units must start open, not %s", j.ID, j.Status)
	}
	if err := store.CtxErr(ctx); err != nil {
		return store.Reservation{}, err
	}
	if err := s.usable(); err != nil {
		return store.Reservation{}, err
	}
	if err := s.lockJob(ctx, j.ID); err != nil {
		return store.Reservation{}, err
	}
	if ok, err := s.jobExists(j.ID); err != nil || ok {
		s.jobMu.Unlock()
		if err == nil {
			err = store.ErrExists
		}
		return store.Reservation{}, err
	}
	// The terms name the product the hold is taken under, none for a free
	// account (store.Job.WithTerms): the hold's own copy, set below.
	job := j
	job.ReservationID = ""
	if j.Terms != nil {
		t := *j.Terms
		t.Product = nil
		job.Terms = &t
	}
	rec := &settlement{job: &jobChange{id: j.ID, newJob: true}}
	res, dec := store.Reservation{Account: a, JobID: j.ID}, billing.Decision{Allowed: true, Units: units}
	var state billing.State
	var hold *jobHold
	if !a.Free {
		acc, err := s.account(a.UserID, a.ServiceID)
		if err != nil {
			s.jobMu.Unlock()
			return store.Reservation{}, err
		}
		acc.mu.Lock()
		period, c, err := s.period(acc, a.Product, 0, now)
		if err != nil {
			acc.mu.Unlock()
			s.jobMu.Unlock()
			return store.Reservation{}, err
		}
		st := acc.state(c, a.Product)
		if dec = billing.Decide(a.Product, st, units); !dec.Allowed {
			acc.mu.Unlock()
			s.jobMu.Unlock()
			return store.Reservation{Decision: dec, State: st}, nil // refused: nothing was written
		}
		st.Hold(a.Product, dec)
		acc.set(c, st)
		// Numbered under the account's lock, as Reserve numbers a call's
		// hold: an expiry (heldexpiry.go) that counts this hold as held
		// numbers its cutoff after it, one that does not, before.
		id := s.holdSeq.Add(1)
		acc.mu.Unlock()
		state = st
		hold = &jobHold{id: id, rec: reservation{UserID: a.UserID, ServiceID: a.ServiceID, Product: a.Product,
			Decision: toDecisionRecord(dec), PeriodKey: period, JobID: j.ID, Currency: a.Product.Currency}}
		raw, err := marshalHold(hold.rec)
		if err != nil {
			s.jobMu.Unlock()
			s.undo(&acctChange{userID: a.UserID, serviceID: a.ServiceID, period: period,
				ops: []acctOp{opOf(opHold, a.Product, dec)}}, a.Product)
			return store.Reservation{}, err
		}
		rec.acct = &acctChange{userID: a.UserID, serviceID: a.ServiceID, period: period,
			ops: []acctOp{opOf(opHold, a.Product, dec)}}
		rec.job.holdID, rec.job.holdRaw = id, raw
		job.ReservationID = strconv.FormatUint(id, 10)
		if job.Terms != nil {
			job.Terms.Product = &hold.rec.Product
		}
		res = store.Reservation{ID: job.ReservationID, Account: a, Decision: dec, PeriodKey: period, JobID: j.ID}
	}
	var held *billing.Product // the hold's own copy of a.Product: nothing copied again
	if hold != nil {
		held = &hold.rec.Product
	}
	wait, err := s.putJob(rec, job, hold, nil, held)
	s.jobMu.Unlock()
	if err == nil {
		err = wait()
	}
	if err != nil {
		return store.Reservation{}, err
	}
	if !a.Free {
		s.noteChange(a.UserID, a.ServiceID)
	}
	res.Decision, res.State = dec, state
	return res, nil
}

// GetJob reads a job. Callers poll their jobs' status, so jobs are served
// from the read cache. A change in flight is waited for (lockJob).
func (s *Store) GetJob(ctx context.Context, id string) (store.Job, error) {
	if err := s.lockJob(ctx, id); err != nil {
		return store.Job{}, err
	}
	m := s.jobs[id]
	s.jobMu.Unlock()
	if m != nil {
		return m.job, nil
	}
	j, ok, gen := s.cache.job(id)
	if ok {
		return j, nil
	}
	err := s.viewJob(id, func(_ *bolt.Tx, rec jobRecord) error {
		j = rec.job()
		return nil
	})
	if err != nil {
		return store.Job{}, err
	}
	s.cache.fillJob(j, gen) // a job not yet stored is never cached, so creating one drops nothing
	return j, nil
}

// UpdateJob changes a job through fn in one record.
func (s *Store) UpdateJob(ctx context.Context, id string, fn func(*store.Job) error) (store.Job, error) {
	return s.CompleteJob(ctx, id, store.Account{}, store.LedgerEntry{}, fn)
}

// CompleteJob changes a job through fn and, when fn ends it, settles the
// job's hold and meters e to a in the same record, so a completion's
// units are charged exactly once; see store.Jobs.
func (s *Store) CompleteJob(ctx context.Context, id string, a store.Account, e store.LedgerEntry, fn func(*store.Job) error) (store.Job, error) {
	if err := store.CheckUnits(e.Units); err != nil {
		return store.Job{}, err
	}
	if err := store.CtxErr(ctx); err != nil {
		return store.Job{}, err
	}
	if err := s.usable(); err != nil {
		return store.Job{}, err
	}
	if err := s.lockJob(ctx, id); err != nil {
		return store.Job{}, err
	}
	j, wait, err := s.changeJob(id, a, e, fn)
	s.jobMu.Unlock()
	if err != nil {
		return store.Job{}, err
	}
	if err := wait(); err != nil {
		return store.Job{}, err
	}
	return j, nil
}

// changeJob runs fn on the job and appends the record of the change.
// jobMu is held, taken by lockJob(id). The returned function must be
// called (putJob).
func (s *Store) changeJob(id string, a store.Account, e store.LedgerEntry, fn func(*store.Job) error) (store.Job, func() error, error) {
	cur, err := s.loadJob(id)
	if err != nil {
		return store.Job{}, nil, err
	}
	j := cur.job
	wasOpen := !j.Terminal()
	if err := fn(&j); err != nil {
		return store.Job{}, nil, err
	}
	j.ReservationID = cur.job.ReservationID // the store's, whatever fn did
	j.Terms = cur.job.Terms
	a, e = cur.job.Charge(a, e) // under the job's terms, when it has them
	rec := &settlement{job: &jobChange{id: id}}
	hold := cur.hold
	p := a.Product
	if wasOpen && j.Terminal() {
		if err := s.endJob(rec, &j, hold, a, e); err != nil {
			return store.Job{}, nil, err
		}
		if hold != nil {
			rec.job.holdDel = hold.id
			if a.Free || a.UserID == "" {
				p = hold.rec.Product
			}
		}
		hold = nil
	}
	var changed *billing.Product // only a change to an account may need undoing
	if rec.acct != nil {
		changed = new(billing.Product)
		*changed = p
	}
	wait, err := s.putJob(rec, j, hold, cur, changed)
	if err != nil {
		return store.Job{}, nil, err
	}
	return j, func() error {
		err := wait()
		if err == nil && rec.acct != nil {
			s.noteChange(rec.acct.userID, rec.acct.serviceID)
		}
		return err
	}, nil
}

// ExpireJobs fails every open job whose deadline has passed.
func (s *Store) ExpireJobs(ctx context.Context, now time.Time, message string) (int, error) {
	if err := store.CtxErr(ctx); err != nil {
		return 0, err
	}
	// The open-jobs index is the database's: jobs created and not yet
	// applied are not in it.
	if err := s.applyAll(); err != nil {
		return 0, err
	}
	var ids []string
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketOpenJobs).Cursor()
		// The index is ordered by deadline: every key up to now (inclusive,
		// store.Job.Expired) is a candidate; changeJob decides.
		for k, _ := c.First(); k != nil && int64(binary.BigEndian.Uint64(k)) <= now.UnixNano(); k, _ = c.Next() {
			ids = append(ids, string(k[8:]))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	expire := func(j *store.Job) error {
		if j.Terminal() || !j.Expired(now) {
			return errSkip
		}
		j.Status = store.JobFailed
		j.ErrorMessage = message
		j.UpdatedAt = now.UTC()
		j.CompletedAt = now.UTC()
		return nil
	}
	s.jobMu.Lock()
	for id, m := range s.jobs {
		if !m.job.Terminal() && m.job.Expired(now) {
			ids = append(ids, id)
		}
	}
	seen := make(map[string]bool, len(ids))
	uniq := ids[:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			uniq = append(uniq, id)
		}
	}
	ids = uniq
	deferred := make(map[string]bool)
	n := 0
	var first error
	for {
		// A job whose change is in flight is seen as the change leaves it:
		// it is taken in the next round, once that is settled.
		var waits []func() error
		var later []*memJob
		var laterIDs []string
		var failed error
		for _, id := range ids {
			if m := s.jobs[id]; m != nil && !m.settled() {
				if !deferred[id] { // once: a job changed again meanwhile is left to the next sweep
					deferred[id] = true
					later, laterIDs = append(later, m), append(laterIDs, id)
				}
				continue
			}
			_, wait, err := s.changeJob(id, store.Account{}, store.LedgerEntry{}, expire)
			if err == errSkip || err == store.ErrNotFound {
				continue
			}
			if err != nil {
				failed = err
				break
			}
			waits = append(waits, wait)
		}
		s.jobMu.Unlock()
		for _, w := range waits { // every change appended is waited for, even after a failure
			if err := w(); err != nil {
				if first == nil {
					first = err
				}
				continue
			}
			n++
		}
		if failed != nil {
			return 0, failed
		}
		for _, m := range later {
			if err := waitSettled(ctx, m); err != nil {
				return n, err
			}
		}
		if ids = laterIDs; len(ids) == 0 {
			return n, first
		}
		s.jobMu.Lock()
	}
}

// endJob ends the hold of a job that has just become terminal, into the
// record that stores it: a COMPLETED job's units (e.Units) are settled
// against the hold and charged to a, capped at the hard limits; a FAILED
// job, or one without units, only gives the hold back. A job with no hold
// (an owner's, or one created by CreateJob) is charged the same way, from
// nothing held. j gets the units and cost charged.
func (s *Store) endJob(rec *settlement, j *store.Job, h *jobHold, a store.Account, e store.LedgerEntry) error {
	units := e.Units
	if j.Status != store.JobCompleted {
		units = 0
	}
	if units == 0 || a.Free {
		if h != nil {
			if err := s.releaseJobHold(rec, h); err != nil {
				return err
			}
		}
		if units == 0 {
			return nil
		}
		entry := e
		entry.ProductID = ""
		rec.ledger = &entry
		j.Units, j.Cost = entry.Units, 0
		return nil
	}
	userID, serviceID := a.UserID, a.ServiceID
	var period int64
	if h != nil {
		userID, serviceID, period = h.rec.UserID, h.rec.ServiceID, h.rec.PeriodKey
	}
	acc, err := s.account(userID, serviceID)
	if err != nil {
		return err
	}
	acc.mu.Lock()
	defer acc.mu.Unlock()
	period, c, err := s.period(acc, a.Product, period, e.Time)
	if err != nil {
		return err
	}
	p := a.Product
	st := acc.state(c, p)
	var ops []acctOp
	var held, heldCredits billing.Units
	if h != nil {
		d := h.rec.Decision.decision()
		st.Unhold(h.rec.Product, d)
		ops = append(ops, opOf(opUnhold, h.rec.Product, d))
		held, heldCredits = d.Units, prepaidCost(h.rec.Product, d)
	}
	entry := e
	entry.Units = units
	dec := billing.DecideCharge(p, st, units)
	if !dec.Allowed {
		dec = store.ChargeFloor(p, st, units, held, &entry)
	}
	st.Charge(p, dec)
	c.charged(p.CostUnit())
	ops = append(ops, opOf(opCharge, p, dec))
	var undoLater func()
	if h != nil {
		// A hold from before a grant's expiry (heldexpiry.go).
		var later *grantChange
		if ops, later, undoLater = acc.endHeld(&st, ops, h.id, heldCredits, prepaidCost(p, dec)); later != nil {
			rec.grant = later
		}
	}
	acc.set(c, st)
	entry.Overage, entry.Cost = dec.Overage, dec.Cost
	rec.acct = &acctChange{userID: userID, serviceID: serviceID, period: period, ops: ops, later: undoLater,
		unit: p.CostUnit(), unitSet: true}
	j.Units, j.Cost = 0, 0
	if entry.Units > 0 || entry.UnitsClaimed > 0 {
		rec.ledger = &entry
		j.Units, j.Cost = entry.Units, entry.Cost
	}
	return nil
}

// releaseJobHold gives back what a job's hold took, charging nothing. A
// subscription that is gone has nothing left to give back to.
func (s *Store) releaseJobHold(rec *settlement, h *jobHold) error {
	acc, err := s.account(h.rec.UserID, h.rec.ServiceID)
	if err == store.ErrNoAccount {
		return nil
	}
	if err != nil {
		return err
	}
	acc.mu.Lock()
	defer acc.mu.Unlock()
	p := h.rec.Product
	_, c, err := s.period(acc, p, h.rec.PeriodKey, time.Now())
	if err != nil {
		return err
	}
	st := acc.state(c, p)
	d := h.rec.Decision.decision()
	st.Unhold(p, d)
	ops := []acctOp{opOf(opUnhold, p, d)}
	// A hold from before a grant's expiry gives it all back (heldexpiry.go).
	ops, later, undoLater := acc.endHeld(&st, ops, h.id, prepaidCost(p, d), 0)
	if later != nil {
		rec.grant = later
	}
	acc.set(c, st)
	rec.acct = &acctChange{userID: h.rec.UserID, serviceID: h.rec.ServiceID, period: h.rec.PeriodKey,
		ops: ops, later: undoLater}
	return nil
}

// jobHolds reports whether the hold stored under key still belongs to an
// open job: the job exists, is not terminal, and names this hold. tx is
// the one the live index was built in, or one after it.
func (s *Store) jobHolds(tx *bolt.Tx, jobID string, key []byte) (bool, error) {
	num, live, _ := s.live.lookup(jobID)
	rec, err := findJob(tx, jobID, num, live)
	if err != nil {
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
	if err := store.CtxErr(ctx); err != nil {
		return 0, err
	}
	if err := s.applyAll(); err != nil {
		return 0, err
	}
	var n int
	err := s.update(func(tx *bolt.Tx) error {
		n = 0
		b := tx.Bucket(bucketIdempotency)
		var old [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var rec idemRecord
			if err := decodeJSON(bucketIdempotency, k, v, &rec); err != nil {
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
