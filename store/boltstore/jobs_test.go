package boltstore

import (
	"errors"
	"testing"
	"time"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

func newJob(id string, expires time.Time) store.Job {
	return store.Job{ID: id, UserID: "u1", KeyID: "key_1", ServiceID: "svc", EndpointID: "ep", ProductID: quotaAllow.ID,
		Status: store.JobPending, CreatedAt: t0, UpdatedAt: t0, ExpiresAt: expires}
}

func complete(status string, digest string) func(*store.Job) error {
	return func(j *store.Job) error {
		if j.Terminal() {
			if j.CompletionDigest == digest {
				return nil // the same completion again: nothing changes
			}
			return store.ErrConflict
		}
		j.Status, j.CompletionDigest, j.Result = status, digest, "done"
		j.UpdatedAt, j.CompletedAt = t0.Add(time.Minute), t0.Add(time.Minute)
		return nil
	}
}

func TestJobs(t *testing.T) {
	s := openTemp(t)
	j := newJob("job-1", t0.Add(24*time.Hour))
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(ctx, j); !errors.Is(err, store.ErrConflict) {
		t.Errorf("CreateJob(duplicate) = %v, want ErrConflict", err)
	}
	got, err := s.GetJob(ctx, "job-1")
	if err != nil || got.ID != j.ID || got.UserID != "u1" || got.Status != store.JobPending || !got.ExpiresAt.Equal(j.ExpiresAt) ||
		!got.CreatedAt.Equal(t0) || got.KeyID != "key_1" {
		t.Fatalf("GetJob = %+v, %v", got, err)
	}
	if _, err := s.GetJob(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetJob(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.UpdateJob(ctx, "nope", func(*store.Job) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateJob(unknown) = %v, want ErrNotFound", err)
	}

	// Progress.
	got, err = s.UpdateJob(ctx, "job-1", func(j *store.Job) error {
		j.Status, j.Stage, j.PercentageComplete, j.UpdatedAt = store.JobRunning, "thinking", 42.5, t0.Add(time.Second)
		return nil
	})
	if err != nil || got.Status != store.JobRunning || got.Stage != "thinking" || got.PercentageComplete != 42.5 {
		t.Fatalf("UpdateJob = %+v, %v", got, err)
	}
	if got, _ := s.GetJob(ctx, "job-1"); got.Stage != "thinking" || got.PercentageComplete != 42.5 {
		t.Errorf("progress not stored: %+v", got)
	}
	// fn's error is returned as is and nothing is stored.
	boom := errors.New("boom")
	if _, err := s.UpdateJob(ctx, "job-1", func(j *store.Job) error {
		j.Stage = "lost"
		return boom
	}); err != boom {
		t.Errorf("UpdateJob with a failing fn = %v, want boom itself", err)
	}
	if got, _ := s.GetJob(ctx, "job-1"); got.Stage != "thinking" {
		t.Errorf("a failed update was stored: %+v", got)
	}
}

// TestCompleteJobChargesOnce: a completion's units are charged with the
// state change, once, however often the completion arrives.
func TestCompleteJobChargesOnce(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", quotaAllow, 0)
	if err := s.CreateJob(ctx, newJob("job-1", t0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	e := store.LedgerEntry{Time: t0.Add(time.Minute), UserID: "u1", ServiceID: "svc", ProductID: quotaAllow.ID,
		RequestID: "job-1", Units: whole(12), Source: store.SourceCompletion}
	j, err := s.CompleteJob(ctx, "job-1", a, e, complete(store.JobCompleted, "digest-1"))
	if err != nil || j.Status != store.JobCompleted || j.Units != whole(12) || j.Cost != whole(1) {
		t.Fatalf("CompleteJob = %+v, %v; want 12 units costing 1", j, err)
	}
	stored, err := s.GetJob(ctx, "job-1")
	if err != nil || stored.Units != whole(12) || stored.Cost != whole(1) || stored.Result != "done" || !stored.CompletedAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("stored job %+v, %v", stored, err)
	}
	if stored.CompletionDigest != "digest-1" {
		t.Errorf("CompletionDigest %q not kept: a repeated completion cannot be recognised", stored.CompletionDigest)
	}

	// The same completion again: fn leaves it terminal, nothing charged.
	if j, err := s.CompleteJob(ctx, "job-1", a, e, complete(store.JobCompleted, "digest-1")); err != nil || j.Units != whole(12) {
		t.Errorf("repeated CompleteJob = %+v, %v", j, err)
	}
	// A different completion: fn refuses.
	if _, err := s.CompleteJob(ctx, "job-1", a, e, complete(store.JobFailed, "digest-2")); !errors.Is(err, store.ErrConflict) {
		t.Errorf("different CompleteJob = %v, want ErrConflict", err)
	}
	// A careless fn that rewrites a terminal job still charges nothing.
	if _, err := s.CompleteJob(ctx, "job-1", a, e, func(j *store.Job) error { j.Status = store.JobCompleted; return nil }); err != nil {
		t.Fatal(err)
	}
	entries := ledger(t, s, store.LedgerFilter{})
	if st := stateOf(t, s, a, t0); len(entries) != 1 || st.Used != whole(12) || st.Spend != whole(1) {
		t.Errorf("after repeated completions: %d entries, state %+v; want one charge of 12", len(entries), st)
	}
	if entries[0].Source != store.SourceCompletion || entries[0].RequestID != "job-1" || entries[0].Overage != whole(2) {
		t.Errorf("entry %+v", entries[0])
	}

	// A completion whose fn fails charges nothing and changes nothing.
	if err := s.CreateJob(ctx, newJob("job-2", t0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if _, err := s.CompleteJob(ctx, "job-2", a, e, func(j *store.Job) error { j.Status = store.JobCompleted; return boom }); err != boom {
		t.Errorf("CompleteJob with failing fn = %v", err)
	}
	// A completion without units, or a progress update, charges nothing.
	if _, err := s.CompleteJob(ctx, "job-2", a, store.LedgerEntry{Time: t0}, complete(store.JobFailed, "d")); err != nil {
		t.Fatal(err)
	}
	if n := len(ledger(t, s, store.LedgerFilter{})); n != 1 {
		t.Errorf("%d ledger entries, want 1", n)
	}
	// Completing an unknown job fails and charges nothing.
	if _, err := s.CompleteJob(ctx, "nope", a, e, complete(store.JobCompleted, "d")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CompleteJob(unknown) = %v", err)
	}

	// A free (owner) job records its units with no product.
	if err := s.CreateJob(ctx, newJob("job-3", t0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	free := store.Account{UserID: "u1", ServiceID: "svc", Free: true}
	if j, err := s.CompleteJob(ctx, "job-3", free, e, complete(store.JobCompleted, "d")); err != nil || j.Units != whole(12) || j.Cost != 0 {
		t.Errorf("free CompleteJob = %+v, %v", j, err)
	}
	if st := stateOf(t, s, a, t0); st.Used != whole(12) {
		t.Errorf("a free completion was counted: %+v", st)
	}
}

// TestCompleteJobWithoutSubscription: units are charged in the same
// transaction, so when they cannot be the job does not complete either.
func TestCompleteJobWithoutSubscription(t *testing.T) {
	s := openTemp(t)
	if err := s.CreateJob(ctx, newJob("job-1", t0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	a := store.Account{UserID: "u1", ServiceID: "svc", Product: quotaAllow}
	if _, err := s.CompleteJob(ctx, "job-1", a, entryFor(a, whole(1), t0), complete(store.JobCompleted, "d")); !errors.Is(err, store.ErrNoAccount) {
		t.Errorf("CompleteJob = %v, want ErrNoAccount", err)
	}
	if j, _ := s.GetJob(ctx, "job-1"); j.Terminal() {
		t.Errorf("job completed though its units were not charged: %+v", j)
	}
}

func TestExpireJobs(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", quotaAllow, 0)
	now := t0.Add(2 * time.Hour)
	jobs := []store.Job{
		newJob("past", now.Add(-time.Minute)),
		newJob("running-past", now.Add(-time.Second)),
		newJob("at-now", now), // not before now: still open
		newJob("future", now.Add(time.Hour)),
		newJob("done-past", now.Add(-time.Hour)),
		newJob("extended", t0.Add(time.Hour)),
	}
	for _, j := range jobs {
		if err := s.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.UpdateJob(ctx, "running-past", func(j *store.Job) error { j.Status = store.JobRunning; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompleteJob(ctx, "done-past", a, entryFor(a, whole(1), t0), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	// Moving a deadline moves it in the expiry index.
	if _, err := s.UpdateJob(ctx, "extended", func(j *store.Job) error { j.ExpiresAt = now.Add(time.Hour); return nil }); err != nil {
		t.Fatal(err)
	}
	// A terminal job created as such is never expired.
	done := newJob("created-done", now.Add(-time.Hour))
	done.Status = store.JobFailed
	if err := s.CreateJob(ctx, done); err != nil {
		t.Fatal(err)
	}

	n, err := s.ExpireJobs(ctx, now, "job expired after 24h")
	if err != nil || n != 2 {
		t.Fatalf("ExpireJobs = %d, %v; want 2", n, err)
	}
	want := map[string]string{
		"past": store.JobFailed, "running-past": store.JobFailed, "at-now": store.JobPending, "future": store.JobPending,
		"done-past": store.JobCompleted, "extended": store.JobPending, "created-done": store.JobFailed,
	}
	for id, status := range want {
		j, err := s.GetJob(ctx, id)
		if err != nil || j.Status != status {
			t.Errorf("%s: %+v, %v; want %s", id, j.Status, err, status)
			continue
		}
		expired := id == "past" || id == "running-past"
		if expired && (j.ErrorMessage != "job expired after 24h" || !j.CompletedAt.Equal(now) || !j.UpdatedAt.Equal(now)) {
			t.Errorf("%s expired as %+v", id, j)
		}
		if !expired && j.ErrorMessage != "" {
			t.Errorf("%s got an error message: %+v", id, j)
		}
	}
	if n, err := s.ExpireJobs(ctx, now, "again"); err != nil || n != 0 {
		t.Errorf("second ExpireJobs = %d, %v; want 0", n, err)
	}
	// An expired job's late completion charges nothing.
	if _, err := s.CompleteJob(ctx, "past", a, entryFor(a, whole(5), now), complete(store.JobCompleted, "late")); !errors.Is(err, store.ErrConflict) {
		t.Errorf("late completion = %v, want the fn's refusal", err)
	}
	if st := stateOf(t, s, a, t0); st.Used != whole(1) {
		t.Errorf("state %+v, want only done-past's unit", st)
	}
	// Later, the rest expire.
	if n, err := s.ExpireJobs(ctx, now.Add(2*time.Hour), "expired"); err != nil || n != 3 {
		t.Errorf("ExpireJobs later = %d, %v; want 3 (at-now, future, extended)", n, err)
	}
}

// TestCompleteJobNegativeUnits: a negative completion is refused whole.
func TestCompleteJobNegativeUnits(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", quotaAllow, 0)
	if err := s.CreateJob(ctx, newJob("job-1", t0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompleteJob(ctx, "job-1", a, entryFor(a, -whole(1), t0), complete(store.JobCompleted, "d")); !errors.Is(err, billing.ErrInvalidUnits) {
		t.Errorf("CompleteJob(-1) = %v, want ErrInvalidUnits", err)
	}
	if j, _ := s.GetJob(ctx, "job-1"); j.Terminal() {
		t.Errorf("job completed: %+v", j)
	}
}
