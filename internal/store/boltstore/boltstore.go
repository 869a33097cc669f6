// Package boltstore is the embedded implementation of store.Store on a bbolt
// file. All writes go through one commit loop that takes whatever queued up
// during the previous commit and writes it in a single fsync'd transaction
// (group commit with no fixed delay), so durability costs one fsync per batch
// rather than per request and throughput does not collapse under load.
package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/platformgw/gateway/internal/store"
	segledger "github.com/platformgw/gateway/internal/store/ledger"
	"github.com/platformgw/gateway/internal/store/settlelog"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// Top-level buckets. Keys are fixed layouts so scans come out ordered.
var (
	bucketKeys         = []byte("keys")          // sha256(key) -> keyRecord
	bucketKeyIDs       = []byte("key_ids")       // key id -> sha256(key)
	bucketKeyUsers     = []byte("key_users")     // user \0 key id -> sha256(key)
	bucketSubs         = []byte("subscriptions") // user \0 service -> Subscription
	bucketCounters     = []byte("counters")      // user \0 service \0 period(8) -> counter
	bucketLedger       = []byte("ledger")        // time(8) seq(8) -> LedgerEntry: the ledger before the ledger directory (ledger.go), moved out at Open
	bucketReservations = []byte("reservations")  // reservation id -> reservation
	bucketIdempotency  = []byte("idempotency")   // service \0 key -> idemRecord
	bucketJobs         = []byte("jobs")          // job id -> Job: the ended jobs (the open ones are in bucketLiveJobs, jobslive.go)
	bucketOpenJobs     = []byte("jobs_open")     // expires(8) id -> nil
)

var allBuckets = [][]byte{
	bucketKeys, bucketKeyIDs, bucketKeyUsers, bucketSubs, bucketCounters,
	bucketReservations, bucketIdempotency, bucketJobs, bucketOpenJobs, bucketLiveJobs,
	bucketAlerts, bucketAlertKeys, bucketAlertsDue,
}

// knownBuckets are the buckets a platform store may have: allBuckets, and
// the ledger bucket of a store from before the ledger directory.
func knownBuckets() [][]byte { return append(slices.Clip(allBuckets), bucketLedger) }

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

	// cache serves the key and subscription lookups of every call;
	// written collects what the current commit changed in it (commit
	// loop only), dropped from the cache once the commit is over.
	cache   *readCache
	written written

	// The settlement path (settle.go): the billing figures in memory, the
	// settlement log, and what is appended but not yet applied.
	settled
	log *settlelog.Log
	// led is the ledger of record (ledger.go).
	led *segledger.Ledger
	// fs is where the settlement log and the ledger directory are
	// (Options.FS).
	fs vfs.FS

	// failure, once set, is why the store is unusable: bbolt failed on a
	// damaged page while serving. Every later read and write gets it
	// without touching the file, and Close leaves the file alone (bbolt
	// may still hold its locks from the transaction that failed).
	failure atomic.Pointer[error]

	// health says whether commits succeed; holds are refused while they
	// fail (health.go).
	health health
	// staleNote is said once a logger is set: the directories of an
	// interrupted backup or restore that Open removed (backup.go).
	staleNote string
	staleWarn bool
	// sealNote is said once a logger is set: how many records of an
	// earlier build's store Open gave their checksum (recordsum.go).
	sealNote string

	// changes are the subscriptions whose usage changed, for the usage
	// alerts (alerts.go).
	changes changeSet

	// jobIDs filters the ids of the jobs stored, for the check that a
	// new job's id is new (jobs.go); guarded by jobMu.
	jobIDs jobIDs

	// pay serialises the credit grants' changes (payments.go).
	pay payState
	// live says which jobs are in bucketLiveJobs, and where (jobslive.go).
	live liveJobs
}

type op struct {
	fn   func(tx *bolt.Tx) error
	done chan error
	// applier marks the applier's write: its failure is not a failed
	// write of a caller (its records are safe in the settlement log and
	// retried), so it neither counts nor makes the store unhealthy.
	applier bool
}

// lockWait is how long Open waits for another process to let go of the
// file.
var lockWait = 5 * time.Second

// Options tune a store.
type Options struct {
	// Durability says when a settlement is acknowledged: settlelog.Sync
	// (the default) once an fdatasync covers it, settlelog.Write once it
	// is written (see docs/reliability.md).
	Durability settlelog.Mode
	// FlushInterval is how often Write mode fdatasyncs (default 5ms).
	FlushInterval time.Duration
	// EagerSync starts each of Sync mode's fdatasyncs as soon as the one
	// before ended, instead of pacing them (settlelog.Options.Eager).
	EagerSync bool
	// FS is the file system of the settlement log and the ledger
	// directory (nil: the OS's). The storage simulation (sim_test.go)
	// puts them on its simulated disk; the bbolt file is on the OS always.
	FS vfs.FS
}

// Open opens the store at path with the default options; see OpenWith.
func Open(path string) (*Store, error) { return OpenWith(path, Options{}) }

// remainsWithoutFile refuses to create a store file at path while parts of
// a store that was there are left: a ledger directory that holds anything,
// or settlement log segments (a restore cut off between moving the ledger
// directory and the file into place, the file moved or deleted alone). A
// new, empty store would start beside them: every key, subscription and
// credit gone, and their rows and settlements carried on under it.
func remainsWithoutFile(path string) error {
	var there []string
	names, err := os.ReadDir(LedgerDir(path))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open store %s: %w", path, err)
	}
	if len(names) > 0 {
		there = append(there, "its ledger directory "+LedgerDir(path))
	}
	segs, err := settlelog.Segments(path)
	if err != nil {
		return fmt.Errorf("open store %s: %w", path, err)
	}
	if len(segs) > 0 {
		there = append(there, "its settlement log "+strings.Join(segs, ", "))
	}
	if len(there) == 0 {
		return nil
	}
	return fmt.Errorf("open store %s: the file does not exist, but %s does: a new, empty store is not started beside what is left of one (every key, subscription and credit would be gone and its usage carried on); put back the file it belongs with (or restore both from a backup, docs/operations.md), or move it away to start an empty store on purpose",
		path, strings.Join(there, " and "))
}

