package pgstore

// The node's settlement log (settle log): a settlement whose charge is
// decided without the database — its units covered by the node's lease,
// or a product without a hard limit, priced the same whatever the usage
// so far — is acknowledged once it is in the node's own settlement log
// (internal/store/settlelog, durability sync or write as for the bbolt store) and
// shipped to PostgreSQL in the background, up to shipBatch records per
// transaction, by the transaction the group commit runs (settle.go): the
// ledger row carries the call's id under UNIQUE (time, call_id), so a
// record shipped twice (a commit whose answer was lost, a replay after a
// crash) is recognised and counted once. At start a node replays what its
// log still holds, ships it, and gives back the leases of its previous
// incarnation that the records came from. Every other settlement (a charge
// past its hold, overage priced by the usage so far) is group-committed
// as before, the caller waiting for the commit. docs/fleet.md says what
// each mode costs and loses.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/settlelog"
)

// With settle commit a node has the log too, for one thing: the
// settlements the group commit has not written when the node closes
// (PostgreSQL unreachable) are appended to it (settler.keep) and shipped
// at the next start, as a settle log node's are.

// Defaults of the shipper.
const (
	// DefaultShipInterval is how long a settlement waits in the log before
	// it is shipped when fewer than shipBatch are waiting.
	DefaultShipInterval = 200 * time.Millisecond
	// shipBatch is the most records one shipping transaction carries.
	shipBatch = 1000
	// logSegmentBytes keeps segments small: a restart replays what the
	// unreleased segments hold (records already shipped are recognised
	// by their call id and skipped).
	shipSegmentBytes = 8 << 20
	// seqBlock is how many ledger numbers a node takes at once.
	seqBlock = 1024
)

// shipRecord is a settlement as the log holds it.
type shipRecord struct {
	Call     string            `json:"c"`
	User     string            `json:"u,omitempty"`
	Service  string            `json:"s,omitempty"`
	Period   int64             `json:"p,omitempty"`
	Product  *billing.Product  `json:"pr,omitempty"`
	Free     bool              `json:"f,omitempty"`
	Units    billing.Units     `json:"n"`
	Entry    store.LedgerEntry `json:"e"`
	Holder   string            `json:"h,omitempty"`
	Consume  Vec               `json:"cv,omitempty"`
	Covered  bool              `json:"cov,omitempty"`
	Sequence int64             `json:"q,omitempty"`
	Held     billing.Units     `json:"hd,omitempty"`
	// Currency is Product's (which its JSON leaves out): the cost unit
	// its spend is counted in (spend.go). Nil in a record written before
	// it was kept.
	Currency *string `json:"cu,omitempty"`
}

func recordOf(st *settlement) shipRecord {
	r := shipRecord{Call: st.callID, Free: st.free, Units: st.units, Entry: st.entry, Holder: st.holder,
		Consume: st.consume, Covered: st.covered, Sequence: st.seq, Held: st.held}
	if !st.free {
		p := st.product
		r.User, r.Service, r.Period, r.Product, r.Currency = st.key.UserID, st.key.ServiceID, st.key.Period, &p, &p.Currency
	}
	return r
}

func (r shipRecord) settlement() *settlement {
	st := &settlement{callID: r.Call, free: r.Free, units: r.Units, entry: r.Entry, holder: r.Holder,
		consume: r.Consume, covered: r.Covered, seq: r.Sequence, held: r.Held, logged: true}
	st.key = AllowanceKey{r.User, r.Service, r.Period}
	if r.Product != nil {
		st.product = *r.Product
		if r.Currency != nil {
			st.product.Currency = *r.Currency
		} else {
			st.anyUnit = true
		}
	}
	return st
}

// recordBufs are the buffers records are encoded in before Append copies
// them into the log.
var recordBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

type shipItem struct {
	pos uint64
	st  *settlement
}

