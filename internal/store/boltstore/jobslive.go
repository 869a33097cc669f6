package boltstore

import (
	"encoding/binary"
	"slices"
	"strings"
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
)

// The live jobs. A job created open is appended to bucketLiveJobs under
// the bucket's next number (creation order) rather than inserted into
// bucketJobs at its id: ids are random UUIDs, so every insert there
// dirtied a leaf page of its own, copied and written whole at the next
// apply, the largest part of an async invoke's cost in the store
// (docs/performance.md, "Async invoke (202)"). Appended, the jobs of an
// apply share the bucket's last pages. While the job is open its changes
// (progress, a new deadline) are written in place there, near the end;
// when it ends (completed, failed, expired) the applier moves it to
// bucketJobs under its id, where ended jobs are, with jobs created ended
// (imports) and the jobs a format 2 store had open, which stay there.
//
// A job is in the live bucket exactly when the live index names it (id ->
// number). The index is built from the bucket at Open, before the
// settlement log's replay, and changed only by the applier, once the
// transaction that moved the job has committed: a reader that finds the
// job in neither place looks again if the index changed meanwhile
// (viewJob). Its memory is that of the open jobs, about 80 bytes each.
// Durability is unchanged: a job is acknowledged once its record is in
// the settlement log, as before; where the applier later writes it is
// the applier's and the replay's business, the same at both.

// bucketLiveJobs holds the open jobs: number(8) -> the job's record, as
// bucketJobs holds them.
var bucketLiveJobs = []byte("jobs_live")

// liveJobs is the live index.
type liveJobs struct {
	mu  sync.RWMutex
	ids map[string]uint64
	gen uint64 // counts the commits that changed ids
	// sorted is ids in id order as of sortedGen, for ListJobs.
	sorted    []liveJob
	sortedGen uint64

	// The changes of the applier's transaction tx, installed once it
	// commits (0: the job left the live bucket). Only the goroutine
	// running the applier's transaction uses them.
	tx      *bolt.Tx
	pending map[string]uint64
}

type liveJob struct {
	id  string
	num uint64
}

// lookup says where the file keeps the job: in the live bucket under num,
// or (live false) in bucketJobs; gen is the index's generation.
func (l *liveJobs) lookup(id string) (num uint64, live bool, gen uint64) {
	l.mu.RLock()
	num, live = l.ids[id]
	gen = l.gen
	l.mu.RUnlock()
	return num, live, gen
}

func (l *liveJobs) generation() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.gen
}

// inTx is lookup for the applier, inside its transaction tx: what tx has
// changed first.
func (l *liveJobs) inTx(tx *bolt.Tx, id string) (uint64, bool) {
	if l.tx == tx {
		if n, ok := l.pending[id]; ok {
			return n, n != 0
		}
	}
	n, _, _ := l.lookup(id)
	return n, n != 0
}

// set records, in tx, that the job is now under num in the live bucket
// (0: no longer there); the index follows when tx commits.
func (l *liveJobs) set(tx *bolt.Tx, id string, num uint64) {
	if l.tx != tx {
		// A transaction of the applier that did not commit (it is
		// retried in another) leaves nothing behind.
		l.tx, l.pending = tx, make(map[string]uint64)
		tx.OnCommit(func() {
			l.mu.Lock()
			for id, n := range l.pending {
				if n == 0 {
					delete(l.ids, id)
				} else {
					l.ids[id] = n
				}
			}
			l.gen++
			l.mu.Unlock()
			l.tx, l.pending = nil, nil
		})
	}
	l.pending[id] = num
}

// inOrder is the live jobs in id order.
func (l *liveJobs) inOrder() []liveJob {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sorted == nil || l.sortedGen != l.gen {
		l.sorted = l.sorted[:0]
		for id, n := range l.ids {
			l.sorted = append(l.sorted, liveJob{id, n})
		}
		slices.SortFunc(l.sorted, func(a, b liveJob) int { return strings.Compare(a.id, b.id) })
		l.sortedGen = l.gen
	}
	return slices.Clone(l.sorted)
}

// indexLiveJobs builds the live index from the file, in tx (Open's first
// transaction, before anything reads a job).
func (s *Store) indexLiveJobs(tx *bolt.Tx) error {
	b := tx.Bucket(bucketLiveJobs)
	ids := make(map[string]uint64, b.Stats().KeyN)
	err := b.ForEach(func(k, v []byte) error {
		var rec struct {
			ID string `json:"requestId"`
		}
		if err := decodeJSON(bucketLiveJobs, k, v, &rec); err != nil {
			return err
		}
		ids[rec.ID] = binary.BigEndian.Uint64(k)
		return nil
	})
	if err != nil {
		return err
	}
	s.live.mu.Lock()
	s.live.ids = ids
	s.live.gen++
	s.live.mu.Unlock()
	return nil
}

// applyJob writes a job's change where the job lives (see above); the
// applier runs it in its transaction.
func (s *Store) applyJob(tx *bolt.Tx, j *jobChange) error {
	num, live := s.live.inTx(tx, j.id)
	// A job ends exactly when its change takes it out of the open-jobs
	// index without putting it back (putJob): a live job is open.
	ended := len(j.oldOpen) > 0 && len(j.newOpen) == 0
	switch {
	case j.newJob && len(j.newOpen) > 0:
		b := tx.Bucket(bucketLiveJobs)
		n, err := b.NextSequence()
		if err != nil {
			return err
		}
		if err := putRaw(tx, bucketLiveJobs, u64(n), j.raw); err != nil {
			return err
		}
		s.live.set(tx, j.id, n)
		return nil
	case live && !ended:
		return putRaw(tx, bucketLiveJobs, u64(num), j.raw)
	case live:
		if err := tx.Bucket(bucketLiveJobs).Delete(u64(num)); err != nil {
			return err
		}
		s.live.set(tx, j.id, 0)
	}
	return putRaw(tx, bucketJobs, []byte(j.id), j.raw)
}

// findJob reads the job's record in tx from where the index said it was
// (num, live), or else from bucketJobs.
func findJob(tx *bolt.Tx, id string, num uint64, live bool) (jobRecord, error) {
	var rec jobRecord
	if live {
		k := u64(num)
		if raw := tx.Bucket(bucketLiveJobs).Get(k); raw != nil {
			if err := decodeJSON(bucketLiveJobs, k, raw, &rec); err != nil {
				return rec, err
			}
			if rec.ID == id {
				return rec, nil
			}
			rec = jobRecord{}
		}
	}
	err := getJSON(tx, bucketJobs, []byte(id), &rec)
	return rec, err
}

// viewJob runs fn on the job's stored record in a read transaction;
// store.ErrNotFound if the file has no such job. The index is read before
// the transaction starts: a job the applier moved meanwhile is found in
// bucketJobs, and one the transaction does not see where the index said
// is looked up again once the index has changed.
func (s *Store) viewJob(id string, fn func(tx *bolt.Tx, rec jobRecord) error) error {
	for {
		num, live, gen := s.live.lookup(id)
		err := s.view(func(tx *bolt.Tx) error {
			rec, err := findJob(tx, id, num, live)
			if err != nil {
				return err
			}
			return fn(tx, rec)
		})
		if err != store.ErrNotFound || s.live.generation() == gen {
			return err
		}
	}
}
