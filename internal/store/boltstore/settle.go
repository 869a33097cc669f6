package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/settlelog"
)

// The settlement path. A sync call's hold is taken in memory (mem.go). Its
// settlement, a report, a job's change and a credit change are each one
// record appended to the settlement log: acknowledged once the log has it
// (written, or fdatasync'd, by the durability mode), applied to the
// database in the background every applyInterval in one transaction that
// also stores the log position it covers. At start the store replays the
// log past that position, so a record is applied exactly once.

// applyInterval is how often the applier writes what the log took. Every
// apply is a bbolt commit with its own fixed cost (the touched counters,
// balances and branch pages written again, the meta page, two fsyncs),
// shared by the records of the interval: at 20 ms the applier cost
// ~14 µs of CPU per sync call at ~3,500 calls/s, at 100 ms ~1.4
// (docs/performance.md, "Where the time goes"). Reads that need the database current (ledger scans, job
// listings, backups) apply first, and a restart replays what was not
// applied, so the interval costs neither freshness nor durability; it
// bounds the records kept in memory and replayed at a start.
var applyInterval = 100 * time.Millisecond

// logSegmentBytes is the settlement log's segment size (0: its default,
// 64 MiB); tests make it small to see segments rotate and go.
var logSegmentBytes int64

// keySettled is where the marker bucket keeps the applied log position.
var keySettled = []byte("settled_position")

// settled is the Store's settlement-path state.
type settled struct {
	mem *memState
	// holdSeq numbers reservations; job holds are stored under theirs.
	holdSeq atomic.Uint64

	// appendMu orders records: ledger numbers and times are handed out
	// and the record appended under it, so the log, the ledger's numbers
	// and its times all grow together.
	appendMu       sync.Mutex
	ledgerSeq      uint64
	lastLedgerTime int64
	encBuf         []byte
	queue          []queued // appended, not yet applied, in log order

	applyEvery time.Duration // applyInterval when the store opened
	applyMu    sync.Mutex
	applied    atomic.Uint64
	stopApply  chan struct{}
	applyDone  chan struct{}
	// applyErr is the last apply failure, logged once per burst.
	applyFailing atomic.Bool

	// jobMu serialises job changes; jobs holds the jobs changed and not
	// yet applied (the database is behind for them).
	jobMu sync.Mutex
	jobs  map[string]*memJob

	// idemLocks serialise reports of one idempotency key (by hash);
	// claims are those not yet applied.
	idemLocks [256]sync.Mutex
	idemMu    sync.Mutex
	claims    map[string]pendingClaim

	// startNote is said once a logger is set: a torn tail dropped at Open
	// (guarded by health.mu).
	startNote string
	// ledgerNote is said once a logger is set: the ledger bucket moved
	// (guarded by health.mu).
	ledgerNote string
	closed     atomic.Bool
}

// queued is a record waiting for the applier.
type queued struct {
	pos   uint64
	rec   *settlement
	batch *settlelog.Batch // nil: written already (write mode)
}

type pendingClaim struct {
	response []byte
	pos      uint64
}

// memJob is a job whose latest change the database may not have yet.
type memJob struct {
	job  store.Job
	hold *jobHold
	pos  uint64
	// durable is closed once the change's record is durable, or refused
	// and the job put back as it was; until then the change is seen by
	// no one (lockJob).
	durable chan struct{}
}

// settled says whether the change's record is durable (or was refused).
func (m *memJob) settled() bool {
	select {
	case <-m.durable:
		return true
	default:
		return false
	}
}

// jobHold is a job's hold: its number and what it holds.
type jobHold struct {
	id  uint64
	rec reservation
}

