package boltstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

// counter is one subscription's usage in one billing period.
// Its fields are amounts: a period's sums may pass billing.MaxUnits.
type counter struct {
	Used          amount `json:"used"`
	Reserved      amount `json:"reserved,omitempty"`
	Spend         amount `json:"spend,omitempty"`
	ReservedSpend amount `json:"reservedSpend,omitempty"`
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
}

type idemRecord struct {
	Created  time.Time `json:"created"`
	Response []byte    `json:"response"`
}

func counterKey(userID, serviceID string, period int64) []byte {
	return append(joinKey(userID, serviceID, ""), u64(uint64(period))...)
}

// account is a subscription's state in one period, loaded in a write
// transaction and written back after a change.
type account struct {
	s      *Store
	sub    store.Subscription
	key    []byte
	period int64
	state  billing.State
}

func (s *Store) loadAccount(tx *bolt.Tx, userID, serviceID string, p billing.Product, period int64, now time.Time) (*account, error) {
	sub, err := s.readSub(tx, userID, serviceID)
	if err != nil {
		return nil, err
	}
	if period == 0 {
		start, _ := billing.PeriodBounds(p.Period, p.CalendarPeriods, sub.StartedAt, now)
		period = start.Unix()
	}
	acc := &account{s: s, sub: sub, key: counterKey(userID, serviceID, period), period: period}
	var c counter
	if err := getJSON(tx.Bucket(bucketCounters), acc.key, &c); err != nil && err != store.ErrNotFound {
		return nil, err
	}
	acc.state = billing.State{
		Used: billing.Units(c.Used), Reserved: billing.Units(c.Reserved),
		Spend: billing.Units(c.Spend), ReservedSpend: billing.Units(c.ReservedSpend),
		Credits: sub.Credits, CreditsHeld: sub.CreditsHeld,
	}
	return acc, nil
}

func (acc *account) save(tx *bolt.Tx, p billing.Product) error {
	c := counter{Used: amount(acc.state.Used), Reserved: amount(acc.state.Reserved),
		Spend: amount(acc.state.Spend), ReservedSpend: amount(acc.state.ReservedSpend)}
	if err := tx.Bucket(bucketCounters).Put(acc.key, encodeCounter(c)); err != nil {
		return err
	}
	acc.s.latest[string(acc.key)] = acc.state
	acc.s.changes.stage(acc.sub.UserID, acc.sub.ServiceID)
	if p.BillingModel == billing.Prepaid {
		acc.sub.Credits, acc.sub.CreditsHeld = acc.state.Credits, acc.state.CreditsHeld
		return acc.s.writeSub(tx, acc.sub)
	}
	return nil
}

// ledgerFillPercent is how full the append-only ledger's pages are left.
const ledgerFillPercent = 0.95

// appendLedger writes e under a key of its time and a sequence number, so
// the ledger scans in time order. Times never go backwards in the file.
func (s *Store) appendLedger(tx *bolt.Tx, e *store.LedgerEntry) error {
	b := tx.Bucket(bucketLedger)
	// Keys only grow, so every split is at the right edge: bbolt's default
	// of splitting at half full left every ledger page half empty, the
	// file twice the size of its rows.
	b.FillPercent = ledgerFillPercent
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	t := e.Time.UnixNano()
	if t < s.lastLedgerTime {
		t = s.lastLedgerTime
	}
	s.lastLedgerTime = t
	e.Seq = seq
	e.ID = "led_" + strconv.FormatUint(seq, 10)
	e.Time = time.Unix(0, t).UTC()
	raw, err := encodeLedger(*e)
	if err != nil {
		return err
	}
	return b.Put(append(u64(uint64(t)), u64(seq)...), raw)
}

// checkUnits refuses a negative quantity before it reaches a counter: billing
// arithmetic takes it at face value, so a negative hold or charge widened the
// quota (and refunded credits) for every other call.
func checkUnits(u billing.Units) error {
	if u < 0 {
		return fmt.Errorf("negative quantity %s: %w", u, billing.ErrInvalidUnits)
	}
	return nil
}

