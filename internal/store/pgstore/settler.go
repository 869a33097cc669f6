package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/settlelog"
)

// Settlements are group-committed: a node's Settle calls queue, and one
// loop writes whatever queued during the previous commit in a single
// transaction of two round trips (the rows locked and read, then the
// ledger rows inserted with unnest arrays and the counters written, with
// the COMMIT pipelined behind them). Each ledger row carries its call's id
// under a UNIQUE constraint, and a batch whose commit went unanswered is
// run again: rows already there are recognised and not counted twice.

// maxSettleBatch bounds the settlements of one transaction.
const maxSettleBatch = 1024

// settleWait is how long a Settle waits for its batch to commit while the
// database is unreachable before it answers store.ErrUnavailable; the
// settlement stays queued and is written once the database is back.
var settleWait = 10 * time.Second

// gatherWait is the longest a batch waits for the callers the previous
// commit answered; a fraction of a commit's flush.
var gatherWait = time.Millisecond

// maxWaiting is how many settlements a node lets wait for a database it
// cannot reach before it refuses calls (Reserve answers
// store.ErrUnavailable, before the call is forwarded): the settlements
// of the calls already admitted are kept, however many, and none is
// dropped, but no more are taken on. It is what the group commit held
// (a batch being retried and a full queue) when, before, a Settle past
// it waited to be queued with no bound.
const maxWaiting = 2 * maxSettleBatch

// settlement is one charge to write.
type settlement struct {
	callID  string
	key     AllowanceKey
	product billing.Product
	free    bool
	units   billing.Units
	entry   store.LedgerEntry
	holder  string        // the lease row the call's units came from, "" for none
	consume Vec           // what the charge takes from that lease row
	covered bool          // the lease covers the whole charge
	held    billing.Units // what the call held: the least a cut charge is (store.ChargeFloor)
	seq     int64         // the ledger number given at acknowledgement (settle log), 0: none yet
	logged  bool          // acknowledged from the settlement log: never dropped (commitOnce)
	// anyUnit: read from a log record written before records named their
	// product's currency, so its cost unit is not known: its charge counts
	// in the allowance row's unit (spend.go).
	anyUnit bool

	out  store.LedgerEntry
	err  error
	done chan struct{}
	sent time.Time
}

// result is the ledger entry written for the settlement, its ID made from
// its number here: most settlements are shipped from the log with nobody
// waiting to read it.
func (st *settlement) result() store.LedgerEntry {
	e := st.out
	if e.Seq > 0 && e.ID == "" {
		e.ID = "led_" + strconv.FormatUint(e.Seq, 10)
	}
	return e
}

type settler struct {
	s       *Store
	in      chan *settlement
	closing chan struct{}
	done    chan struct{}
	dropped bool // abandon: a killed node writes nothing more
	mu      sync.Mutex

	// stopping closes when the process begins to exit (stop): a Settle
	// waiting for its commit answers at once (submit), its settlement
	// still queued, written by the group commit or kept at close.
	stopping     chan struct{}
	stoppingOnce sync.Once

	// pending counts, per lease holder, the settlements queued or being
	// written that consume from its row: the row is not given back before
	// their batch ends (busy), or the units they consume would go back to
	// the allowance, be leased and served by another node, and the
	// charges, finding no lease row, be cut at the limit.
	pendMu  sync.Mutex
	pending map[string]int

	// waiting counts the settlements submitted and not finished (queued,
	// being written, or kept for the database); down says the last
	// commit found the database unreachable. Together they say whether
	// the node takes on more calls (full).
	waiting atomic.Int64
	down    atomic.Bool

	// batches, calls and nanos count the commits, the settlements they
	// carried and the time they took (the benchmark reports them).
	batches, calls, nanos atomic.Int64
}

func newSettler(s *Store) *settler {
	return &settler{s: s, in: make(chan *settlement, maxSettleBatch), closing: make(chan struct{}), done: make(chan struct{}),
		stopping: make(chan struct{}), pending: map[string]int{}}
}

// stopWait bounds how long a settlement waits for its commit once the
// process is stopping and the database answered the last commit (submit):
// well inside a server's grace period, so that its caller is answered
// before the server stops waiting for it.
const stopWait = time.Second

// stop says the process has begun to exit: the Settles waiting for their
// commits, and those to come, answer as soon as their commits do, or, when
// the database did not answer the last commit (down) or does not answer
// within stopWait, at once that their settlements are not written yet
// (store.ErrSettlementPending), so their callers have their answers while
// the server still waits for them. Waiting on, they answered only as the
// store closed (settleWait, 10 s, is longer than a server's
// grace_period): just before the process exits, which an answer could
// lose, the caller's connection closed without one, the call charged all
// the same. The settlements stay queued: written by the group commit, or
// by close's last attempt, or kept in the settlement log (keep), each
// call once by its id. A config reload is no stop: the store, shared by
// both configs, never hears of it.
func (t *settler) stop() {
	t.stoppingOnce.Do(func() { close(t.stopping) })
}