// openLog opens the settlement log beside the file, replays what the file
// does not have yet, and starts a new segment.
func (s *Store) openLog(o Options) error {
	s.mem = newMemState()
	s.jobs = make(map[string]*memJob)
	s.claims = make(map[string]pendingClaim)
	s.stopApply, s.applyDone = make(chan struct{}), make(chan struct{})
	s.applyEvery = applyInterval
	l, err := settlelog.Open(s.path, settlelog.Options{Mode: o.Durability, FlushInterval: o.FlushInterval, Eager: o.EagerSync,
		SegmentBytes: logSegmentBytes, FS: s.fs, Inline: inlineBackground})
	if err != nil {
		return fmt.Errorf("open store %s: %w", s.path, err)
	}
	s.log = l
	if l.TornTail != "" {
		s.startNote = "settlement log: dropped a torn record at its end (never acknowledged): " + l.TornTail
	}
	var applied uint64
	err = s.db.View(func(tx *bolt.Tx) error {
		if raw := tx.Bucket(bucketMarker).Get(keySettled); len(raw) == 8 {
			applied = binary.BigEndian.Uint64(raw)
		}
		return nil
	})
	if err != nil {
		return err
	}
	ledgerAt := s.led.Position()
	from := min(applied, ledgerAt)
	var chunk []queued
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		err := guard(func() error {
			return s.db.Update(func(tx *bolt.Tx) error { return s.applyRecords(tx, chunk, applied, ledgerAt) })
		})
		s.written.flush(s.cache)
		if err != nil {
			return fmt.Errorf("replay settlement log onto %s: %w", s.path, err)
		}
		applied = max(applied, chunk[len(chunk)-1].pos)
		ledgerAt = max(ledgerAt, chunk[len(chunk)-1].pos)
		chunk = chunk[:0]
		return nil
	}
	err = l.Replay(from, func(pos uint64, raw []byte) error {
		r, err := decodeSettlement(raw)
		if err != nil {
			return fmt.Errorf("settlement log record at position %d: %w", pos, err)
		}
		chunk = append(chunk, queued{pos: pos, rec: &r})
		if len(chunk) == 4096 {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return err
	}
	s.applied.Store(applied)
	err = s.db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMarker)
		s.ledgerSeq = max(markerU64(m, keyLedgerSeq), s.led.LastSeq())
		s.lastLedgerTime = int64(markerU64(m, keyLedgerTime))
		if t := s.led.LastTime(); !t.IsZero() {
			s.lastLedgerTime = max(s.lastLedgerTime, t.UnixNano())
		}
		s.holdSeq.Store(tx.Bucket(bucketReservations).Sequence())
		return nil
	})
	if err != nil {
		return err
	}
	// The applied segments go, durably, before the new one is made: a
	// crash must not keep the new one and bring back an old one whose
	// torn tail Open dropped (found by the storage simulation, seed 3).
	if err := l.Release(applied); err != nil {
		return fmt.Errorf("open store %s: remove applied settlement log segments: %w", s.path, err)
	}
	// New records take positions past every position the database or
	// the ledger has recorded, not only past the log's last record. An
	// apply that covered a refused record (its batch failed, so the log
	// cut it) stores that record's position, and a crash can leave the
	// ledger's stored while the database's commit is lost: a start that
	// reused those positions gave the next records positions the ledger
	// takes for its own, and their rows were skipped at the replay after
	// the next crash (found by the storage simulation, seed 4853817305462).
	if err := l.Start(max(applied, ledgerAt)); err != nil {
		return fmt.Errorf("open store %s: %w", s.path, err)
	}
	return nil
}

// commitRecord appends r to the log, numbering its ledger entry (prep, when
// not nil, runs once the entry is numbered, to finish the record), and
// queues it for the applier. The caller waits for the batch with await.
func (s *Store) commitRecord(r *settlement, prep func() error) (uint64, *settlelog.Batch, error) {
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	if s.closed.Load() {
		return 0, nil, ErrClosed
	}
	seq, last := s.ledgerSeq, s.lastLedgerTime
	if e := r.ledger; e != nil {
		s.ledgerSeq++
		t := max(e.Time.UnixNano(), s.lastLedgerTime)
		s.lastLedgerTime = t
		e.Seq, e.ID, e.Time = s.ledgerSeq, ledgerID(s.ledgerSeq), time.Unix(0, t).UTC()
	}
	if prep != nil {
		if err := prep(); err != nil {
			s.ledgerSeq, s.lastLedgerTime = seq, last
			return 0, nil, err
		}
	}
	s.encBuf = r.encode(s.encBuf[:0])
	pos, b, err := s.log.Append(s.encBuf)
	if err != nil {
		s.ledgerSeq, s.lastLedgerTime = seq, last
		return 0, nil, s.health.commitFailed(1, err)
	}
	s.queue = append(s.queue, queued{pos: pos, rec: r, batch: b})
	return pos, b, nil
}

// await waits until the batch of a record is durable; a failure marks the
// store unhealthy and wraps store.ErrUnavailable.
func (s *Store) await(b *settlelog.Batch) error {
	if err := b.Wait(); err != nil {
		return s.health.commitFailed(1, err)
	}
	return nil
}

// applier applies what the log took every applyInterval.
func (s *Store) applier() {
	defer close(s.applyDone)
	t := time.NewTicker(s.applyEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.applyOnce()
		case <-s.stopApply:
			return
		}
	}
}