// shipper is the node's settlement log and what it has not shipped yet.
type shipper struct {
	s        *Store
	dir      string
	lock     *os.File
	log      *settlelog.Log
	interval time.Duration

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []shipItem     // appended, not shipped, in log order
	pending map[string]int // lease holder -> records not shipped
	shipped uint64         // log position shipped up to
	appendN uint64         // log position appended up to
	failing bool           // the last attempt failed (logged once per burst)

	wake    chan struct{}
	closing chan struct{}
	done    chan struct{}
	dropped bool // abandon: ship nothing more

	// ships and records count the shipping transactions and what they
	// carried (the benchmark reports them).
	ships, records int64

	seqMu sync.Mutex
	seqs  []int64
}

// openShipper opens the log in dir (made if missing, locked against a
// second process), ships what it holds past what PostgreSQL has, gives
// back the leases its records came from (their incarnation is dead: the
// lock says so) and starts a new segment.
func openShipper(ctx context.Context, s *Store, dir string, lo settlelog.Options, interval time.Duration) (*shipper, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgstore: settlement log directory: %w", err)
	}
	lock, err := lockDir(filepath.Join(dir, "lock"))
	if err != nil {
		return nil, fmt.Errorf("pgstore: settlement log directory %s: %w (each node needs a log_dir of its own)", dir, err)
	}
	if interval <= 0 {
		interval = DefaultShipInterval
	}
	sh := &shipper{s: s, dir: dir, lock: lock, interval: interval, pending: map[string]int{},
		wake: make(chan struct{}, 1), closing: make(chan struct{}), done: make(chan struct{})}
	sh.cond = sync.NewCond(&sh.mu)
	l, err := settlelog.Open(filepath.Join(dir, "settle"), settlelog.Options{Mode: lo.Mode, FlushInterval: lo.FlushInterval, Eager: lo.Eager, SegmentBytes: shipSegmentBytes, FS: lo.FS})
	if err != nil {
		unlockDir(lock)
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	sh.log = l
	if l.TornTail != "" {
		s.log.Warn("settlement log: dropped a torn record at its end (never acknowledged)", zap.String("where", l.TornTail))
	}
	if err := sh.replay(ctx); err != nil {
		l.Close(0)
		unlockDir(lock)
		return nil, err
	}
	end := l.End()
	// The shipped segments go, durably, before the new one is made: a
	// crash must not keep the new one and bring back an old one whose
	// torn tail Open dropped (the storage simulation found it in the
	// bbolt store's start, docs/reliability.md §14).
	l.Release(end)
	if err := l.Start(end); err != nil {
		l.Close(0)
		unlockDir(lock)
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	sh.shipped, sh.appendN = end, end
	go sh.loop()
	return sh, nil
}

// replay ships every record the log holds, in chunks; those PostgreSQL has
// already are recognised by their call id. The leases they came from are
// given back once shipped.
func (sh *shipper) replay(ctx context.Context) error {
	var chunk []*settlement
	leases := map[LeaseRef]bool{}
	n := 0
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		if err := sh.s.commitSettlements(chunk); err != nil {
			return fmt.Errorf("pgstore: ship the settlement log at start: %w", err)
		}
		for _, st := range chunk {
			if st.err != nil {
				sh.s.log.Error("settlement from the log not written", zap.String("call", st.callID), zap.Error(st.err))
			}
		}
		n += len(chunk)
		chunk = chunk[:0]
		return nil
	}
	err := sh.log.Replay(0, func(pos uint64, raw []byte) error {
		var r shipRecord
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("pgstore: settlement log record at position %d: %w", pos, err)
		}
		st := r.settlement()
		if st.holder != "" {
			leases[LeaseRef{st.holder, st.key}] = true
		}
		chunk = append(chunk, st)
		if len(chunk) == shipBatch {
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
	if len(leases) > 0 {
		refs := make([]LeaseRef, 0, len(leases))
		for r := range leases {
			if r.Holder != "" && !isJobHolder(r.Holder) {
				refs = append(refs, r)
			}
		}
		if err := (pgLeases{sh.s}).Return(ctx, refs); err != nil {
			sh.s.log.Warn("give back the leases of the previous run (they expire by themselves)", zap.Error(err))
		}
	}
	if n > 0 {
		if sh.s.logAck {
			sh.s.log.Info("settlement log replayed", zap.Int("records", n), zap.String("log_dir", sh.dir))
		} else {
			// settle commit: what the node could not commit by its last
			// stop.
			sh.s.log.Info("settlements kept at the last stop shipped", zap.Int("records", n), zap.String("log_dir", sh.dir))
		}
	}
	return nil
}

func isJobHolder(h string) bool { return len(h) > 4 && h[:4] == "job/" }

// append writes st to the log and queues it for shipping (an error:
// not queued); the batch says when the record is durable.
func (sh *shipper) append(st *settlement) (uint64, *settlelog.Batch, error) {
	buf := recordBufs.Get().(*[]byte)
	defer recordBufs.Put(buf)
	r := recordOf(st)
	raw, err := appendRecord((*buf)[:0], &r)
	if err != nil {
		return 0, nil, err
	}
	if cap(raw) <= 64<<10 {
		*buf = raw // Append copies the record: the buffer serves the next one
	}
	sh.mu.Lock()
	pos, b, err := sh.log.Append(raw)
	if err != nil {
		sh.mu.Unlock()
		return 0, nil, err
	}
	st.logged = true
	sh.queue = append(sh.queue, shipItem{pos, st})
	sh.appendN = pos
	if st.holder != "" {
		sh.pending[st.holder]++
	}
	full := len(sh.queue) >= shipBatch
	sh.mu.Unlock()
	if full {
		select {
		case sh.wake <- struct{}{}:
		default:
		}
	}
	return pos, b, nil
}

// busy says whether records not shipped yet consume from the lease row of
// holder: it must not be given back before they are shipped.
func (sh *shipper) busy(holder string) bool {
	if sh == nil {
		return false
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.pending[holder] > 0
}

// nextSeq is a ledger number for an entry shipped later, taken from the
// node's block (a new block of seqBlock numbers costs one round trip).
// Zero when the database cannot be asked: the number is then given when
// the record is shipped.
func (sh *shipper) nextSeq(ctx context.Context) int64 {
	sh.seqMu.Lock()
	defer sh.seqMu.Unlock()
	if len(sh.seqs) == 0 {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		// One row holding the block: a row per number cost the node an
		// allocation or two each.
		if err := sh.s.pool.QueryRow(ctx, "SELECT array_agg(nextval("+ledgerSeq+")) FROM generate_series(1, $1)", seqBlock).Scan(&sh.seqs); err != nil {
			sh.seqs = sh.seqs[:0]
			return 0
		}
		// Handed out in order, so that a node's entries number up.
		slices.Sort(sh.seqs)
	}
	if len(sh.seqs) == 0 {
		return 0
	}
	n := sh.seqs[0]
	sh.seqs = sh.seqs[1:]
	return n
}

// shipFailed, when set (tests), is called after each shipment that failed,
// before the wait for the next attempt.
var shipFailed func()

// loop ships what the log took: every interval, or at once when a whole
// batch is waiting.
func (sh *shipper) loop() {
	defer close(sh.done)
	timer := time.NewTimer(sh.interval)
	defer timer.Stop()
	backoff := 50 * time.Millisecond
	for {
		closing := false
		select {
		case <-timer.C:
		case <-sh.wake:
		case <-sh.closing:
			closing = true
		}
		for {
			if sh.isDropped() {
				return
			}
			n, err := sh.shipOnce()
			if err != nil {
				if closing {
					return // left in the log: shipped at the next start
				}
				if shipFailed != nil {
					shipFailed()
				}
				time.Sleep(backoff)
				backoff = min(2*backoff, sh.s.retryMax())
				continue
			}
			backoff = 50 * time.Millisecond
			if n < shipBatch {
				break
			}
		}
		if closing {
			return
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(sh.interval)
	}
}

func (sh *shipper) isDropped() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.dropped
}

// shipOnce writes up to shipBatch records from the head of the queue in
// one transaction, and returns how many it shipped.
func (sh *shipper) shipOnce() (int, error) {
	sh.mu.Lock()
	n := min(len(sh.queue), shipBatch)
	items := make([]shipItem, n)
	copy(items, sh.queue[:n])
	sh.mu.Unlock()
	if n == 0 {
		return 0, nil
	}
	batch := make([]*settlement, n)
	for i, it := range items {
		batch[i] = it.st
	}
	err := sh.s.commitSettlements(batch)
	if err != nil && !errors.Is(err, store.ErrUnavailable) {
		// A statement failed, not the database: each alone, so that one
		// bad record never holds the others back.
		for _, st := range batch {
			if e := sh.s.commitSettlements([]*settlement{st}); e != nil {
				if errors.Is(e, store.ErrUnavailable) {
					err = e
					break
				}
				st.err = e
			}
		}
		if errors.Is(err, store.ErrUnavailable) {
			sh.noteFailure(err, n)
			return 0, err
		}
		err = nil
	}
	if err != nil {
		sh.noteFailure(err, n)
		return 0, err
	}
	for _, st := range batch {
		if st.err != nil {
			sh.s.log.Error("settlement from the log not written", zap.String("call", st.callID), zap.Error(st.err))
		}
	}
	sh.mu.Lock()
	if sh.failing {
		sh.s.log.Info("settlements shipped again", zap.Int("settlements", n))
		sh.failing = false
	}
	sh.queue = sh.queue[n:]
	if len(sh.queue) == 0 {
		sh.queue = nil
	}
	for _, it := range items {
		if h := it.st.holder; h != "" {
			if sh.pending[h]--; sh.pending[h] <= 0 {
				delete(sh.pending, h)
			}
		}
	}
	sh.shipped = items[n-1].pos
	sh.ships++
	sh.records += int64(n)
	shipped := sh.shipped
	sh.cond.Broadcast()
	sh.mu.Unlock()
	sh.log.Release(shipped)
	return n, nil
}

func (sh *shipper) noteFailure(err error, n int) {
	sh.mu.Lock()
	first := !sh.failing
	sh.failing = true
	sh.mu.Unlock()
	if first {
		sh.s.log.Warn("settlements not shipped yet; they are in the settlement log, retrying",
			zap.Int("settlements", n), zap.Error(err))
	}
}

// flush waits until everything appended before it is shipped, or ctx ends.
func (sh *shipper) flush(ctx context.Context) error {
	sh.mu.Lock()
	target := sh.appendN
	sh.mu.Unlock()
	return sh.waitShipped(ctx, target)
}

// waitShipped waits until the records up to position target are shipped,
// or ctx ends.
func (sh *shipper) waitShipped(ctx context.Context, target uint64) error {
	select {
	case sh.wake <- struct{}{}:
	default:
	}
	stop := context.AfterFunc(ctx, func() {
		sh.mu.Lock()
		sh.cond.Broadcast()
		sh.mu.Unlock()
	})
	defer stop()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for sh.shipped < target && len(sh.queue) > 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sh.cond.Wait()
		if sh.shipped < target && len(sh.queue) > 0 {
			select {
			case sh.wake <- struct{}{}:
			default:
			}
		}
	}
	return nil
}

// close ships what is left (one attempt: what the database does not take
// stays in the log for the next start) and closes the log.
func (sh *shipper) close() {
	close(sh.closing)
	<-sh.done
	sh.mu.Lock()
	shipped, left := sh.shipped, len(sh.queue)
	sh.mu.Unlock()
	if left > 0 {
		sh.s.log.Warn("settlements left in the settlement log, shipped at the next start", zap.Int("settlements", left),
			zap.String("log_dir", sh.dir))
		shipped = 0
	}
	sh.log.Close(shipped)
	unlockDir(sh.lock)
}

// abandon stops as a killed process would: nothing more shipped.
func (sh *shipper) abandon() {
	sh.mu.Lock()
	sh.dropped = true
	sh.mu.Unlock()
	close(sh.closing)
	<-sh.done
	sh.log.Close(0)
	unlockDir(sh.lock)
}

// Unshipped is how many settlements the log holds that PostgreSQL does not
// have yet.
func (s *Store) Unshipped() int {
	if s.ship == nil {
		return 0
	}
	s.ship.mu.Lock()
	defer s.ship.mu.Unlock()
	return len(s.ship.queue)
}

// Flush waits until every settlement acknowledged before it is in
// PostgreSQL (a no-op without a settlement log).
func (s *Store) Flush(ctx context.Context) error {
	if s.ship == nil {
		return nil
	}
	return s.ship.flush(ctx)
}

// fixedPrice says whether a charge of p is priced the same whatever the
// usage so far: every product but a quota whose overage is billed.
func fixedPrice(p billing.Product) bool {
	return p.Quota == nil || !p.OverageAllowed()
}

// logSettle acknowledges st once it is in the settlement log. Its entry is
// what the shipper will write: the units in full (its lease covers them,
// or nothing limits them), priced at a fixed price, numbered from the
// node's block.
func (s *Store) logSettle(ctx context.Context, st *settlement) (store.LedgerEntry, error) {
	st.seq = s.ship.nextSeq(ctx)
	e := st.entry
	e.Units = st.units
	if st.free {
		e.ProductID = ""
	} else if st.product.BillingModel != billing.Subscription {
		e.Cost = billing.Mul(st.units, st.product.Price)
	}
	if st.seq > 0 {
		e.Seq, e.ID = uint64(st.seq), "led_"+strconv.FormatInt(st.seq, 10)
	}
	pos, b, err := s.ship.append(st)
	if err != nil {
		// Not in the log: written by the group commit instead.
		s.log.Warn("settlement log append failed; committing to PostgreSQL instead", zap.Error(err))
		return s.settle.submit(ctx, st)
	}
	if err := b.Wait(); err != nil {
		// The log could not make it durable; it is queued all the same:
		// acknowledged once PostgreSQL has it, as the group commit would.
		s.log.Warn("settlement log sync failed; waiting for PostgreSQL", zap.Error(err))
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleWait)
		defer cancel()
		go func() { // a stop answers at once (settler.stop)
			select {
			case <-s.settle.stopping:
				cancel()
			case <-wctx.Done():
			}
		}()
		if err := s.ship.waitShipped(wctx, pos); err != nil {
			// Still queued, shipped once PostgreSQL answers: the call will
			// be charged, so its answer is delivered (as the group commit's
			// settleWait answers). Plain ErrUnavailable told the caller
			// "not charged" (TestSettleLogSyncFailureDuringOutageIsPending).
			return store.LedgerEntry{}, fmt.Errorf("pgstore: the settlement is not written yet (it will be once PostgreSQL answers): %w",
				store.ErrSettlementPending)
		}
		if st.err != nil {
			return store.LedgerEntry{}, st.err
		}
		return st.result(), nil
	}
	return e, nil
}

// flushForRead ships what the log holds before a read of the ledger, for
// at most settleWait: a database that does not take it is unavailable.
func (s *Store) flushForRead(ctx context.Context) error {
	if s.Unshipped() == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	if err := s.Flush(ctx); err != nil {
		return fmt.Errorf("pgstore: settlements not shipped yet: %w", store.ErrUnavailable)
	}
	return nil
}

// shipStats counts the shipping transactions and the records they carried.
func (s *Store) shipStats() (ships, records int64) {
	if s.ship == nil {
		return 0, 0
	}
	s.ship.mu.Lock()
	defer s.ship.mu.Unlock()
	return s.ship.ships, s.ship.records
}