// Reserve holds units for a call in flight.
func (s *Store) Reserve(ctx context.Context, a store.Account, units billing.Units, now time.Time) (store.Reservation, billing.Decision, billing.State, error) {
	if err := checkUnits(units); err != nil {
		return store.Reservation{}, billing.Decision{}, billing.State{}, err
	}
	if a.Free {
		return store.Reservation{Account: a}, billing.Decision{Allowed: true, Units: units}, billing.State{}, nil
	}
	if err := ctxErr(ctx); err != nil {
		return store.Reservation{}, billing.Decision{}, billing.State{}, err
	}
	// The decision is final once the hold's transaction is committing,
	// or once the loop decided it while the previous commit was in flight
	// (predecide); the fsync overlaps the call's trip to the backend
	// (docs/reliability.md, §1). The Settle that follows commits after it.
	ok, probe := s.admitHold()
	if !ok {
		return store.Reservation{}, billing.Decision{}, billing.State{}, store.ErrUnavailable
	}
	r := &holdRequest{a: a, units: units, now: now}
	o := &op{done: make(chan error, 1), decided: make(chan struct{}), hold: r}
	if probe {
		// Testing a store whose commits failed: told only once durable.
		o.decided, o.hold = nil, nil
	}
	o.fn = func(tx *bolt.Tx) error {
		if r.pre != nil { // decided already, and told: only write it
			_, _, _, err := s.hold(tx, a, units, now, "", r.pre)
			return err
		}
		var err error
		r.res, r.dec, r.state, err = s.hold(tx, a, units, now, "", nil)
		return err
	}
	err := s.wait(o)
	if probe && err == nil {
		for _, p := range s.health.recovered() {
			// A failure queues it again (the disk failed again: next time);
			// ErrNotFound: its hold's own commit was lost, nothing is held.
			s.Settle(context.Background(), p.r, p.units, p.e)
		}
	}
	return r.res, r.dec, r.state, err
}

// holdRequest is a sync call's Reserve as the commit loop sees it.
type holdRequest struct {
	a     store.Account
	units billing.Units
	now   time.Time
	// pre is set when the loop decided the hold ahead of its transaction.
	pre *preHold
	// The results, set by the loop before the caller is told.
	res   store.Reservation
	dec   billing.Decision
	state billing.State
}

// preHold is a hold decided ahead of its transaction: the transaction
// writes exactly this, under this number.
type preHold struct {
	dec    billing.Decision
	seq    uint64
	period int64
}

// hold decides units for a in the period containing now and, when the
// decision allows, holds them and stores the reservation (tied to jobID
// when not empty). A refusal writes nothing; the state returned is after
// the hold.
//
// A hold decided ahead (pre) is written as decided, under its number: its
// caller has been told. It is decided against the state its transaction
// starts from (it comes first in the batch after the one it was decided
// during), so deciding again would give the same answer.
func (s *Store) hold(tx *bolt.Tx, a store.Account, units billing.Units, now time.Time, jobID string, pre *preHold) (store.Reservation, billing.Decision, billing.State, error) {
	var period int64
	if pre != nil {
		period = pre.period
	}
	acc, err := s.loadAccount(tx, a.UserID, a.ServiceID, a.Product, period, now)
	if err != nil {
		return store.Reservation{}, billing.Decision{}, billing.State{}, err
	}
	var dec billing.Decision
	if pre != nil {
		dec = pre.dec
	} else if dec = billing.Decide(a.Product, acc.state, units); !dec.Allowed {
		return store.Reservation{}, dec, acc.state, nil
	}
	acc.state.Hold(a.Product, dec)
	if err := acc.save(tx, a.Product); err != nil {
		return store.Reservation{}, billing.Decision{}, billing.State{}, err
	}
	b := tx.Bucket(bucketReservations)
	var seq uint64
	if pre != nil {
		seq = pre.seq
	} else {
		s.lastHold++
		seq = s.lastHold
	}
	if seq > b.Sequence() {
		if err := b.SetSequence(seq); err != nil {
			return store.Reservation{}, billing.Decision{}, billing.State{}, err
		}
	}
	rec := reservation{UserID: a.UserID, ServiceID: a.ServiceID, Product: a.Product, Decision: toDecisionRecord(dec),
		PeriodKey: acc.period, JobID: jobID}
	raw, err := s.encodeReservation(rec)
	if err != nil {
		return store.Reservation{}, billing.Decision{}, billing.State{}, err
	}
	if err := b.Put(u64(seq), raw); err != nil {
		return store.Reservation{}, billing.Decision{}, billing.State{}, err
	}
	res := store.Reservation{ID: strconv.FormatUint(seq, 10), Account: a, Decision: dec, PeriodKey: acc.period, JobID: jobID}
	return res, dec, acc.state, nil
}

// errJobHold refuses to settle a job's hold as if it were a sync call's.
var errJobHold = fmt.Errorf("a job's hold settles with its job: %w", store.ErrConflict)