// stopApplier stops taking records, applies everything appended and
// closes the log (removing its segments once all is applied).
func (s *Store) stopApplier() {
	s.appendMu.Lock()
	s.closed.Store(true)
	s.appendMu.Unlock()
	close(s.stopApply)
	<-s.applyDone
	s.applyAll()
	s.log.Close(s.applied.Load())
}

// applyAll waits for every record appended so far and applies it.
func (s *Store) applyAll() error {
	if err := s.Err(); err != nil {
		return err
	}
	s.appendMu.Lock()
	var last *settlelog.Batch
	if n := len(s.queue); n > 0 {
		last = s.queue[n-1].batch
	}
	s.appendMu.Unlock()
	last.Wait() // batches finish in order
	return s.applyOnce()
}

// applyOnce applies, in one transaction, every queued record whose batch
// is finished; records whose batch failed were refused and are dropped.
func (s *Store) applyOnce() error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.appendMu.Lock()
	n := 0
	for n < len(s.queue) {
		if done, _ := s.queue[n].batch.Done(); !done {
			break
		}
		n++
	}
	batch := s.queue[:n:n]
	s.appendMu.Unlock()
	if n == 0 {
		return nil
	}
	upto := batch[n-1].pos
	if plantedReleaseBeforeApply {
		s.log.Release(upto) // the planted bug (planted_on.go)
	}
	applied := s.applied.Load()
	err := s.wait(&op{fn: func(tx *bolt.Tx) error { return s.applyRecords(tx, batch, applied, applied) },
		done: make(chan error, 1), applier: true})
	if err != nil {
		// The records stay queued (they are in the log): the next round
		// tries again, and a restart replays them.
		if !s.applyFailing.Swap(true) {
			s.health.logf(func(l *zap.Logger) {
				l.Warn("applying settlements to the store file failed; they are kept in the settlement log and retried",
					zap.Error(err))
			})
		}
		return err
	}
	s.applyFailing.Store(false)
	s.applied.Store(upto)
	s.appendMu.Lock()
	clear(s.queue[:n])
	s.queue = s.queue[n:]
	s.appendMu.Unlock()
	s.jobMu.Lock()
	for id, j := range s.jobs {
		if j.pos <= upto {
			delete(s.jobs, id)
		}
	}
	s.jobMu.Unlock()
	s.idemMu.Lock()
	for k, c := range s.claims {
		if c.pos <= upto {
			delete(s.claims, k)
		}
	}
	s.idemMu.Unlock()
	if err := s.log.Release(upto); err != nil {
		s.health.logf(func(l *zap.Logger) {
			l.Warn("removing applied settlement log segments failed", zap.Error(err))
		})
	}
	return nil
}

// applyRecords writes records to the database in tx and stores the log
// position of the last. Records at or before applied are in the database
// already (a replay after the position was stored) and are skipped; their
// ledger entries are skipped at or before ledgerAt, the ledger's position.
// The counters and balances a batch touches are read once and written
// once, whatever number of records changed them.
//
// The ledger (ledger.go) is appended to inside the database's transaction,
// before its commit, so it is never behind the database: if the commit
// fails, the next round (or the replay at the next start) hands it the
// same entries again, which appendLedger skips by their Seq.
func (s *Store) applyRecords(tx *bolt.Tx, batch []queued, applied, ledgerAt uint64) error {
	var entries []store.LedgerEntry
	acc := applyState{subs: make(map[string]*subState), counters: make(map[string]*counter)}
	appendOrdered(tx)
	for _, q := range batch {
		if _, err := q.batch.Done(); err != nil {
			continue // refused: its caller was told it failed
		}
		r := q.rec
		if r.ledger != nil && q.pos > ledgerAt {
			entries = append(entries, *r.ledger)
		}
		if q.pos <= applied {
			continue
		}
		if a := r.acct; a != nil {
			if err := acc.apply(tx, a); err != nil {
				return err
			}
		}
		if err := s.applyRecord(tx, r); err != nil {
			return err
		}
	}
	if err := acc.write(tx, s); err != nil {
		return err
	}
	upto := batch[len(batch)-1].pos
	if err := s.appendLedger(tx, entries, upto); err != nil {
		return err
	}
	return tx.Bucket(bucketMarker).Put(keySettled, u64(upto))
}