// busy says whether settlements queued or being written consume from the
// lease row of holder: it must not be given back before their batch ends.
func (t *settler) busy(holder string) bool {
	if t == nil {
		return false
	}
	t.pendMu.Lock()
	defer t.pendMu.Unlock()
	return t.pending[holder] > 0
}

func (t *settler) hold(st *settlement) {
	if st.holder == "" {
		return
	}
	t.pendMu.Lock()
	t.pending[st.holder]++
	t.pendMu.Unlock()
}

func (t *settler) unhold(st *settlement) {
	if st.holder == "" {
		return
	}
	t.pendMu.Lock()
	if t.pending[st.holder]--; t.pending[st.holder] <= 0 {
		delete(t.pending, st.holder)
	}
	t.pendMu.Unlock()
}

// finish ends st: its batch committed, or it failed for good.
func (t *settler) finish(st *settlement) {
	t.unhold(st)
	t.waiting.Add(-1)
	close(st.done)
}

// full says whether maxWaiting settlements or more wait for a database
// the node cannot reach: a call admitted now would add one more that
// cannot be made durable.
func (t *settler) full() bool {
	return t != nil && t.down.Load() && t.waiting.Load() >= maxWaiting
}

// submit queues st and waits until it is durable, or settleWait passed
// without the database answering.
func (t *settler) submit(ctx context.Context, st *settlement) (store.LedgerEntry, error) {
	st.done = make(chan struct{})
	st.sent = time.Now()
	t.hold(st) // counted before it leaves the caller's hands (busy)
	t.waiting.Add(1)
	// The queue may be full for as long as one commit attempt: while the
	// database is unreachable the loop empties it into what it keeps.
	select {
	case t.in <- st:
	case <-t.closing:
		t.unhold(st)
		t.waiting.Add(-1)
		return store.LedgerEntry{}, fmt.Errorf("pgstore: closed: %w", store.ErrUnavailable)
	}
	timer := time.NewTimer(settleWait)
	defer timer.Stop()
	select {
	case <-st.done:
		return st.result(), st.err
	case <-timer.C:
		return store.LedgerEntry{}, fmt.Errorf("pgstore: the settlement is not written yet (it will be once PostgreSQL answers): %w",
			store.ErrSettlementPending)
	case <-t.stopping:
		if !t.down.Load() {
			// The database answered the last commit: this one takes
			// milliseconds, and its answer is the one to give (a
			// settlement that fails is not charged; one answered pending
			// lives only in memory until the stop's last commit). Waited
			// for no longer than stopWait, well inside a grace period, in
			// case the database has just stopped answering.
			wait := time.NewTimer(stopWait)
			defer wait.Stop()
			select {
			case <-st.done:
			case <-wait.C:
			}
		}
		select {
		case <-st.done: // written meanwhile: say so
			return st.result(), st.err
		default:
		}
		return store.LedgerEntry{}, fmt.Errorf("pgstore: the node is stopping and the settlement is not written yet "+
			"(its stop writes it, or keeps it in the settlement log for the next start): %w", store.ErrSettlementPending)
	}
}

func (t *settler) close() {
	t.mu.Lock()
	select {
	case <-t.closing:
	default:
		close(t.closing)
	}
	t.mu.Unlock()
	<-t.done
	if t.isDropped() {
		return
	}
	// A Settle that queued as the loops returned (submit's select found
	// both ways open): the database is not asked again.
	if rest := t.drain(nil); len(rest) > 0 {
		t.keep(rest, fmt.Errorf("pgstore: closed: %w", store.ErrUnavailable))
	}
}

// keep answers settlements the node closes without having committed
// (PostgreSQL unreachable): each is appended to the node's settlement
// log, shipped at its next start (each call once, by its id, as a
// settle log node's records are) and its lease row held until then; the
// caller is told it is not written yet. Without a settlement log (or a
// record the log could not take) the settlement is dropped, and said so.
func (t *settler) keep(batch []*settlement, cause error) {
	sh := t.s.ship
	type kept struct {
		st *settlement
		b  *settlelog.Batch
	}
	var ks []kept
	for _, st := range batch {
		st.err = cause
		if sh == nil {
			t.s.log.Error("settlement dropped: PostgreSQL unreachable at stop and no settlement log to keep it", zap.String("call", st.callID))
			t.finish(st)
			continue
		}
		// A copy goes to the log: the shipper's attempt at close writes to
		// it while the caller reads st.
		_, b, err := sh.append(recordOf(st).settlement())
		if err != nil {
			t.s.log.Error("settlement dropped: PostgreSQL unreachable at stop and the settlement log refused it",
				zap.String("call", st.callID), zap.Error(err))
			t.finish(st)
			continue
		}
		ks = append(ks, kept{st, b})
	}
	for _, k := range ks {
		if err := k.b.Wait(); err != nil {
			t.s.log.Error("settlement kept in the settlement log, which could not make it durable", zap.String("call", k.st.callID), zap.Error(err))
		}
		k.st.err = fmt.Errorf("pgstore: the settlement is kept in the settlement log and written at the next start: %w", store.ErrSettlementPending)
		t.finish(k.st)
	}
	if len(ks) > 0 {
		t.s.log.Warn("settlements not committed at stop kept in the settlement log, shipped at the next start",
			zap.Int("settlements", len(ks)), zap.String("log_dir", sh.dir))
	}
}

