// Package boltstore is the embedded implementation of store.Store on a bbolt
// file. All writes go through one commit loop that takes whatever queued up
// during the previous commit and writes it in a single fsync'd transaction
// (group commit with no fixed delay), so durability costs one fsync per batch
// rather than per request and throughput does not collapse under load.
package boltstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

// Top-level buckets. Keys are fixed layouts so scans come out ordered.
var (
	bucketKeys         = []byte("keys")          // sha256(key) -> keyRecord
	bucketKeyIDs       = []byte("key_ids")       // key id -> sha256(key)
	bucketKeyUsers     = []byte("key_users")     // user \0 key id -> sha256(key)
	bucketSubs         = []byte("subscriptions") // user \0 service -> Subscription
	bucketCounters     = []byte("counters")      // user \0 service \0 period(8) -> counter
	bucketLedger       = []byte("ledger")        // time(8) seq(8) -> LedgerEntry
	bucketReservations = []byte("reservations")  // reservation id -> reservation
	bucketIdempotency  = []byte("idempotency")   // service \0 key -> idemRecord
	bucketJobs         = []byte("jobs")          // job id -> Job
	bucketOpenJobs     = []byte("jobs_open")     // expires(8) id -> nil
)

var allBuckets = [][]byte{
	bucketKeys, bucketKeyIDs, bucketKeyUsers, bucketSubs, bucketCounters, bucketLedger,
	bucketReservations, bucketIdempotency, bucketJobs, bucketOpenJobs,
	bucketAlerts, bucketAlertKeys, bucketAlertsDue,
}

// ErrClosed is returned for writes after Close.
var ErrClosed = errors.New("store closed")

// maxBatch bounds how many queued writes share one transaction.
const maxBatch = 2048

// Store is a bbolt-backed store.Store.
type Store struct {
	db   *bolt.DB
	path string

	ops       chan *op
	closing   chan struct{}
	loopDone  chan struct{}
	closeOnce sync.Once

	// commitObserver, when set, is told how long each group commit took
	// and how many writes it carried (for metrics). Atomic: the platform
	// app sets it in every Provision, on a store that outlives reloads and
	// is committing for the previous config meanwhile.
	commitObserver atomic.Pointer[func(d time.Duration, writes int)]

	lastLedgerTime int64 // only touched inside the commit loop
	// lastHold numbers reservations (commit loop only). It never goes
	// back, not even when a commit fails: a caller holds its reservation
	// before it is durable, and a number handed out by a commit that then
	// failed must not name a later caller's hold.
	lastHold uint64

	// cache serves the key and subscription lookups of every call;
	// written collects what the current commit changed in it (commit
	// loop only), dropped from the cache once the commit is over.
	cache   *readCache
	written written
	// latest is each account's state (by counter key) after the writes of
	// the batch being committed, and the holds decided since (commit loop
	// only); predecide decides against it.
	latest map[string]billing.State
	// predecided counts holds decided that way (for tests).
	predecided atomic.Int64
	// productJSON is each product's JSON, for hold records (commit loop
	// only).
	productJSON map[billing.Product][]byte

	// failure, once set, is why the store is unusable: bbolt failed on a
	// damaged page while serving. Every later read and write gets it
	// without touching the file, and Close leaves the file alone (bbolt
	// may still hold its locks from the transaction that failed).
	failure atomic.Pointer[error]

	// health says whether commits succeed; holds are refused while they
	// fail (health.go).
	health health

	// changes are the subscriptions whose usage changed, for the usage
	// alerts (alerts.go).
	changes changeSet
}

type op struct {
	fn   func(tx *bolt.Tx) error
	done chan error
	// decided, when not nil, is closed once fn has run in a transaction
	// that is about to commit: every write of its batch succeeded, and
	// only the commit itself (the fsync) is left.
	decided   chan struct{}
	toldEarly bool // decided is closed (commit loop only)
	// hold, when not nil, is a sync call's hold, which the loop may decide
	// while the previous commit is still in flight (predecide).
	hold *holdRequest
}

// decide tells an early waiter that fn's results are final.
func (o *op) decide() {
	if o.decided != nil && !o.toldEarly {
		o.toldEarly = true
		close(o.decided)
	}
}

// lockWait is how long Open waits for another process to let go of the
// file.
var lockWait = 5 * time.Second