// applyRecord writes one record's claim, credit grants and job.
func (s *Store) applyRecord(tx *bolt.Tx, r *settlement) error {
	if g := r.grant; g != nil {
		if err := s.applyGrant(tx, g); err != nil {
			return err
		}
	}
	if c := r.idem; c != nil {
		if err := putJSON(tx, bucketIdempotency, joinKey(c.serviceID, c.key),
			idemRecord{Created: c.created, Response: c.response}); err != nil {
			return err
		}
	}
	if j := r.job; j != nil {
		if err := s.applyJob(tx, j); err != nil { // jobslive.go
			return err
		}
		s.written.job(j.id)
		open := tx.Bucket(bucketOpenJobs)
		if len(j.oldOpen) > 0 {
			if err := open.Delete(j.oldOpen); err != nil {
				return err
			}
		}
		if len(j.newOpen) > 0 {
			if err := putRaw(tx, bucketOpenJobs, j.newOpen, nil); err != nil {
				return err
			}
		}
		rb := tx.Bucket(bucketReservations)
		if j.holdID != 0 {
			if err := putRaw(tx, bucketReservations, u64(j.holdID), j.holdRaw); err != nil {
				return err
			}
			if j.holdID > rb.Sequence() {
				if err := rb.SetSequence(j.holdID); err != nil {
					return err
				}
			}
		}
		if j.holdDel != 0 {
			if err := rb.Delete(u64(j.holdDel)); err != nil {
				return err
			}
		}
	}
	return nil
}

// applyState is the counters and balances one apply changes, read from
// the database at their first change and written back at the end.
type applyState struct {
	subs     map[string]*subState
	counters map[string]*counter
	order    []string // counter keys in first-touch order, for a stable write
	subOrder []string
}

type subState struct {
	sub     store.Subscription
	exists  bool
	changed bool
}

// apply runs a record's operations on the stored figures.
func (a *applyState) apply(tx *bolt.Tx, c *acctChange) error {
	skey := string(subKey(c.userID, c.serviceID))
	ss := a.subs[skey]
	if ss == nil {
		ss = &subState{exists: true}
		var rec subRecord
		if err := getJSON(tx, bucketSubs, []byte(skey), &rec); err == store.ErrNotFound {
			ss.exists = false
		} else if err != nil {
			return err
		}
		ss.sub = rec.subscription()
		a.subs[skey] = ss
		a.subOrder = append(a.subOrder, skey)
	}
	st := billing.State{Credits: ss.sub.Credits, CreditsHeld: ss.sub.CreditsHeld}
	var cnt *counter
	if c.period != 0 {
		ckey := string(counterKey(c.userID, c.serviceID, c.period))
		if cnt = a.counters[ckey]; cnt == nil {
			cnt = &counter{}
			if err := getJSON(tx, bucketCounters, []byte(ckey), cnt); err != nil && err != store.ErrNotFound {
				return err
			}
			a.counters[ckey] = cnt
			a.order = append(a.order, ckey)
		}
		if c.unitSet {
			cnt.inUnit(c.unit)
		}
		st.Used, st.Reserved, st.Spend, st.ReservedSpend = billing.Units(cnt.Used), billing.Units(cnt.Reserved),
			billing.Units(cnt.Spend), billing.Units(cnt.ReservedSpend)
	}
	applyOps(&st, c.ops)
	if cnt != nil {
		cnt.Used, cnt.Reserved, cnt.Spend, cnt.ReservedSpend = amount(st.Used), amount(st.Reserved), amount(st.Spend),
			amount(st.ReservedSpend)
	}
	if st.Credits != ss.sub.Credits || st.CreditsHeld != ss.sub.CreditsHeld || !c.updated.IsZero() {
		ss.sub.Credits, ss.sub.CreditsHeld = st.Credits, st.CreditsHeld
		// A change written to the file directly (PutSubscription) after
		// this record was appended, and before it was applied, is newer:
		// UpdatedAt never goes back.
		if c.updated.After(ss.sub.UpdatedAt) {
			ss.sub.UpdatedAt = c.updated
		}
		ss.changed = true
	}
	return nil
}

// write stores the changed counters and balances.
func (a *applyState) write(tx *bolt.Tx, s *Store) error {
	for _, k := range a.order {
		if err := putRaw(tx, bucketCounters, []byte(k), encodeCounter(*a.counters[k])); err != nil {
			return err
		}
	}
	for _, k := range a.subOrder {
		if ss := a.subs[k]; ss.exists && ss.changed {
			if err := s.writeSub(tx, ss.sub); err != nil {
				return err
			}
		}
	}
	return nil
}

