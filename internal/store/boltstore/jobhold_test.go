package boltstore

import (
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// holdsStored counts the reservation records in the file.
func holdsStored(t testing.TB, s *Store) int {
	t.Helper()
	n := 0
	if err := s.applyAll(); err != nil { // job holds are stored as their records are applied
		t.Fatal(err)
	}
	if err := s.view(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketReservations).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// reserveJob creates job id holding units for a, and fails the test unless
// the hold was taken.
func reserveJob(t testing.TB, s *Store, id string, a store.Account, units billing.Units) store.Reservation {
	t.Helper()
	j := newJob(id, t0.Add(time.Hour))
	j.ServiceID, j.ProductID = a.ServiceID, a.Product.ID
	res, err := s.CreateJobReserved(ctx, j, a, units, t0)
	dec := res.Decision
	if err != nil || !dec.Allowed || res.ID == "" || res.JobID != id {
		t.Fatalf("CreateJobReserved(%s, %s) = %+v, %+v, %v", id, units, res, dec, err)
	}
	return res
}

func completion(a store.Account, id string, units billing.Units) store.LedgerEntry {
	return store.LedgerEntry{Time: t0.Add(time.Minute), UserID: a.UserID, ServiceID: a.ServiceID, ProductID: a.Product.ID,
		RequestID: id, Units: units, Source: store.SourceCompletion}
}

// TestJobHoldSurvivesRestart: a crash releases the holds of sync calls,
// which died with the process, but keeps those of open jobs, which a
// backend may still complete.
func TestJobHoldSurvivesRestart(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	q := subscribe(t, s, "u1", "quota", quotaBlock, 0)
	p := subscribe(t, s, "u1", "prepaid", prepaid, whole(10))
	reserveJob(t, s, "job-q", q, whole(3))
	reserveJob(t, s, "job-p", p, whole(8)) // 2 credits
	reserveJob(t, s, "job-failed", q, whole(2))
	if _, err := s.UpdateJob(ctx, "job-failed", complete(store.JobFailed, "d")); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Reserve(ctx, q, whole(6), t0); err != nil || !res.Decision.Allowed {
		t.Fatalf("sync Reserve: %+v, %v", res.Decision, err)
	}
	if res, err := s.Reserve(ctx, p, whole(4), t0); err != nil || !res.Decision.Allowed {
		t.Fatalf("sync Reserve: %+v, %v", res.Decision, err)
	}
	if st := stateOf(t, s, q, t0); st.Reserved != whole(9) {
		t.Fatalf("before the crash: %+v", st)
	}
	if err := s.Close(); err != nil { // as kill -9: every hold is committed
		t.Fatal(err)
	}

	s = openAt(t, path)
	if st := stateOf(t, s, q, t0); st.Reserved != whole(3) || st.Used != 0 {
		t.Errorf("quota after restart: %+v, want the job's 3 still held", st)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "prepaid"); sub.CreditsHeld != whole(2) || sub.Credits != whole(10) {
		t.Errorf("prepaid after restart: %+v, want the job's 2 credits held", sub)
	}
	if n := holdsStored(t, s); n != 2 {
		t.Errorf("%d holds stored after restart, want the two open jobs'", n)
	}
	// The quota left is what the job does not hold.
	if res, _ := s.Reserve(ctx, q, whole(8), t0); res.Decision.Allowed {
		t.Error("the job's hold was released by the restart")
	}
	// The job completes after the restart against its hold.
	j, err := s.CompleteJob(ctx, "job-q", q, completion(q, "job-q", whole(3)), complete(store.JobCompleted, "d"))
	if err != nil || j.Units != whole(3) {
		t.Fatalf("CompleteJob after restart = %+v, %v", j, err)
	}
	if st := stateOf(t, s, q, t0); st.Reserved != 0 || st.Used != whole(3) {
		t.Errorf("after completion: %+v", st)
	}
	// A job expired while the process was down is released by the sweep.
	if n, err := s.ExpireJobs(ctx, t0.Add(2*time.Hour), "expired"); err != nil || n != 1 {
		t.Fatalf("ExpireJobs = %d, %v", n, err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "prepaid"); sub.CreditsHeld != 0 || sub.Credits != whole(10) {
		t.Errorf("prepaid after expiry: %+v", sub)
	}
	s.Close()
	s = openAt(t, path)
	if n := holdsStored(t, s); n != 0 {
		t.Errorf("%d holds left after every job ended", n)
	}
	if st := stateOf(t, s, q, t0); st.Reserved != 0 || st.Used != whole(3) {
		t.Errorf("after a second restart: %+v", st)
	}
}

// TestJobEndsReleaseHold: every end but a completion with units gives the
// hold back and charges nothing, exactly once.
func TestJobEndsReleaseHold(t *testing.T) {
	ends := []struct {
		name string
		end  func(s *Store, a store.Account) error
	}{
		{"FAILED completion with units", func(s *Store, a store.Account) error {
			_, err := s.CompleteJob(ctx, "job", a, completion(a, "job", whole(5)), complete(store.JobFailed, "d"))
			return err
		}},
		{"COMPLETED without units", func(s *Store, a store.Account) error {
			_, err := s.CompleteJob(ctx, "job", a, completion(a, "job", 0), complete(store.JobCompleted, "d"))
			return err
		}},
		{"backend refused the envelope", func(s *Store, a store.Account) error {
			_, err := s.UpdateJob(ctx, "job", func(j *store.Job) error {
				j.Status, j.ErrorMessage = store.JobFailed, "the service backend refused the job (HTTP 500)"
				return nil
			})
			return err
		}},
		{"expired", func(s *Store, a store.Account) error {
			n, err := s.ExpireJobs(ctx, t0.Add(2*time.Hour), "expired")
			if err == nil && n != 1 {
				err = fmt.Errorf("ExpireJobs expired %d jobs, want 1", n)
			}
			return err
		}},
	}
	for _, p := range []billing.Product{quotaBlock, prepaid} {
		for _, tt := range ends {
			t.Run(p.ID+"/"+tt.name, func(t *testing.T) {
				s := openTemp(t)
				a := subscribe(t, s, "u1", "svc", p, whole(2))
				before := stateOf(t, s, a, t0)
				reserveJob(t, s, "job", a, whole(6))
				if st := stateOf(t, s, a, t0); st == before {
					t.Fatalf("nothing held: %+v", st)
				}
				// Progress leaves the hold alone.
				if _, err := s.UpdateJob(ctx, "job", func(j *store.Job) error { j.Status = store.JobRunning; return nil }); err != nil {
					t.Fatal(err)
				}
				if err := tt.end(s, a); err != nil {
					t.Fatal(err)
				}
				if j, _ := s.GetJob(ctx, "job"); !j.Terminal() || j.Units != 0 || j.Cost != 0 {
					t.Errorf("job %+v", j)
				}
				if st := stateOf(t, s, a, t0); st != before {
					t.Errorf("state %+v, want %+v as before the job", st, before)
				}
				if n := holdsStored(t, s); n != 0 {
					t.Errorf("%d holds left", n)
				}
				// Every other end afterwards changes nothing: the hold was
				// given back once.
				for _, other := range ends {
					other.end(s, a)
				}
				if st := stateOf(t, s, a, t0); st != before {
					t.Errorf("after repeated ends: %+v, want %+v", st, before)
				}
				if n := len(ledger(t, s, store.LedgerFilter{})); n != 0 {
					t.Errorf("%d ledger entries", n)
				}
			})
		}
	}
}

// TestJobIDFilter: the filter that spares a new job's id a read of the
// file still refuses every id the store has, pending or in the file, and
// after a restart (it is rebuilt from the file), and lets a new one in.
func TestJobIDFilter(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", quotaAllow, 0)
	if _, err := s.CreateJobReserved(ctx, newJob("pending", t0.Add(time.Hour)), a, whole(1), t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateJobReserved(ctx, newJob("pending", t0.Add(time.Hour)), a, whole(1), t0); err != store.ErrExists {
		t.Fatalf("a pending job's id again: %v, want ErrExists", err)
	}
	if err := s.CreateJob(ctx, newJob("applied", t0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if err := s.applyAll(); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(ctx, newJob("applied", t0.Add(time.Hour))); err != store.ErrExists {
		t.Fatalf("an applied job's id again: %v, want ErrExists", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openAt(t, path)
	for _, id := range []string{"pending", "applied"} {
		if err := s.CreateJob(ctx, newJob(id, t0.Add(time.Hour))); err != store.ErrExists {
			t.Fatalf("job %s after a restart: %v, want ErrExists", id, err)
		}
	}
	if err := s.CreateJob(ctx, newJob("new", t0.Add(time.Hour))); err != nil {
		t.Fatalf("a new id after a restart: %v", err)
	}
	if j, err := s.GetJob(ctx, "new"); err != nil || j.ID != "new" {
		t.Fatalf("GetJob(new) = %+v, %v", j, err)
	}
}