// Open opens the store file at path, or creates it if the path does not
// exist, releases any reservation a crash left behind, and starts the
// commit loop. An existing file must be a sound platform store (see
// inspect and verify): a damaged, empty or foreign file is refused with
// ErrDamaged, never started afresh, and one another process holds is
// ErrLocked.
func Open(path string) (*Store, error) {
	_, exists, err := inspect(path)
	if err != nil {
		return nil, err
	}
	// file is what bbolt opened, to let go of it (and of its lock) if bbolt
	// panics on a damaged page before Open returns a handle to close.
	var file *os.File
	opts := &bolt.Options{Timeout: lockWait, OpenFile: func(name string, flag int, perm os.FileMode) (f *os.File, err error) {
		if exists {
			// It was there when inspected: open that file, never create
			// one anew if it went away meanwhile.
			flag &^= os.O_CREATE
		}
		file, err = os.OpenFile(name, flag, perm)
		return file, err
	}}
	if !exists {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("create store directory: %w", err)
		}
	}
	var db *bolt.DB
	err = guard(func() (err error) {
		db, err = bolt.Open(path, 0o600, opts)
		return err
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open store %s: %w: still locked after %s (a running gateway holds it?)", path, ErrLocked, lockWait)
	}
	if isFault(err) {
		if file != nil {
			file.Close()
		}
		return nil, damaged(path, "%v", err)
	}
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if exists {
		if err := verify(db, path); err != nil {
			db.Close()
			return nil, err
		}
	}
	s := &Store{
		db:       db,
		path:     path,
		ops:      make(chan *op, maxBatch),
		closing:  make(chan struct{}),
		loopDone: make(chan struct{}),
		cache:    newReadCache(),
		latest:   make(map[string]billing.State),

		productJSON: make(map[billing.Product][]byte),
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := layout(tx, path); err != nil {
			return err
		}
		for _, b := range append(slices.Clip(allBuckets), bucketMarker) {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if m := tx.Bucket(bucketMarker); string(m.Get(keyFormat)) != string(storeFormat) {
			if err := m.Put(keyFormat, storeFormat); err != nil {
				return err
			}
		}
		if k, _ := tx.Bucket(bucketLedger).Cursor().Last(); k != nil {
			s.lastLedgerTime = int64(binary.BigEndian.Uint64(k))
		}
		s.lastHold = tx.Bucket(bucketReservations).Sequence()
		return s.releaseAbandoned(tx)
	})
	s.written.flush(s.cache)
	if err != nil {
		db.Close()
		if errors.Is(err, ErrDamaged) {
			return nil, err
		}
		return nil, fmt.Errorf("initialise store %s: %w", path, err)
	}
	go s.loop()
	return s, nil
}

// Path is the file the store lives in.
func (s *Store) Path() string { return s.path }

// ObserveCommits sets a function told about every group commit.
func (s *Store) ObserveCommits(fn func(d time.Duration, writes int)) {
	if fn == nil {
		s.commitObserver.Store(nil)
		return
	}
	s.commitObserver.Store(&fn)
}

// Close waits for queued writes to commit, then closes the file.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	<-s.loopDone
	if err := s.Err(); err != nil {
		return err
	}
	return s.db.Close()
}

// Err is why the store is unusable, or nil while it is sound.
func (s *Store) Err() error {
	if p := s.failure.Load(); p != nil {
		return *p
	}
	return nil
}

// broke marks the store unusable after bbolt failed on a damaged page
// (fault, from guard) and returns the error every caller gets from now on.
func (s *Store) broke(fault error) error {
	err := fmt.Errorf("store %s is unusable: %v; restart the gateway, which checks the file (or restore a backup): %w",
		s.path, fault, ErrDamaged)
	s.failure.CompareAndSwap(nil, &err)
	return s.Err()
}

// update queues fn for the next group commit and waits until it is durable.
// fn may run more than once (when another write in its batch fails), so it
// must set its results afresh on each run.
func (s *Store) update(fn func(tx *bolt.Tx) error) error {
	return s.wait(&op{fn: fn, done: make(chan error, 1)})
}

// wait queues o for the next group commit and waits until it is durable,
// or, for a write with decided (a sync call's hold), until its results are
// final: it ran in a transaction all of whose writes succeeded, which is
// committing, or the loop decided it while the previous commit was in
// flight (predecide). Such a caller does not wait for the fsync and
// overlaps it with other work (the call's trip to its backend). Writes
// commit in the order they run, so any write the caller makes afterwards
// commits after this one; if this commit fails, so does every write that
// depends on finding its records.
func (s *Store) wait(o *op) error {
	if err := s.Err(); err != nil {
		return err
	}
	select {
	case s.ops <- o:
	case <-s.closing:
		return ErrClosed
	}
	// With Close under way both cases above can be ready, and select may
	// queue the write after the loop has drained the queue and exited:
	// waiting on done alone then hung forever. The loop answers every write
	// it takes before it exits, so once it is gone an unanswered write was
	// never run.
	select {
	case <-o.decided: // nil for other writes: never ready
		return nil
	case err := <-o.done:
		return err
	case <-s.loopDone:
		select {
		case err := <-o.done:
			return err
		default:
			return ErrClosed
		}
	}
}

func (s *Store) loop() {
	defer close(s.loopDone)
	var carried []*op
	for {
		batch := carried
		if len(batch) == 0 {
			select {
			case o := <-s.ops:
				batch = append(batch, o)
			case <-s.closing:
				// Drain what was queued before Close so no caller hangs.
				for {
					select {
					case o := <-s.ops:
						for pending := []*op{o}; len(pending) > 0; {
							pending = s.commit(pending)
						}
					default:
						return
					}
				}
			}
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case o := <-s.ops:
				batch = append(batch, o)
			default:
				break fill
			}
		}
		carried = s.commit(batch)
	}
}