// applyAcct runs one change on the stored counter and balance at once.
func (s *Store) applyAcct(tx *bolt.Tx, c *acctChange) error {
	a := applyState{subs: make(map[string]*subState), counters: make(map[string]*counter)}
	if err := a.apply(tx, c); err != nil {
		return err
	}
	return a.write(tx, s)
}

// opsOf are the operations of holding (or charging, unholding) d under p.
func opOf(kind byte, p billing.Product, d billing.Decision) acctOp {
	return acctOp{kind: kind, prepaid: p.BillingModel == billing.Prepaid, units: d.Units, cost: d.Cost}
}

// undo takes a refused record's operations back off the account in memory.
func (s *Store) undo(a *acctChange, p billing.Product) {
	if a == nil || len(a.ops) == 0 && a.later == nil {
		return
	}
	acc, err := s.account(a.userID, a.serviceID)
	if err != nil {
		return
	}
	acc.mu.Lock()
	defer acc.mu.Unlock()
	if a.later != nil {
		a.later()
	}
	if a.period == 0 {
		st := billing.State{Credits: acc.credits}
		undoOps(&st, a.ops, billing.Product{})
		acc.credits = st.Credits
		return
	}
	c := acc.periods[a.period]
	if c == nil {
		return
	}
	st := acc.state(c, p)
	undoOps(&st, a.ops, p)
	acc.set(c, st)
}

// usable says why a write cannot be taken now: the store is damaged or
// closed.
func (s *Store) usable() error {
	if err := s.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// probeLog appends an empty record and waits for it: the log takes writes.
func (s *Store) probeLog() error {
	_, b, err := s.commitRecord(&settlement{}, nil)
	if err != nil {
		return err
	}
	return s.await(b)
}

// noteChange tells the usage alerts that a subscription's usage changed.
func (s *Store) noteChange(userID, serviceID string) {
	c := &s.changes
	if !c.on.Load() {
		return
	}
	c.init()
	ref := store.AccountRef{UserID: userID, ServiceID: serviceID}
	c.mu.Lock()
	if c.pending == nil {
		c.pending = make(map[store.AccountRef]struct{})
	}
	c.pending[ref] = struct{}{}
	c.mu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// appendOrderedFill is how full the applier fills the pages of the buckets
// whose keys it writes in increasing order: the open jobs (jobslive.go,
// numbered in creation order) and the job holds (numbered by holdSeq).
// bbolt splits a page at half full by default, which suits random keys;
// appended keys never go back to a split page, so at the default every
// page of these buckets stayed half empty and the applier wrote, and the
// file held, twice the pages.
const appendOrderedFill = 0.9

// appendOrdered sets appendOrderedFill on tx's handles of those buckets
// (bbolt keeps one handle per bucket and transaction).
func appendOrdered(tx *bolt.Tx) {
	for _, name := range [][]byte{bucketLiveJobs, bucketReservations} {
		if b := tx.Bucket(name); b != nil {
			b.FillPercent = appendOrderedFill
		}
	}
}

// marshalHold is a job hold's stored record: json.Marshal(r), written by
// hand (holdrecord_test.go compares the two over random values), since
// reflection over the product was a third of what storing an async job
// cost its call.
func marshalHold(r reservation) ([]byte, error) {
	b := make([]byte, 0, 256)
	b = append(b, `{"userId":`...)
	b = store.AppendJSONString(b, r.UserID)
	b = append(b, `,"serviceId":`...)
	b = store.AppendJSONString(b, r.ServiceID)
	b = append(b, `,"product":`...)
	b = store.AppendProductJSON(b, &r.Product)
	d := &r.Decision
	b = append(b, `,"decision":{"Allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"Code":`...)
	b = store.AppendJSONString(b, d.Code)
	b = append(b, `,"Reason":`...)
	b = store.AppendJSONString(b, d.Reason)
	b = append(b, `,"Units":`...)
	b = store.AppendUnitsJSON(b, billing.Units(d.Units))
	b = append(b, `,"Overage":`...)
	b = store.AppendUnitsJSON(b, billing.Units(d.Overage))
	b = append(b, `,"Cost":`...)
	b = store.AppendUnitsJSON(b, billing.Units(d.Cost))
	b = append(b, `},"period":`...)
	b = strconv.AppendInt(b, r.PeriodKey, 10)
	if r.JobID != "" {
		b = append(b, `,"jobId":`...)
		b = store.AppendJSONString(b, r.JobID)
	}
	if r.Currency != "" {
		b = append(b, `,"currency":`...)
		b = store.AppendJSONString(b, r.Currency)
	}
	return append(b, '}'), nil
}

var errSkip = errors.New("skip")