func (t *settler) abandon() {
	t.mu.Lock()
	t.dropped = true
	t.mu.Unlock()
	t.close()
}

func (t *settler) isDropped() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped
}

// settleWorkers is how many batches a node commits at once: batches of
// different subscriptions commit side by side (PostgreSQL flushes their
// commits together); batches of one subscription take turns on its row.
const settleWorkers = 1

// start runs the commit loops; done closes once they all returned.
func (t *settler) start(workers int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(t.loop)
	}
	go func() {
		wg.Wait()
		close(t.done)
	}()
}

// settleFailed, when set (tests), is called after each commit that found
// PostgreSQL unavailable, before the wait for the next attempt.
var settleFailed func()

func (t *settler) loop() {
	// retained are the settlements waiting for the database, oldest
	// first, written maxSettleBatch at a time once it answers. While it
	// does not, the loop keeps emptying the queue into them, so a Settle
	// never waits to be queued for longer than one commit attempt (before,
	// a batch being retried and a full queue, 2,048 settlements, left the
	// next Settle waiting with no bound); admission stops at maxWaiting
	// (full).
	var retained []*settlement
	last := 0 // settlements of the previous batch
	backoff := 50 * time.Millisecond
	for {
		var batch []*settlement
		if n := min(len(retained), maxSettleBatch); n > 0 {
			batch, retained = retained[:n:n], retained[n:]
			if len(retained) == 0 {
				retained = nil
			}
		} else {
			select {
			case st := <-t.in:
				batch = append(batch, st)
			case <-t.closing:
				batch = t.drain(batch)
				if len(batch) == 0 {
					return
				}
			}
		}
	fill:
		for len(batch) < maxSettleBatch {
			select {
			case st := <-t.in:
				batch = append(batch, st)
			default:
				break fill
			}
		}
		// The callers the last commit answered are about to settle their
		// next calls: waiting for them (up to gatherWait) makes one batch
		// of the two halves that otherwise take turns, each paying a whole
		// commit.
		if len(batch) < last && len(batch) < maxSettleBatch {
			timer := time.NewTimer(gatherWait)
		gather:
			for len(batch) < last && len(batch) < maxSettleBatch {
				select {
				case st := <-t.in:
					batch = append(batch, st)
				case <-timer.C:
					break gather
				}
			}
			timer.Stop()
		}
		last = len(batch)
		if t.isDropped() {
			return
		}
		t0 := time.Now()
		err := t.s.commitSettlements(batch)
		t.batches.Add(1)
		t.calls.Add(int64(len(batch)))
		t.nanos.Add(int64(time.Since(t0)))
		if err == nil {
			if t.down.Swap(false) {
				t.s.log.Info("settlements written again", zap.Int("settlements", len(batch)+len(retained)))
			}
			backoff = 50 * time.Millisecond
			for _, st := range batch {
				t.finish(st)
			}
			continue
		}
		if !errors.Is(err, store.ErrUnavailable) {
			// A statement failed, not the database: each one alone, so one
			// bad settlement never keeps the others unwritten.
			var again []*settlement
			for _, st := range batch {
				if err := t.s.commitSettlements([]*settlement{st}); err != nil {
					if errors.Is(err, store.ErrUnavailable) {
						again = append(again, st)
						continue
					}
					st.err = err
				}
				t.finish(st)
			}
			retained = append(again, retained...)
			continue
		}
		if !t.down.Swap(true) {
			// Once per outage: the retries come a tenth of lease_ttl
			// apart at most (retryMax), ten a second with lease_ttl 1s.
			t.s.log.Warn("settlements not written; retrying", zap.Int("settlements", len(batch)+len(retained)), zap.Error(err))
		}
		retained = append(batch, retained...)
		if settleFailed != nil {
			settleFailed()
		}
		timer := time.NewTimer(backoff)
	wait:
		for {
			select {
			case st := <-t.in:
				retained = append(retained, st)
			case <-timer.C:
				break wait
			case <-t.closing:
				timer.Stop()
				// One last attempt, then what is left is kept in the
				// settlement log for the next start (keep).
				t.last(append(retained, t.drain(nil)...))
				return
			}
		}
		backoff = min(2*backoff, t.s.retryMax())
	}
}

// last makes the one attempt a closing node gives the settlements that
// wait for the database, maxSettleBatch at a time; what it cannot write
// is kept in the settlement log (keep).
func (t *settler) last(rest []*settlement) {
	for len(rest) > 0 {
		n := min(len(rest), maxSettleBatch)
		if err := t.s.commitSettlements(rest[:n]); err != nil {
			t.keep(rest, err)
			return
		}
		for _, st := range rest[:n] {
			t.finish(st)
		}
		rest = rest[n:]
	}
}

func (t *settler) drain(batch []*settlement) []*settlement {
	for {
		select {
		case st := <-t.in:
			batch = append(batch, st)
		default:
			return batch
		}
	}
}
