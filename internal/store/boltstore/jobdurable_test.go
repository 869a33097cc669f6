package boltstore

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// holdSyncFS holds the next fdatasync of a settlement-log segment, once
// armed, until release is closed, and then fails it: a record written,
// its sync slow, then refused.
type holdSyncFS struct {
	vfs.FS
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

type holdSyncFile struct {
	vfs.File
	fs  *holdSyncFS
	log bool
}

func newHoldSyncFS() *holdSyncFS {
	return &holdSyncFS{FS: vfs.OS, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *holdSyncFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := g.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return holdSyncFile{File: f, fs: g, log: strings.HasSuffix(name, ".settle")}, nil
}

func (f holdSyncFile) Datasync() error {
	if f.log && f.fs.armed.CompareAndSwap(true, false) {
		close(f.fs.entered)
		<-f.fs.release
		return errors.New("EIO (injected)")
	}
	return f.File.Datasync()
}

// finishJob is the usage handler's completion fn: a finished job refuses
// a change, and tells the same completion again apart (answered 200).
func finishJob(status, digest, result string) func(*store.Job) error {
	return func(j *store.Job) error {
		if j.Terminal() {
			if j.CompletionDigest == digest {
				return errSameCompletionTest
			}
			return errFinishedTest
		}
		j.Status, j.CompletionDigest, j.Result = status, digest, result
		j.UpdatedAt, j.CompletedAt = t0.Add(time.Minute), t0.Add(time.Minute)
		if status == store.JobCompleted {
			j.PercentageComplete = 100
		}
		return nil
	}
}

// progressJob is the usage handler's progress fn.
func progressJob(pct float64) func(*store.Job) error {
	return func(j *store.Job) error {
		if j.Terminal() {
			return errFinishedTest
		}
		j.Status, j.PercentageComplete, j.UpdatedAt = store.JobRunning, pct, t0.Add(time.Minute)
		return nil
	}
}

var (
	errSameCompletionTest = errors.New("the same completion again (the handler answers 200)")
	errFinishedTest       = errors.New("the job is finished (the handler answers 409)")
)

// TestJobChangeInvisibleUntilDurable: a job's change is seen by no one
// until its settlement record is durable. A completion whose fdatasync
// is slow and then fails used to be visible meanwhile: the caller's poll
// got COMPLETED with the result, the backend's retry of the same
// completion was acknowledged (200) at once, a different completion or a
// progress report was refused as if the job had ended; then the sync
// failed, the job went back to PENDING and the charge was undone, and the
// backend, holding a 200, never sent it again. Now whatever reads or
// changes that job waits for the record's fate, and sees the job as the
// durable records leave it. Progress and failure are job changes of the
// same kind and are held back alike.
func TestJobChangeInvisibleUntilDurable(t *testing.T) {
	type result struct {
		job store.Job
		err error
	}
	cases := []struct {
		name string
		// first is the change whose record's fdatasync is held, then fails.
		first func(s *Store, q store.Account) error
		// second runs while first's fdatasync is held.
		second func(s *Store, q store.Account) (store.Job, error)
		// check judges second's result (and the store) once all is done.
		check func(t *testing.T, s *Store, q store.Account, r result)
	}{
		{
			name: "poll during a completion",
			first: func(s *Store, q store.Account) error {
				_, err := s.CompleteJob(ctx, "job-1", q, completion(q, "job-1", whole(1)),
					finishJob(store.JobCompleted, "d", "the result"))
				return err
			},
			second: func(s *Store, _ store.Account) (store.Job, error) { return s.GetJob(ctx, "job-1") },
			check: func(t *testing.T, s *Store, q store.Account, r result) {
				if r.err != nil || r.job.Status != store.JobPending || r.job.Result != "" {
					t.Errorf("poll = %s %q, %v; want PENDING without a result (the completion was refused)",
						r.job.Status, r.job.Result, r.err)
				}
				wantCharged(t, s, q, 0)
			},
		},
		{
			name: "the same completion retried",
			first: func(s *Store, q store.Account) error {
				_, err := s.CompleteJob(ctx, "job-1", q, completion(q, "job-1", whole(1)),
					finishJob(store.JobCompleted, "d", "the result"))
				return err
			},
			second: func(s *Store, q store.Account) (store.Job, error) {
				return s.CompleteJob(ctx, "job-1", q, completion(q, "job-1", whole(1)),
					finishJob(store.JobCompleted, "d", "the result"))
			},
			check: func(t *testing.T, s *Store, q store.Account, r result) {
				// The retry must not be acknowledged on the strength of the
				// refused record: it is recorded itself, and charged once.
				if r.err != nil || r.job.Status != store.JobCompleted {
					t.Errorf("retry = %s, %v; want it recorded COMPLETED", r.job.Status, r.err)
				}
				wantJob(t, s, store.JobCompleted, "the result")
				wantCharged(t, s, q, 1)
			},
		},
		{
			name: "a different completion",
			first: func(s *Store, q store.Account) error {
				_, err := s.CompleteJob(ctx, "job-1", q, completion(q, "job-1", whole(1)),
					finishJob(store.JobCompleted, "d", "the result"))
				return err
			},
			second: func(s *Store, q store.Account) (store.Job, error) {
				return s.CompleteJob(ctx, "job-1", q, completion(q, "job-1", whole(2)),
					finishJob(store.JobCompleted, "other", "another result"))
			},
			check: func(t *testing.T, s *Store, q store.Account, r result) {
				if r.err != nil || r.job.Status != store.JobCompleted {
					t.Errorf("other completion = %s, %v; want it recorded (nothing else was)", r.job.Status, r.err)
				}
				wantJob(t, s, store.JobCompleted, "another result")
				wantCharged(t, s, q, 2)
			},
		},
		{
			name: "progress during a completion",
			first: func(s *Store, q store.Account) error {
				_, err := s.CompleteJob(ctx, "job-1", q, completion(q, "job-1", whole(1)),
					finishJob(store.JobCompleted, "d", "the result"))
				return err
			},
			second: func(s *Store, _ store.Account) (store.Job, error) {
				return s.UpdateJob(ctx, "job-1", progressJob(40))
			},
			check: func(t *testing.T, s *Store, q store.Account, r result) {
				if r.err != nil || r.job.Status != store.JobRunning || r.job.PercentageComplete != 40 {
					t.Errorf("progress = %s %g%%, %v; want RUNNING 40%%", r.job.Status, r.job.PercentageComplete, r.err)
				}
				wantJob(t, s, store.JobRunning, "")
				wantCharged(t, s, q, 0)
			},
		},
		{
			name: "poll during a progress report",
			first: func(s *Store, _ store.Account) error {
				_, err := s.UpdateJob(ctx, "job-1", progressJob(40))
				return err
			},
			second: func(s *Store, _ store.Account) (store.Job, error) { return s.GetJob(ctx, "job-1") },
			check: func(t *testing.T, s *Store, q store.Account, r result) {
				if r.err != nil || r.job.Status != store.JobPending || r.job.PercentageComplete != 0 {
					t.Errorf("poll = %s %g%%, %v; want PENDING 0%% (the progress was refused)",
						r.job.Status, r.job.PercentageComplete, r.err)
				}
				wantCharged(t, s, q, 0)
			},
		},
		{
			name: "the same failure retried",
			first: func(s *Store, q store.Account) error {
				_, err := s.CompleteJob(ctx, "job-1", q, completion(q, "job-1", 0),
					finishJob(store.JobFailed, "f", "it broke"))
				return err
			},
			second: func(s *Store, q store.Account) (store.Job, error) {
				return s.CompleteJob(ctx, "job-1", q, completion(q, "job-1", 0),
					finishJob(store.JobFailed, "f", "it broke"))
			},
			check: func(t *testing.T, s *Store, q store.Account, r result) {
				if r.err != nil || r.job.Status != store.JobFailed {
					t.Errorf("retry = %s, %v; want it recorded FAILED", r.job.Status, r.err)
				}
				wantJob(t, s, store.JobFailed, "it broke")
				wantCharged(t, s, q, 0)
			},
		},
		{
			name: "a duplicate creation",
			first: func(s *Store, q store.Account) error {
				j := newJob("job-2", t0.Add(time.Hour))
				j.ServiceID, j.ProductID = q.ServiceID, q.Product.ID
				_, err := s.CreateJobReserved(ctx, j, q, whole(1), t0)
				return err
			},
			second: func(s *Store, _ store.Account) (store.Job, error) {
				err := s.CreateJob(ctx, newJob("job-2", t0.Add(time.Hour)))
				return store.Job{}, err
			},
			check: func(t *testing.T, s *Store, _ store.Account, r result) {
				// The first was refused: the id is free, not taken.
				if r.err != nil {
					t.Errorf("CreateJob of the id of a refused creation: %v; want it created", r.err)
				}
				if j, err := s.GetJob(ctx, "job-2"); err != nil || j.ReservationID != "" {
					t.Errorf("GetJob(job-2) = %+v, %v; want the second creation's job", j, err)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := newHoldSyncFS()
			path := storePath(t)
			s, err := OpenWith(path, Options{FS: g})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			q := subscribe(t, s, "u1", "quota", quotaBlock, 0)
			reserveJob(t, s, "job-1", q, whole(1))

			g.armed.Store(true)
			firstDone := make(chan error, 1)
			go func() { firstDone <- tc.first(s, q) }()
			<-g.entered // the first change's record is written, its fdatasync held

			secondDone := make(chan result, 1)
			go func() {
				j, err := tc.second(s, q)
				secondDone <- result{j, err}
			}()
			select {
			case r := <-secondDone:
				close(g.release)
				<-firstDone
				t.Fatalf("answered while the first change was not durable: %s %q, %v", r.job.Status, r.job.Result, r.err)
			case <-time.After(200 * time.Millisecond):
			}
			close(g.release)
			if err := <-firstDone; !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("first change = %v; want its refusal (%v)", err, store.ErrUnavailable)
			}
			var r result
			select {
			case r = <-secondDone:
			case <-time.After(10 * time.Second):
				t.Fatal("still waiting 10 s after the first change was refused")
			}
			tc.check(t, s, q, r)

			// What was answered is what a restart finds.
			want, err := s.GetJob(ctx, "job-1")
			if err != nil {
				t.Fatal(err)
			}
			st := stateOf(t, s, q, t0)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s2 := openAt(t, path)
			got, err := s2.GetJob(ctx, "job-1")
			if err != nil || got.Status != want.Status || got.Result != want.Result ||
				got.PercentageComplete != want.PercentageComplete {
				t.Errorf("after a restart job-1 = %s %q %g%%, %v; before it %s %q %g%%", got.Status, got.Result,
					got.PercentageComplete, err, want.Status, want.Result, want.PercentageComplete)
			}
			if st2 := stateOf(t, s2, q, t0); st2.Used != st.Used || st2.Reserved != st.Reserved {
				t.Errorf("after a restart used %s reserved %s; before it used %s reserved %s",
					st2.Used, st2.Reserved, st.Used, st.Reserved)
			}
		})
	}
}

// wantJob fails the test unless job-1 reads as status with result.
func wantJob(t *testing.T, s *Store, status, result string) {
	t.Helper()
	j, err := s.GetJob(ctx, "job-1")
	if err != nil || j.Status != status || j.Result != result {
		t.Errorf("job-1 = %s %q, %v; want %s %q", j.Status, j.Result, err, status, result)
	}
}

// wantCharged fails the test unless q's usage and the ledger hold exactly
// units (whole units), charged by at most one completion.
func wantCharged(t *testing.T, s *Store, q store.Account, units int64) {
	t.Helper()
	st := stateOf(t, s, q, t0)
	rows := ledger(t, s, store.LedgerFilter{})
	var sum int64
	for _, e := range rows {
		sum += int64(e.Units)
	}
	if st.Used != whole(units) || sum != int64(whole(units)) || len(rows) > 1 {
		t.Errorf("used %s, ledger %d rows of %d units; want %s charged once", st.Used, len(rows), sum, whole(units))
	}
}

// TestExpireJobsWaitsForChangeInFlight: the sweep decides on a job whose
// change is in flight (appended after the sweep applied the log) once that
// change is durable or refused, as the job then stands, and does not
// build its own change on the one in flight.
func TestExpireJobsWaitsForChangeInFlight(t *testing.T) {
	for _, refused := range []bool{false, true} {
		name := map[bool]string{false: "durable", true: "refused"}[refused]
		t.Run(name, func(t *testing.T) {
			s := openAt(t, storePath(t))
			q := subscribe(t, s, "u1", "quota", quotaBlock, 0)
			reserveJob(t, s, "job-1", q, whole(1))
			if err := s.applyAll(); err != nil {
				t.Fatal(err)
			}
			// A completion in flight, as putJob leaves it: the applier
			// leaves it alone (its position is past any it applies).
			s.jobMu.Lock()
			cur, err := s.loadJob("job-1")
			if err != nil {
				s.jobMu.Unlock()
				t.Fatal(err)
			}
			done := cur.job
			if err := finishJob(store.JobCompleted, "d", "the result")(&done); err != nil {
				s.jobMu.Unlock()
				t.Fatal(err)
			}
			m := &memJob{job: done, pos: 1 << 62, durable: make(chan struct{})}
			s.jobs["job-1"] = m
			s.jobMu.Unlock()

			expired := make(chan int, 1)
			go func() {
				n, err := s.ExpireJobs(ctx, t0.Add(2*time.Hour), "expired")
				if err != nil {
					t.Error(err)
				}
				expired <- n
			}()
			select {
			case n := <-expired:
				t.Fatalf("ExpireJobs = %d while a change of the job was in flight", n)
			case <-time.After(200 * time.Millisecond):
			}
			s.jobMu.Lock()
			if refused {
				delete(s.jobs, "job-1") // the job is as the file has it: open
			} else {
				m.job.Status = store.JobRunning // durable: an open job's progress, say
				m.job.CompletionDigest, m.job.Result, m.job.CompletedAt = "", "", time.Time{}
			}
			s.jobMu.Unlock()
			close(m.durable)
			if n := <-expired; n != 1 {
				t.Fatalf("ExpireJobs = %d; want the open job expired", n)
			}
			j, err := s.GetJob(ctx, "job-1")
			if err != nil || j.Status != store.JobFailed || j.ErrorMessage != "expired" {
				t.Fatalf("job-1 = %s %q, %v; want FAILED expired", j.Status, j.ErrorMessage, err)
			}
		})
	}
}