// commit writes a batch in one transaction and returns the writes that
// arrived while it was being made durable, to start the next batch with.
// When one write fails, the transaction is rolled back and every write of
// the batch is retried in a transaction of its own, so one bad write never
// takes others down with it.
//
// The fsync takes most of a commit. While it runs, the loop takes the next
// writes, and decides a sync call's hold at once against the state this
// batch leaves (predecide); the hold is written first thing in the next
// batch. A call thus waits for the commit of its settlement only, not also
// for the one in flight when it asked for its hold.
func (s *Store) commit(batch []*op) (carried []*op) {
	start := time.Now()
	last := s.lastLedgerTime
	clear(s.latest)
	fail := func(err error) []*op {
		for _, o := range batch {
			o.done <- err
		}
		return nil
	}
	if err := s.Err(); err != nil {
		return fail(err)
	}
	var tx *bolt.Tx
	err := guard(func() (err error) {
		tx, err = s.db.Begin(true)
		return err
	})
	if isFault(err) {
		return fail(s.broke(err))
	}
	if err != nil {
		return fail(s.health.commitFailed(len(batch), err))
	}
	for _, o := range batch {
		err := guard(func() error { return o.fn(tx) })
		if isFault(err) {
			guard(tx.Rollback)
			s.written.flush(s.cache)
			s.lastLedgerTime = last
			return fail(s.broke(err))
		}
		if err != nil {
			tx.Rollback()
			// What the transaction wrote leaves the read cache before any
			// writer hears back.
			s.written.flush(s.cache)
			s.lastLedgerTime = last
			s.retryAlone(batch)
			return nil
		}
	}
	if s.Healthy() {
		// While commits fail, a hold's caller waits for the commit, so
		// that a hold that is not recorded is refused, not forwarded.
		for _, o := range batch {
			o.decide()
		}
	}
	result := make(chan error, 1)
	go func() { result <- guard(tx.Commit) }()
	var first, rest []*op
	ops := s.ops
	for {
		select {
		case err = <-result:
		case o := <-ops:
			switch s.predecide(o) {
			case answered:
			case held:
				first = append(first, o)
			default:
				rest = append(rest, o)
			}
			if len(first)+len(rest) == maxBatch {
				ops = nil // take no more; the next batch is full
			}
			continue
		}
		break
	}
	s.written.flush(s.cache)
	s.changes.publish()
	if isFault(err) {
		err = s.broke(err)
	}
	if err != nil {
		s.lastLedgerTime = last
		err = s.health.commitFailed(len(batch), err)
	}
	if observe := s.commitObserver.Load(); observe != nil {
		(*observe)(time.Since(start), len(batch))
	}
	for _, o := range batch {
		o.done <- err
	}
	return append(first, rest...)
}

// retryAlone runs each write of a failed batch in a transaction of its own.
func (s *Store) retryAlone(batch []*op) {
	clear(s.latest)
	for _, o := range batch {
		if err := s.Err(); err != nil {
			o.done <- err
			continue
		}
		keep := s.lastLedgerTime
		ran := false
		err := guard(func() error {
			return s.db.Update(func(tx *bolt.Tx) error {
				if err := o.fn(tx); err != nil {
					return err
				}
				ran = true
				if s.Healthy() {
					o.decide()
				}
				return nil
			})
		})
		s.written.flush(s.cache)
		s.changes.publish()
		if isFault(err) {
			err = s.broke(err)
		}
		if err != nil {
			s.lastLedgerTime = keep
		}
		if err != nil && ran { // the write was fine; the commit failed
			err = s.health.commitFailed(1, err)
		}
		o.done <- err
	}
}

// view runs a read-only transaction.
func (s *Store) view(fn func(tx *bolt.Tx) error) error {
	if err := s.Err(); err != nil {
		return err
	}
	err := guard(func() error { return s.db.View(fn) })
	if isFault(err) {
		return s.broke(err)
	}
	return err
}

func getJSON(b *bolt.Bucket, key []byte, v any) error {
	raw := b.Get(key)
	if raw == nil {
		return store.ErrNotFound
	}
	return json.Unmarshal(raw, v)
}

func putJSON(b *bolt.Bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, raw)
}

// joinKey builds a composite key of parts separated by NUL bytes. Ids never
// contain NUL (the catalog and the handlers refuse it), so the layout is
// unambiguous and prefix scans by user work.
func joinKey(parts ...string) []byte {
	n := 0
	for _, p := range parts {
		n += len(p) + 1
	}
	k := make([]byte, 0, n)
	for i, p := range parts {
		if i > 0 {
			k = append(k, 0)
		}
		k = append(k, p...)
	}
	return k
}

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

var _ store.Store = (*Store)(nil)

// ctxErr lets callers give up waiting before a write is queued; once queued,
// a write is always waited for, because its effect is unknown until it
// commits.
func ctxErr(ctx context.Context) error {
	if ctx == nil {
		return nil
	}
	return ctx.Err()
}