// OpenWith opens the store file at path, or creates it if the path does
// not exist, replays the settlement log beside it onto the file, and
// starts the commit loop and the applier. An existing file must be a
// sound platform store (see inspect and verify): a damaged, empty or
// foreign file is refused with ErrDamaged, never started afresh, and one
// another process holds is ErrLocked. A settlement log that is not ours
// or is damaged before its end is an error too.
func OpenWith(path string, o Options) (*Store, error) {
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
		if err := remainsWithoutFile(path); err != nil {
			return nil, err
		}
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
		fs:       vfs.Or(o.FS),
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
			if string(m.Get(keyFormat)) != string(sealedFormat) {
				// A store of an earlier build: every record gets its
				// checksum now, in this transaction, so that from here on
				// every read checks one.
				n, err := sealStore(tx)
				if err != nil {
					return fmt.Errorf("add checksums to the records: %w", err)
				}
				if exists {
					s.sealNote = fmt.Sprintf("store %s: added a checksum to each of its %d records (store format %s); every read checks it from now on, and gateways before this one no longer open the file",
						path, n, storeFormat)
				}
			}
			// Format 3 keeps open jobs in bucketLiveJobs (created
			// above): a gateway that reads format 2 would not see them,
			// so it must refuse the file. A format 2 store's open jobs
			// stay in bucketJobs, where they are found as before.
			if err := m.Put(keyFormat, storeFormat); err != nil {
				return err
			}
		}
		if err := s.indexLiveJobs(tx); err != nil {
			return fmt.Errorf("index the open jobs: %w", err)
		}
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
	if err := s.openLedger(); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.openLog(o); err != nil {
		s.led.Close()
		db.Close()
		return nil, err
	}
	if err := s.indexJobIDs(); err != nil {
		s.log.Close(0)
		s.led.Close()
		db.Close()
		return nil, err
	}
	s.staleNote, s.staleWarn = removeStaleTemps(path)
	go s.loop()
	go s.applier()
	if err := s.settleDroppedHolds(); err != nil { // heldexpiry.go
		s.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return s, nil
}

// Path is the file the store lives in.
func (s *Store) Path() string { return s.path }

// ObserveCommits sets a function told about every group commit: every
// fdatasync of the settlement log (with the settlements it made durable)
// and every commit of the file (with the writes it carried; the applier's
// is one).
func (s *Store) ObserveCommits(fn func(d time.Duration, writes int)) {
	if s.log != nil {
		s.log.Observe(fn)
	}
	if fn == nil {
		s.commitObserver.Store(nil)
		return
	}
	s.commitObserver.Store(&fn)
}

// Close applies every settlement to the file and waits for queued writes
// to commit, then closes the file and the settlement log.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.stopApplier()
		close(s.closing)
	})
	<-s.loopDone
	// The applier has stopped: nothing appends to the ledger any more.
	var lerr error
	if s.led != nil {
		lerr = s.led.Close()
	}
	if err := s.Err(); err != nil {
		return err
	}
	if err := s.db.Close(); err != nil {
		return err
	}
	return lerr
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

// wait queues o for the next group commit and waits until it is durable.
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

// commit writes a batch in one transaction. When one write fails, the
// transaction is rolled back and every write of the batch is retried in a
// transaction of its own, so one bad write never takes others down with
// it. Writes that queue meanwhile make the next batch.
func (s *Store) commit(batch []*op) (carried []*op) {
	start := time.Now()
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
		return fail(s.commitFailed(batch, err))
	}
	for _, o := range batch {
		err := guard(func() error { return o.fn(tx) })
		if isFault(err) {
			guard(tx.Rollback)
			s.written.flush(s.cache)
			return fail(s.broke(err))
		}
		if err != nil {
			tx.Rollback()
			// What the transaction wrote leaves the read cache before any
			// writer hears back.
			s.written.flush(s.cache)
			s.retryAlone(batch)
			return nil
		}
	}
	err = guard(tx.Commit)
	s.written.flush(s.cache)
	s.changes.publish()
	if isFault(err) {
		err = s.broke(err)
	}
	if err != nil {
		err = s.commitFailed(batch, err)
	}
	if observe := s.commitObserver.Load(); observe != nil {
		(*observe)(time.Since(start), len(batch))
	}
	for _, o := range batch {
		o.done <- err
	}
	return nil
}

// commitFailed records a failed commit of the callers' writes in batch
// (store health) and returns the error they get.
func (s *Store) commitFailed(batch []*op, err error) error {
	n := 0
	for _, o := range batch {
		if !o.applier {
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return s.health.commitFailed(n, err)
}

// retryAlone runs each write of a failed batch in a transaction of its own.
func (s *Store) retryAlone(batch []*op) {
	for _, o := range batch {
		if err := s.Err(); err != nil {
			o.done <- err
			continue
		}
		ran := false
		err := guard(func() error {
			return s.db.Update(func(tx *bolt.Tx) error {
				if err := o.fn(tx); err != nil {
					return err
				}
				ran = true
				return nil
			})
		})
		s.written.flush(s.cache)
		s.changes.publish()
		if isFault(err) {
			err = s.broke(err)
		}
		if err != nil && ran { // the write was fine; the commit failed
			err = s.commitFailed([]*op{o}, err)
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
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
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