// Settle releases a reservation and charges units, capped at what the hard
// limits allow; e is appended to the ledger when anything is charged.
func (s *Store) Settle(ctx context.Context, r store.Reservation, units billing.Units, e store.LedgerEntry) (store.LedgerEntry, error) {
	if err := checkUnits(units); err != nil {
		return store.LedgerEntry{}, err
	}
	if r.JobID != "" {
		return store.LedgerEntry{}, errJobHold
	}
	if r.ID == "" && (!r.Account.Free || units <= 0) {
		return e, nil // nothing was held, nothing to record
	}
	var out store.LedgerEntry
	err := s.update(func(tx *bolt.Tx) error {
		entry := e
		entry.Units = units
		if r.Account.Free {
			entry.ProductID = ""
			out = entry
			return s.appendLedger(tx, &out)
		}
		seq, err := strconv.ParseUint(r.ID, 10, 64)
		if err != nil {
			return err
		}
		rb := tx.Bucket(bucketReservations)
		if rb.Get(u64(seq)) == nil {
			return store.ErrNotFound // already settled
		}
		if err := rb.Delete(u64(seq)); err != nil {
			return err
		}
		p := r.Account.Product
		held := reservation{UserID: r.Account.UserID, ServiceID: r.Account.ServiceID, Product: p,
			Decision: toDecisionRecord(r.Decision), PeriodKey: r.PeriodKey}
		out, err = s.settle(tx, r.Account.UserID, r.Account.ServiceID, &held, p, units, entry)
		return err
	})
	if r.ID != "" && errors.Is(err, store.ErrUnavailable) {
		// Settle it once writes succeed again (the last attempt wins: a
		// release after a failed charge stays a release), rather than
		// hold its units until the next start or lose the charge of work
		// already delivered.
		s.health.unsettled(pendingSettle{r, units, e})
	}
	return out, err
}

// settle releases the hold h (nil when nothing was held) and charges units
// under p, at most what the hard limits allow, into the billing period of
// the hold, else the one containing entry.Time. The entry is appended to
// the ledger, and returned, when anything is charged or claimed; the
// zero entry is returned otherwise. The hold's own product undoes it, so a
// job whose product changed while it ran releases exactly what it held.
func (s *Store) settle(tx *bolt.Tx, userID, serviceID string, h *reservation, p billing.Product, units billing.Units, entry store.LedgerEntry) (store.LedgerEntry, error) {
	var period int64
	if h != nil {
		period = h.PeriodKey
	}
	acc, err := s.loadAccount(tx, userID, serviceID, p, period, entry.Time)
	if err != nil {
		return store.LedgerEntry{}, err
	}
	saveAs := p // whichever is prepaid, so its balance is written back
	if h != nil {
		acc.state.Unhold(h.Product, h.Decision.decision())
		if p.BillingModel != billing.Prepaid {
			saveAs = h.Product
		}
	}
	var out store.LedgerEntry
	if units > 0 {
		entry.Units = units
		dec := billing.DecideCharge(p, acc.state, units)
		if !dec.Allowed {
			entry.UnitsClaimed = units
			entry.Units = billing.FitCharge(p, acc.state, units)
			dec = billing.DecideCharge(p, acc.state, entry.Units)
		}
		acc.state.Charge(p, dec)
		entry.Overage, entry.Cost = dec.Overage, dec.Cost
		if entry.Units > 0 || entry.UnitsClaimed > 0 {
			if err := s.appendLedger(tx, &entry); err != nil {
				return store.LedgerEntry{}, err
			}
			out = entry
		}
	}
	return out, acc.save(tx, saveAs)
}

// releaseHold gives back what a stored hold took, charging nothing. A
// subscription that is gone has nothing left to give back to.
func (s *Store) releaseHold(tx *bolt.Tx, h *reservation) error {
	acc, err := s.loadAccount(tx, h.UserID, h.ServiceID, h.Product, h.PeriodKey, time.Now())
	if err == store.ErrNoAccount {
		return nil
	}
	if err != nil {
		return err
	}
	acc.state.Unhold(h.Product, h.Decision.decision())
	return acc.save(tx, h.Product)
}

// pricingState is the state that usage reported after the fact is priced
// against: the quota actually consumed, not the holds of the calls in
// flight (billing.DecideCharge says why). Such usage is charged past the
// limits, so the holds need not be counted.
func pricingState(s billing.State) billing.State {
	s.Reserved = 0
	return s
}

