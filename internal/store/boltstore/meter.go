package boltstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/settlelog"
)

// counter is one subscription's usage in one billing period.
// Its fields are amounts: a period's sums may pass billing.MaxUnits.
type counter struct {
	Used          amount `json:"used"`
	Reserved      amount `json:"reserved,omitempty"`
	Spend         amount `json:"spend,omitempty"`
	ReservedSpend amount `json:"reservedSpend,omitempty"`
	// Unit is the cost unit Spend is counted in, absent from a counter
	// written before spend was kept per unit (spend.go); Other the spend
	// in each other unit.
	Unit  *string           `json:"unit,omitempty"`
	Other map[string]amount `json:"other,omitempty"`
}

// reservation is a hold as stored, so that a crash between reserving and
// settling releases it at the next start instead of leaking quota. A job's
// hold names its job: it outlives the process and ends with the job.
type reservation struct {
	UserID    string          `json:"userId"`
	ServiceID string          `json:"serviceId"`
	Product   billing.Product `json:"product"`
	Decision  decisionRecord  `json:"decision"`
	PeriodKey int64           `json:"period"`
	JobID     string          `json:"jobId,omitempty"`
	// Currency is Product's, which its JSON leaves out: the cost unit
	// a job's completion counts its spend in (counterUnit).
	Currency string `json:"currency,omitempty"`
}

type idemRecord struct {
	Created  time.Time `json:"created"`
	Response []byte    `json:"response"`
}

func counterKey(userID, serviceID string, period int64) []byte {
	return append(joinKey(userID, serviceID, ""), u64(uint64(period))...)
}

