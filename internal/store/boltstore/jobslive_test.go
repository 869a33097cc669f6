package boltstore

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
)

// placement is where the file keeps the jobs: the live bucket's ids in key
// order (with their keys) and the ended jobs' bucket's ids.
func placement(t testing.TB, s *Store) (live []string, nums []uint64, ended []string) {
	t.Helper()
	if err := s.applyAll(); err != nil {
		t.Fatal(err)
	}
	err := s.view(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketLiveJobs).ForEach(func(k, v []byte) error {
			var rec jobRecord
			if err := decodeJSON(bucketLiveJobs, k, v, &rec); err != nil {
				return err
			}
			live = append(live, rec.ID)
			nums = append(nums, binary.BigEndian.Uint64(k))
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketJobs).ForEach(func(k, _ []byte) error {
			ended = append(ended, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return live, nums, ended
}

func wantPlacement(t testing.TB, s *Store, live, ended string) {
	t.Helper()
	l, nums, e := placement(t, s)
	if got := fmt.Sprint(l); got != live {
		t.Errorf("live jobs %s, want %s", got, live)
	}
	if !slices.IsSorted(nums) {
		t.Errorf("live jobs' keys %v are not in creation order", nums)
	}
	if got := fmt.Sprint(e); got != ended {
		t.Errorf("ended jobs %s, want %s", got, ended)
	}
	s.live.mu.RLock()
	n := len(s.live.ids)
	s.live.mu.RUnlock()
	if n != len(l) {
		t.Errorf("the live index has %d jobs, the live bucket %d", n, len(l))
	}
}

// TestLiveJobs: a job created open is appended to the live bucket in
// creation order and stays there while it changes; when it ends it moves
// to the ended jobs' bucket under its id. A crash before the moves are
// applied replays them to the same places, the index is rebuilt, every
// job reads back and lists in id order, and the holds are the open jobs'.
func TestLiveJobs(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "quota", quotaBlock, 0)
	for _, id := range []string{"c", "a", "d"} {
		reserveJob(t, s, id, a, whole(2))
	}
	done := newJob("b", t0.Add(time.Hour)) // imported ended: straight to its id
	done.Status = store.JobCompleted
	if err := s.CreateJob(ctx, done); err != nil {
		t.Fatal(err)
	}
	wantPlacement(t, s, "[c a d]", "[b]")

	if _, err := s.UpdateJob(ctx, "a", func(j *store.Job) error { j.Status = store.JobRunning; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompleteJob(ctx, "c", a, completion(a, "c", whole(1)), complete(store.JobCompleted, "dc")); err != nil {
		t.Fatal(err)
	}
	wantPlacement(t, s, "[a d]", "[b c]")
	if st := stateOf(t, s, a, t0); st.Used != whole(1) || st.Reserved != whole(4) {
		t.Fatalf("after c: used %s, held %s; want 1 and 4", st.Used, st.Reserved)
	}

	// Changes the file does not have yet when the process dies.
	if _, err := s.CompleteJob(ctx, "a", a, completion(a, "a", whole(3)), complete(store.JobCompleted, "da")); err != nil {
		t.Fatal(err)
	}
	reserveJob(t, s, "e", a, whole(2))
	if _, err := s.UpdateJob(ctx, "e", func(j *store.Job) error { j.PercentageComplete = 50; return nil }); err != nil {
		t.Fatal(err)
	}
	crash(t, s)

	s = openAt(t, path)
	wantPlacement(t, s, "[d e]", "[a b c]")
	if st := stateOf(t, s, a, t0); st.Used != whole(4) || st.Reserved != whole(4) {
		t.Errorf("after the replay: used %s, held %s; want 4 and 4", st.Used, st.Reserved)
	}
	if n := holdsStored(t, s); n != 2 {
		t.Errorf("%d holds stored, want the open jobs' 2", n)
	}
	want := map[string]string{"a": store.JobCompleted, "b": store.JobCompleted, "c": store.JobCompleted,
		"d": store.JobPending, "e": store.JobPending}
	for id, status := range want {
		j, err := s.GetJob(ctx, id)
		if err != nil || j.Status != status {
			t.Errorf("GetJob(%s) = %s, %v; want %s", id, j.Status, err, status)
		}
	}
	if j, _ := s.GetJob(ctx, "e"); j.PercentageComplete != 50 {
		t.Errorf("e at %v%%, want 50", j.PercentageComplete)
	}
	if _, err := s.GetJob(ctx, "x"); err != store.ErrNotFound {
		t.Errorf("GetJob(x): %v, want ErrNotFound", err)
	}
	if err := s.CreateJob(ctx, newJob("d", t0.Add(time.Hour))); err != store.ErrExists {
		t.Errorf("a live job's id again: %v, want ErrExists", err)
	}
	var listed []string
	cursor := ""
	for range 10 {
		page, next, err := s.ListJobs(ctx, store.JobFilter{}, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range page {
			listed = append(listed, j.ID)
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	if got := fmt.Sprint(listed); got != "[a b c d e]" {
		t.Errorf("listed %s, want [a b c d e]", got)
	}

	// Expiry ends the rest, and gives back their holds.
	if n, err := s.ExpireJobs(ctx, t0.Add(2*time.Hour), "expired"); err != nil || n != 2 {
		t.Fatalf("ExpireJobs = %d, %v; want 2", n, err)
	}
	wantPlacement(t, s, "[]", "[a b c d e]")
	if st := stateOf(t, s, a, t0); st.Used != whole(4) || st.Reserved != 0 {
		t.Errorf("after expiry: used %s, held %s; want 4 and 0", st.Used, st.Reserved)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openAt(t, path)
	if j, err := s.GetJob(ctx, "d"); err != nil || j.Status != store.JobFailed {
		t.Errorf("GetJob(d) after a restart = %s, %v; want FAILED", j.Status, err)
	}
}

// TestFormat2OpenJobs: a format 2 store's open jobs are in the ended jobs'
// bucket under their ids; Open records format 3 without moving them, and
// they read, list, complete and release their holds there.
func TestFormat2OpenJobs(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "quota", quotaBlock, 0)
	reserveJob(t, s, "old", a, whole(2))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Make it the file a format 2 gateway left: the job under its id.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		lb := tx.Bucket(bucketLiveJobs)
		k, v := lb.Cursor().First()
		payload, err := unseal(bucketLiveJobs, k, v)
		if err != nil {
			return err
		}
		if err := putRaw(tx, bucketJobs, []byte("old"), payload); err != nil {
			return err
		}
		if err := tx.DeleteBucket(bucketLiveJobs); err != nil {
			return err
		}
		return tx.Bucket(bucketMarker).Put(keyFormat, sealedFormat)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	s = openAt(t, path)
	if err := s.view(func(tx *bolt.Tx) error {
		if f := tx.Bucket(bucketMarker).Get(keyFormat); string(f) != string(storeFormat) {
			return fmt.Errorf("format %q after Open, want %q", f, storeFormat)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if st := stateOf(t, s, a, t0); st.Reserved != whole(2) {
		t.Fatalf("held %s after Open, want the open job's 2", st.Reserved)
	}
	reserveJob(t, s, "new", a, whole(1))
	wantPlacement(t, s, "[new]", "[old]")
	if jobs, _, err := s.ListJobs(ctx, store.JobFilter{}, "", 10); err != nil || len(jobs) != 2 || jobs[0].ID != "new" || jobs[1].ID != "old" {
		t.Fatalf("ListJobs = %v, %v", jobs, err)
	}
	if _, err := s.CompleteJob(ctx, "old", a, completion(a, "old", whole(1)), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	wantPlacement(t, s, "[new]", "[old]")
	if st := stateOf(t, s, a, t0); st.Used != whole(1) || st.Reserved != whole(1) {
		t.Errorf("used %s, held %s; want 1 and 1", st.Used, st.Reserved)
	}
	if n := holdsStored(t, s); n != 1 {
		t.Errorf("%d holds stored, want 1", n)
	}
}

// TestLiveJobsReadWhileMoving: jobs read from the file while the applier
// moves them to the ended jobs' bucket are always found.
func TestLiveJobsReadWhileMoving(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "quota", walQuota, 0)
	const n = 90
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("job-%03d", i)
		reserveJob(t, s, ids[i], a, whole(1))
	}
	if err := s.applyAll(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := r; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := ids[i%n]
				s.cache.drop(nil, nil, []string{id}) // read the file, not the cache
				if _, err := s.GetJob(ctx, id); err != nil {
					errs <- fmt.Errorf("GetJob(%s): %w", id, err)
					return
				}
			}
		}()
	}
	for i, id := range ids {
		if _, err := s.CompleteJob(ctx, id, a, completion(a, id, whole(1)), complete(store.JobCompleted, "d")); err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 {
			if err := s.applyAll(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.applyAll(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	wantPlacement(t, s, "[]", fmt.Sprint(ids))
}