// Record charges usage reported after the fact; see store.Meter.
func (s *Store) Record(ctx context.Context, a store.Account, e store.LedgerEntry, response func(store.LedgerEntry, billing.State) ([]byte, error)) ([]byte, error) {
	if err := checkUnits(e.Units); err != nil {
		return nil, err
	}
	if err := ctxErr(ctx); err != nil {
		return nil, err
	}
	var (
		stored []byte
		dup    bool
	)
	err := s.update(func(tx *bolt.Tx) error {
		stored, dup = nil, false
		var idemKey []byte
		if e.IdempotencyKey != "" {
			idemKey = joinKey(a.ServiceID, e.IdempotencyKey)
			var rec idemRecord
			if err := getJSON(tx.Bucket(bucketIdempotency), idemKey, &rec); err == nil {
				stored, dup = rec.Response, true
				return nil
			} else if err != store.ErrNotFound {
				return err
			}
		}
		entry := e
		state, err := s.charge(tx, a, &entry)
		if err != nil {
			return err
		}
		body, err := response(entry, state)
		if err != nil {
			return err
		}
		if idemKey != nil {
			if err := putJSON(tx.Bucket(bucketIdempotency), idemKey, idemRecord{Created: entry.Time, Response: body}); err != nil {
				return err
			}
		}
		stored = body
		return nil
	})
	if err == nil && dup {
		err = store.ErrConflict
	}
	return stored, err
}

// charge meters entry.Units to a without enforcing limits (the work is
// done) and appends the entry; the state after is returned.
func (s *Store) charge(tx *bolt.Tx, a store.Account, entry *store.LedgerEntry) (billing.State, error) {
	if a.Free {
		entry.ProductID = ""
		return billing.State{}, s.appendLedger(tx, entry)
	}
	acc, err := s.loadAccount(tx, a.UserID, a.ServiceID, a.Product, 0, entry.Time)
	if err != nil {
		return billing.State{}, err
	}
	dec := billing.Decide(a.Product, pricingState(acc.state), entry.Units)
	acc.state.Charge(a.Product, dec)
	entry.Overage, entry.Cost = dec.Overage, dec.Cost
	if err := acc.save(tx, a.Product); err != nil {
		return billing.State{}, err
	}
	return acc.state, s.appendLedger(tx, entry)
}

// State returns the subscription's state in the period containing now.
func (s *Store) State(_ context.Context, a store.Account, now time.Time) (billing.State, error) {
	var st billing.State
	if a.Free {
		return st, nil
	}
	err := s.view(func(tx *bolt.Tx) error {
		acc, err := s.loadAccount(tx, a.UserID, a.ServiceID, a.Product, 0, now)
		if err != nil {
			return err
		}
		st = acc.state
		return nil
	})
	return st, err
}

// scanChunk is how many ledger entries one read transaction copies out, so
// an export streams a ledger of any size in bounded memory without holding
// a transaction open while the caller writes.
const scanChunk = 512

// ScanLedger streams matching entries in time order.
func (s *Store) ScanLedger(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error {
	var seek []byte
	if !f.From.IsZero() {
		seek = u64(uint64(f.From.UnixNano()))
	}
	var end uint64
	if !f.To.IsZero() {
		end = uint64(f.To.UnixNano())
	}
	for {
		if err := ctxErr(ctx); err != nil {
			return err
		}
		var chunk []store.LedgerEntry
		var resume []byte
		err := s.view(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucketLedger).Cursor()
			k, v := c.First()
			if seek != nil {
				k, v = c.Seek(seek)
			}
			for scanned := 0; k != nil; k, v = c.Next() {
				if end != 0 && binary.BigEndian.Uint64(k) >= end {
					return nil
				}
				if len(chunk) == scanChunk || scanned == 8*scanChunk {
					resume = append([]byte(nil), k...)
					return nil
				}
				scanned++
				var rec ledgerRecord
				if err := json.Unmarshal(v, &rec); err != nil {
					return err
				}
				e := rec.entry()
				if (f.UserID == "" || e.UserID == f.UserID) && (f.ServiceID == "" || e.ServiceID == f.ServiceID) {
					chunk = append(chunk, e)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, e := range chunk {
			if err := fn(e); err != nil {
				return err
			}
		}
		if resume == nil {
			return nil
		}
		seek = resume
	}
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
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		if r.JobID != "" {
			open, err := jobHolds(tx, r.JobID, k)
			if err != nil || open {
				return err
			}
		}
		keys = append(keys, append([]byte(nil), k...))
		return s.releaseHold(tx, &r)
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