// releaseAbandoned returns every hold a crash left behind: a call that was
// in flight when the process died never answered its caller, so it is not
// charged. The hold of a job that is still open is kept: the job survives
// the restart, its backend may still complete it, and the hold ends with
// the job (completion, failure or expiry).
func (s *Store) releaseAbandoned(tx *bolt.Tx) error {
	rb := tx.Bucket(bucketReservations)
	var keys [][]byte
	err := rb.ForEach(func(k, v []byte) error {
		var r reservation
		if err := decodeJSON(bucketReservations, k, v, &r); err != nil {
			return err
		}
		if r.JobID != "" {
			open, err := s.jobHolds(tx, r.JobID, k)
			if err != nil || open {
				return err
			}
		}
		keys = append(keys, append([]byte(nil), k...))
		// A hold a gateway before the settlement log stored: its counters
		// hold it; give it back.
		return s.applyAcct(tx, &acctChange{userID: r.UserID, serviceID: r.ServiceID, period: r.PeriodKey,
			ops: []acctOp{opOf(opUnhold, r.Product, r.Decision.decision())}})
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := rb.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// Reserve holds units for a call in flight, in memory: the hold belongs to
// the process, and a crash drops it, charging nothing.
func (s *Store) Reserve(ctx context.Context, a store.Account, units billing.Units, now time.Time) (store.Reservation, error) {
	if err := store.CheckUnits(units); err != nil {
		return store.Reservation{}, err
	}
	if a.Free {
		return store.Reservation{Account: a, Decision: billing.Decision{Allowed: true, Units: units}}, nil
	}
	if err := s.Writable(ctx); err != nil {
		return store.Reservation{}, err
	}
	acc, err := s.account(a.UserID, a.ServiceID)
	if err != nil {
		return store.Reservation{}, err
	}
	acc.mu.Lock()
	defer acc.mu.Unlock()
	period, c, err := s.period(acc, a.Product, 0, now)
	if err != nil {
		return store.Reservation{}, err
	}
	st := acc.state(c, a.Product)
	dec := billing.Decide(a.Product, st, units)
	if !dec.Allowed {
		return store.Reservation{Decision: dec, State: st}, nil
	}
	st.Hold(a.Product, dec)
	acc.set(c, st)
	id := s.holdSeq.Add(1)
	acc.holds[id] = struct{}{}
	return store.Reservation{ID: strconv.FormatUint(id, 10), Account: a, Decision: dec, PeriodKey: period, State: st}, nil
}

// chargeRecord is a sync call's settlement record with its parts, in one
// allocation: one is made for every charged call.
type chargeRecord struct {
	rec   settlement
	acct  acctChange
	ops   [1]acctOp
	entry store.LedgerEntry
}

// Settle releases a reservation and charges units, capped at what the hard
// limits allow; e is appended to the ledger when anything is charged. The
// charge is acknowledged once its record is in the settlement log; a
// release alone writes nothing.
func (s *Store) Settle(ctx context.Context, r store.Reservation, units billing.Units, e store.LedgerEntry) (store.LedgerEntry, error) {
	if err := store.CheckUnits(units); err != nil {
		return store.LedgerEntry{}, err
	}
	if r.JobID != "" {
		return store.LedgerEntry{}, store.ErrJobHold
	}
	if r.ID == "" && (!r.Account.Free || units <= 0) {
		return e, nil // nothing was held, nothing to record
	}
	if err := s.usable(); err != nil {
		return store.LedgerEntry{}, err
	}
	if r.Account.Free {
		entry := e
		entry.Units, entry.ProductID = units, ""
		rec := &settlement{ledger: &entry}
		_, b, err := s.commitRecord(rec, nil)
		if err == nil {
			err = s.await(b)
		}
		if err != nil {
			return store.LedgerEntry{}, err
		}
		return entry, nil
	}
	id, err := strconv.ParseUint(r.ID, 10, 64)
	if err != nil {
		return store.LedgerEntry{}, fmt.Errorf("reservation id %q: %w", r.ID, store.ErrNotFound)
	}
	a, p := r.Account, r.Account.Product
	acc, err := s.account(a.UserID, a.ServiceID)
	if err != nil {
		return store.LedgerEntry{}, err
	}
	acc.mu.Lock()
	if _, ok := acc.holds[id]; !ok {
		acc.mu.Unlock()
		return store.LedgerEntry{}, store.ErrNotFound // already settled, or dropped by a restart
	}
	_, c, err := s.period(acc, p, r.PeriodKey, e.Time)
	if err != nil {
		acc.mu.Unlock()
		return store.LedgerEntry{}, err
	}
	delete(acc.holds, id)
	st := acc.state(c, p)
	st.Unhold(p, r.Decision)
	var rec *settlement
	var out store.LedgerEntry
	var charged billing.Units
	if units > 0 {
		cr := &chargeRecord{entry: e}
		entry := &cr.entry
		entry.Units = units
		dec := billing.DecideCharge(p, st, units)
		if !dec.Allowed {
			dec = store.ChargeFloor(p, st, units, r.Decision.Units, entry)
		}
		st.Charge(p, dec)
		c.charged(p.CostUnit())
		charged = prepaidCost(p, dec)
		entry.Overage, entry.Cost = dec.Overage, dec.Cost
		cr.ops[0] = opOf(opCharge, p, dec)
		cr.acct = acctChange{userID: a.UserID, serviceID: a.ServiceID, period: r.PeriodKey, ops: cr.ops[:],
			unit: p.CostUnit(), unitSet: true}
		rec = &cr.rec
		rec.acct = &cr.acct
		if entry.Units > 0 || entry.UnitsClaimed > 0 {
			rec.ledger = entry
		}
	}
	// A hold from before a grant's expiry: what it gives back of the
	// credits the expiry deferred to it expires (heldexpiry.go).
	expire, later, undoLater := acc.endHeld(&st, nil, id, prepaidCost(p, r.Decision), charged)
	if later != nil {
		if rec == nil {
			rec = &settlement{}
		}
		if len(expire) > 0 {
			if rec.acct == nil {
				rec.acct = &acctChange{userID: a.UserID, serviceID: a.ServiceID, period: r.PeriodKey}
			}
			rec.acct.ops = append(rec.acct.ops, expire...)
		}
		rec.grant = later
	}
	acc.set(c, st)
	var b *settlelog.Batch
	if rec != nil {
		_, b, err = s.commitRecord(rec, nil)
	}
	acc.mu.Unlock()
	if rec != nil && err == nil {
		err = s.await(b)
	}
	if err != nil {
		// Not recorded: the hold comes back and the charge goes, and the
		// settlement is retried once writes succeed again (the last
		// attempt wins: a release after a failed charge stays a release),
		// rather than hold its units until the next start or lose the
		// charge of work already delivered.
		acc.mu.Lock()
		if rec != nil && err != ErrClosed {
			st := acc.state(c, p)
			if rec.acct != nil {
				undoOps(&st, rec.acct.ops, p)
			}
			st.Hold(p, r.Decision)
			acc.set(c, st)
			acc.holds[id] = struct{}{}
			if undoLater != nil {
				undoLater()
			}
		}
		acc.mu.Unlock()
		if errors.Is(err, store.ErrUnavailable) {
			s.health.unsettled(pendingSettle{r, units, e})
		}
		return store.LedgerEntry{}, err
	}
	s.health.settled(r.ID)
	if rec != nil {
		s.noteChange(a.UserID, a.ServiceID)
		if rec.ledger != nil {
			out = *rec.ledger
		}
	}
	return out, nil
}

// Record charges usage reported after the fact; see store.Meter. With an
// idempotency key, the claim is part of the same settlement record.
func (s *Store) Record(ctx context.Context, a store.Account, e store.LedgerEntry, response func(store.LedgerEntry, billing.State) ([]byte, error)) ([]byte, error) {
	if err := store.CheckUnits(e.Units); err != nil {
		return nil, err
	}
	if err := store.CtxErr(ctx); err != nil {
		return nil, err
	}
	if err := s.usable(); err != nil {
		return nil, err
	}
	var claimKey string
	if e.IdempotencyKey != "" {
		claimKey = string(joinKey(a.ServiceID, e.IdempotencyKey))
		h := maphash.String(s.mem.seed, claimKey)
		mu := &s.idemLocks[h%uint64(len(s.idemLocks))]
		mu.Lock()
		defer mu.Unlock()
		s.idemMu.Lock()
		c, ok := s.claims[claimKey]
		s.idemMu.Unlock()
		if ok {
			return c.response, store.ErrReplayed
		}
		var rec idemRecord
		err := s.view(func(tx *bolt.Tx) error {
			return getJSON(tx, bucketIdempotency, []byte(claimKey), &rec)
		})
		if err == nil {
			return rec.Response, store.ErrReplayed
		} else if err != store.ErrNotFound {
			return nil, err
		}
	}
	entry := e
	rec := &settlement{ledger: &entry}
	var state billing.State
	var acc *memAccount
	var c *memCounter
	if a.Free {
		entry.ProductID = ""
	} else {
		var err error
		if acc, err = s.account(a.UserID, a.ServiceID); err != nil {
			return nil, err
		}
		acc.mu.Lock()
		var period int64
		if period, c, err = s.period(acc, a.Product, 0, entry.Time); err != nil {
			acc.mu.Unlock()
			return nil, err
		}
		st := acc.state(c, a.Product)
		dec := billing.Decide(a.Product, store.PricingState(st), entry.Units)
		st.Charge(a.Product, dec)
		acc.set(c, st)
		c.charged(a.Product.CostUnit())
		entry.Overage, entry.Cost = dec.Overage, dec.Cost
		state = st
		rec.acct = &acctChange{userID: a.UserID, serviceID: a.ServiceID, period: period,
			ops: []acctOp{opOf(opCharge, a.Product, dec)}, unit: a.Product.CostUnit(), unitSet: true}
	}
	var body []byte
	pos, b, err := s.commitRecord(rec, func() error {
		var err error
		if body, err = response(entry, state); err != nil {
			return err
		}
		if claimKey != "" {
			rec.idem = &idemClaim{serviceID: a.ServiceID, key: e.IdempotencyKey, created: entry.Time, response: body}
		}
		return nil
	})
	if acc != nil {
		acc.mu.Unlock()
	}
	if err == nil {
		if claimKey != "" {
			s.idemMu.Lock()
			s.claims[claimKey] = pendingClaim{response: body, pos: pos}
			s.idemMu.Unlock()
		}
		err = s.await(b)
	}
	if err != nil {
		if claimKey != "" {
			s.idemMu.Lock()
			delete(s.claims, claimKey)
			s.idemMu.Unlock()
		}
		if acc != nil {
			acc.mu.Lock()
			st := acc.state(c, a.Product)
			undoOps(&st, rec.acct.ops, a.Product)
			acc.set(c, st)
			acc.mu.Unlock()
		}
		return nil, err
	}
	if !a.Free {
		s.noteChange(a.UserID, a.ServiceID)
	}
	return body, nil
}

// Writable is nil when a hold would be taken now, else what Reserve
// refuses with: the store damaged or closed, or store.ErrUnavailable while
// it cannot write. A call whose settlement could not be recorded is
// refused before it is forwarded (docs/reliability.md, §10.4), and the
// pre-flight routes ask the same, so that an estimate never allows what
// the call would be refused. While the store cannot write, one caller a
// second probes the disk; when it writes again, the settlements that
// failed meanwhile are retried.
func (s *Store) Writable(ctx context.Context) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	if err := s.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	ok, probe := s.admitHold()
	if !ok {
		return store.ErrUnavailable
	}
	if probe {
		if err := s.probeLog(); err != nil {
			return err
		}
		for _, p := range s.health.recovered() {
			// A failure queues it again (the disk failed again: next
			// time); ErrNotFound: the hold was released meanwhile.
			s.Settle(context.Background(), p.r, p.units, p.e)
		}
	}
	return nil
}

// State returns the subscription's state in the period containing now.
func (s *Store) State(_ context.Context, a store.Account, now time.Time) (billing.State, error) {
	var st billing.State
	if a.Free {
		return st, nil
	}
	if err := s.Err(); err != nil {
		return st, err
	}
	acc, err := s.account(a.UserID, a.ServiceID)
	if err != nil {
		return st, err
	}
	acc.mu.Lock()
	defer acc.mu.Unlock()
	_, c, err := s.period(acc, a.Product, 0, now)
	if err != nil {
		return st, err
	}
	return acc.state(c, a.Product), nil
}
