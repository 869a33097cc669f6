package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

func newJob(id string, expires time.Time) store.Job {
	return store.Job{ID: id, UserID: "u1", KeyID: "key_1", ServiceID: "svc", EndpointID: "ep", ProductID: quotaAllow.ID,
		Status: store.JobPending, CreatedAt: T0, UpdatedAt: T0, ExpiresAt: expires}
}

// errOtherCompletion is how complete refuses a job that finished with
// another completion (the store returns fn's error as is).
var errOtherCompletion = errors.New("the job finished with another completion")

func complete(status string, digest string) func(*store.Job) error {
	return func(j *store.Job) error {
		if j.Terminal() {
			if j.CompletionDigest == digest {
				return nil // the same completion again: nothing changes
			}
			return errOtherCompletion
		}
		j.Status, j.CompletionDigest, j.Result = status, digest, "done"
		j.UpdatedAt, j.CompletedAt = T0.Add(time.Minute), T0.Add(time.Minute)
		return nil
	}
}

func testJobs(t *testing.T, c *suite) {
	s := c.store(t)
	j := newJob("job-1", T0.Add(24*time.Hour))
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(ctx, j); !errors.Is(err, store.ErrExists) {
		t.Errorf("CreateJob(duplicate) = %v, want ErrExists", err)
	}
	got, err := s.GetJob(ctx, "job-1")
	if err != nil || got.ID != j.ID || got.UserID != "u1" || got.Status != store.JobPending || !got.ExpiresAt.Equal(j.ExpiresAt) ||
		!got.CreatedAt.Equal(T0) || got.KeyID != "key_1" {
		t.Fatalf("GetJob = %+v, %v", got, err)
	}
	if _, err := s.GetJob(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetJob(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.UpdateJob(ctx, "nope", func(*store.Job) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateJob(unknown) = %v, want ErrNotFound", err)
	}
	// Ids from request paths may be any bytes: one that is not UTF-8 or
	// holds NUL names no job, on every store (PostgreSQL text refuses it).
	for _, id := range []string{"a\xffb", "a\x00b"} {
		if _, err := s.GetJob(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetJob(%q) = %v, want ErrNotFound", id, err)
		}
		if _, err := s.UpdateJob(ctx, id, func(*store.Job) error { return nil }); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("UpdateJob(%q) = %v, want ErrNotFound", id, err)
		}
	}

	// Progress.
	got, err = s.UpdateJob(ctx, "job-1", func(j *store.Job) error {
		j.Status, j.Stage, j.PercentageComplete, j.UpdatedAt = store.JobRunning, "thinking", 42.5, T0.Add(time.Second)
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

// testCompleteJobChargesOnce: a completion's units are charged with the
// state change, once, however often the completion arrives.
func testCompleteJobChargesOnce(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", quotaAllow, 0)
	if err := s.CreateJob(ctx, newJob("job-1", T0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	e := store.LedgerEntry{Time: T0.Add(time.Minute), UserID: "u1", ServiceID: "svc", ProductID: quotaAllow.ID,
		RequestID: "job-1", Units: whole(12), Source: store.SourceCompletion}
	j, err := s.CompleteJob(ctx, "job-1", a, e, complete(store.JobCompleted, "digest-1"))
	if err != nil || j.Status != store.JobCompleted || j.Units != whole(12) || j.Cost != whole(1) {
		t.Fatalf("CompleteJob = %+v, %v; want 12 units costing 1", j, err)
	}
	stored, err := s.GetJob(ctx, "job-1")
	if err != nil || stored.Units != whole(12) || stored.Cost != whole(1) || stored.Result != "done" || !stored.CompletedAt.Equal(T0.Add(time.Minute)) {
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
	if _, err := s.CompleteJob(ctx, "job-1", a, e, complete(store.JobFailed, "digest-2")); !errors.Is(err, errOtherCompletion) {
		t.Errorf("different CompleteJob = %v, want the fn's refusal", err)
	}
	// A careless fn that rewrites a terminal job still charges nothing.
	if _, err := s.CompleteJob(ctx, "job-1", a, e, func(j *store.Job) error { j.Status = store.JobCompleted; return nil }); err != nil {
		t.Fatal(err)
	}
	entries := Ledger(t, s, store.LedgerFilter{})
	if st := c.state(t, s, a, T0); len(entries) != 1 || st.Used != whole(12) || st.Spend != whole(1) {
		t.Errorf("after repeated completions: %d entries, state %+v; want one charge of 12", len(entries), st)
	}
	if entries[0].Source != store.SourceCompletion || entries[0].RequestID != "job-1" || entries[0].Overage != whole(2) {
		t.Errorf("entry %+v", entries[0])
	}

	// A completion whose fn fails charges nothing and changes nothing.
	if err := s.CreateJob(ctx, newJob("job-2", T0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if _, err := s.CompleteJob(ctx, "job-2", a, e, func(j *store.Job) error { j.Status = store.JobCompleted; return boom }); err != boom {
		t.Errorf("CompleteJob with failing fn = %v", err)
	}
	// A completion without units, or a progress update, charges nothing.
	if _, err := s.CompleteJob(ctx, "job-2", a, store.LedgerEntry{Time: T0}, complete(store.JobFailed, "d")); err != nil {
		t.Fatal(err)
	}
	if n := len(Ledger(t, s, store.LedgerFilter{})); n != 1 {
		t.Errorf("%d ledger entries, want 1", n)
	}
	// Completing an unknown job fails and charges nothing.
	if _, err := s.CompleteJob(ctx, "nope", a, e, complete(store.JobCompleted, "d")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CompleteJob(unknown) = %v", err)
	}

	// A free (owner) job records its units with no product.
	if err := s.CreateJob(ctx, newJob("job-3", T0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	free := store.Account{UserID: "u1", ServiceID: "svc", Free: true}
	if j, err := s.CompleteJob(ctx, "job-3", free, e, complete(store.JobCompleted, "d")); err != nil || j.Units != whole(12) || j.Cost != 0 {
		t.Errorf("free CompleteJob = %+v, %v", j, err)
	}
	if st := c.state(t, s, a, T0); st.Used != whole(12) {
		t.Errorf("a free completion was counted: %+v", st)
	}
}

// testCompleteJobWithoutSubscription: units are charged in the same
// transaction, so when they cannot be the job does not complete either.
func testCompleteJobWithoutSubscription(t *testing.T, c *suite) {
	s := c.store(t)
	if err := s.CreateJob(ctx, newJob("job-1", T0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	a := store.Account{UserID: "u1", ServiceID: "svc", Product: quotaAllow}
	if _, err := s.CompleteJob(ctx, "job-1", a, EntryFor(a, whole(1), T0), complete(store.JobCompleted, "d")); !errors.Is(err, store.ErrNoAccount) {
		t.Errorf("CompleteJob = %v, want ErrNoAccount", err)
	}
	if j, _ := s.GetJob(ctx, "job-1"); j.Terminal() {
		t.Errorf("job completed though its units were not charged: %+v", j)
	}
}

func testExpireJobs(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", quotaAllow, 0)
	now := T0.Add(2 * time.Hour)
	jobs := []store.Job{
		newJob("past", now.Add(-time.Minute)),
		newJob("running-past", now.Add(-time.Second)),
		newJob("at-now", now), // the deadline itself is expired (store.Job.Expired)
		newJob("future", now.Add(time.Hour)),
		newJob("done-past", now.Add(-time.Hour)),
		newJob("extended", T0.Add(time.Hour)),
	}
	for _, j := range jobs {
		if err := s.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.UpdateJob(ctx, "running-past", func(j *store.Job) error { j.Status = store.JobRunning; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompleteJob(ctx, "done-past", a, EntryFor(a, whole(1), T0), complete(store.JobCompleted, "d")); err != nil {
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
	if err != nil || n != 3 {
		t.Fatalf("ExpireJobs = %d, %v; want 3", n, err)
	}
	want := map[string]string{
		"past": store.JobFailed, "running-past": store.JobFailed, "at-now": store.JobFailed, "future": store.JobPending,
		"done-past": store.JobCompleted, "extended": store.JobPending, "created-done": store.JobFailed,
	}
	for id, status := range want {
		j, err := s.GetJob(ctx, id)
		if err != nil || j.Status != status {
			t.Errorf("%s: %+v, %v; want %s", id, j.Status, err, status)
			continue
		}
		expired := id == "past" || id == "running-past" || id == "at-now"
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
	if _, err := s.CompleteJob(ctx, "past", a, EntryFor(a, whole(5), now), complete(store.JobCompleted, "late")); !errors.Is(err, errOtherCompletion) {
		t.Errorf("late completion = %v, want the fn's refusal", err)
	}
	if st := c.state(t, s, a, T0); st.Used != whole(1) {
		t.Errorf("state %+v, want only done-past's unit", st)
	}
	// Later, the rest expire.
	if n, err := s.ExpireJobs(ctx, now.Add(2*time.Hour), "expired"); err != nil || n != 2 {
		t.Errorf("ExpireJobs later = %d, %v; want 2 (future, extended)", n, err)
	}
}

// testExpireJobsBoundary pins the one expiry rule (store.Job.Expired: a job
// is expired from its deadline on) at the nanosecond: a job due just
// before now and one due at now are failed, one due just after is not, and
// the sweep agrees with Expired on every job. With a restart the jobs are
// swept from what the store reloaded, not from what it held in memory.
func testExpireJobsBoundary(t *testing.T, c *suite) {
	now := T0.Add(2 * time.Hour)
	check := func(t *testing.T, s store.Store, prefix string) {
		t.Helper()
		n, err := s.ExpireJobs(ctx, now, "expired")
		if err != nil || n != 2 {
			t.Errorf("%sExpireJobs(now) = %d, %v; want 2 (before, at)", prefix, n, err)
		}
		for id, want := range map[string]string{"before": store.JobFailed, "at": store.JobFailed, "after": store.JobPending} {
			j, err := s.GetJob(ctx, prefix+id)
			if err != nil || j.Status != want {
				t.Errorf("%s%s: %s, %v; want %s", prefix, id, j.Status, err, want)
				continue
			}
			// Expired says the same of the stored job as the sweep did.
			if j.Expired(now) != (want == store.JobFailed) {
				t.Errorf("%s%s: Expired(now) = %v with deadline %v, the sweep left it %s", prefix, id, j.Expired(now), j.ExpiresAt, j.Status)
			}
		}
		// One nanosecond on, the last one is due.
		if n, err := s.ExpireJobs(ctx, now.Add(time.Nanosecond), "expired"); err != nil || n != 1 {
			t.Errorf("%sExpireJobs(now+1ns) = %d, %v; want 1 (after)", prefix, n, err)
		}
		if j, err := s.GetJob(ctx, prefix+"after"); err != nil || j.Status != store.JobFailed {
			t.Errorf("%safter at now+1ns: %s, %v; want FAILED", prefix, j.Status, err)
		}
	}
	create := func(t *testing.T, s store.Store, prefix string) {
		t.Helper()
		for id, d := range map[string]time.Duration{"before": -time.Nanosecond, "at": 0, "after": time.Nanosecond} {
			if err := s.CreateJob(ctx, newJob(prefix+id, now.Add(d))); err != nil {
				t.Fatal(err)
			}
		}
	}
	s := c.store(t)
	create(t, s, "mem-")
	check(t, s, "mem-")
	if c.reopen == nil {
		return
	}
	create(t, s, "reloaded-")
	s = c.restart(t, s)
	check(t, s, "reloaded-")
}

// reserveJob creates job id holding units for a, and fails the test unless
// the hold was taken.
// reserveJob creates an open job holding units for a, with its terms, as
// the gateway does: charged under a's product whatever the completion
// is handed.
func reserveJob(t testing.TB, s store.Store, id string, a store.Account, units billing.Units) store.Reservation {
	t.Helper()
	j := newJob(id, T0.Add(time.Hour))
	j.Terms = &store.JobTerms{EndpointCost: whole(1)}
	return createReserved(t, s, j, a, units)
}

// reserveLegacyJob creates an open job holding units for a without terms,
// as a version before they were kept stored it.
func reserveLegacyJob(t testing.TB, s store.Store, id string, a store.Account, units billing.Units) store.Reservation {
	t.Helper()
	return createReserved(t, s, newJob(id, T0.Add(time.Hour)), a, units)
}

func createReserved(t testing.TB, s store.Store, j store.Job, a store.Account, units billing.Units) store.Reservation {
	t.Helper()
	id := j.ID
	j.ServiceID, j.ProductID = a.ServiceID, a.Product.ID
	res, err := s.CreateJobReserved(ctx, j, a, units, T0)
	dec := res.Decision
	if err != nil || !dec.Allowed || res.ID == "" || res.JobID != id {
		t.Fatalf("CreateJobReserved(%s, %s) = %+v, %+v, %v", id, units, res, dec, err)
	}
	return res
}

func completion(a store.Account, id string, units billing.Units) store.LedgerEntry {
	return store.LedgerEntry{Time: T0.Add(time.Minute), UserID: a.UserID, ServiceID: a.ServiceID, ProductID: a.Product.ID,
		RequestID: id, Units: units, Source: store.SourceCompletion}
}

// testCreateJobReserved: the hold and the job are written together, and a
// refusal writes neither.
func testCreateJobReserved(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0)
	res := reserveJob(t, s, "job-1", a, whole(7))
	j, err := s.GetJob(ctx, "job-1")
	if err != nil || j.ReservationID != res.ID || j.Status != store.JobPending {
		t.Fatalf("GetJob = %+v, %v; want the job naming hold %s", j, err, res.ID)
	}
	if st := c.state(t, s, a, T0); st.Reserved != whole(7) || st.Used != 0 {
		t.Errorf("state %+v, want 7 held", st)
	}

	// Over the quota: no job, no hold, nothing else written.
	before := c.state(t, s, a, T0)
	j2 := newJob("job-2", T0.Add(time.Hour))
	res2, err := s.CreateJobReserved(ctx, j2, a, whole(4), T0)
	dec, st := res2.Decision, res2.State
	if err != nil || dec.Allowed || dec.Code != billing.CodeQuotaExceeded || res2.ID != "" || st != before {
		t.Fatalf("CreateJobReserved over quota = %+v, %+v, %+v, %v", res2, dec, st, err)
	}
	if _, err := s.GetJob(ctx, "job-2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused job was stored: %v", err)
	}
	if got := c.state(t, s, a, T0); got != before {
		t.Errorf("a refusal wrote: state %+v", got)
	}
	// An id already taken is ErrExists and holds nothing.
	if _, err := s.CreateJobReserved(ctx, newJob("job-1", T0.Add(time.Hour)), a, whole(1), T0); !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate id = %v, want ErrExists", err)
	}
	if got := c.state(t, s, a, T0); got != before {
		t.Errorf("a duplicate id held units: %+v", got)
	}
	// No subscription: nothing written.
	stranger := store.Account{UserID: "u2", ServiceID: "svc", Product: quotaBlock}
	if _, err := s.CreateJobReserved(ctx, newJob("job-3", T0.Add(time.Hour)), stranger, whole(1), T0); !errors.Is(err, store.ErrNoAccount) {
		t.Errorf("no subscription = %v, want ErrNoAccount", err)
	}
	if _, err := s.GetJob(ctx, "job-3"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a job without a subscription was stored: %v", err)
	}
	// A new job must be open.
	done := newJob("job-4", T0.Add(time.Hour))
	done.Status = store.JobCompleted
	if _, err := s.CreateJobReserved(ctx, done, a, whole(1), T0); err == nil {
		t.Error("a terminal job took a hold")
	}

	// An owner's job holds nothing, whatever the quota.
	free := store.Account{UserID: "owner", ServiceID: "svc", Free: true}
	fj := newJob("owner-job", T0.Add(time.Hour))
	fj.UserID, fj.Free, fj.ProductID = "owner", true, ""
	res, err = s.CreateJobReserved(ctx, fj, free, whole(1000), T0)
	dec = res.Decision
	if err != nil || !dec.Allowed || res.ID != "" {
		t.Fatalf("owner's CreateJobReserved = %+v, %+v, %v", res, dec, err)
	}
	if j, err := s.GetJob(ctx, "owner-job"); err != nil || j.ReservationID != "" {
		t.Errorf("owner's job %+v, %v", j, err)
	}
	if st := c.state(t, s, a, T0); st != before {
		t.Errorf("an owner's job held units of another account: %+v", st)
	}
	if _, err := s.CompleteJob(ctx, "owner-job", free, completion(free, "owner-job", whole(1000)), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	es := Ledger(t, s, store.LedgerFilter{UserID: "owner"})
	if len(es) != 1 || es[0].Units != whole(1000) || es[0].ProductID != "" || es[0].Cost != 0 {
		t.Errorf("owner's completion recorded as %+v", es)
	}

	// The hold of a job never settles as a sync call's.
	if _, err := s.Settle(ctx, reserveJob(t, s, "job-5", a, whole(1)), whole(1), EntryFor(a, 0, T0)); !errors.Is(err, store.ErrJobHold) {
		t.Errorf("Settle of a job's hold = %v, want ErrJobHold", err)
	}
	if st := c.state(t, s, a, T0); st.Reserved != whole(8) || st.Used != 0 {
		t.Errorf("after a refused Settle: %+v, want 8 held", st)
	}
}

// testCompleteJobSettlesHold: a completion's units replace the hold, as a
// sync call's settlement does, and never cross a hard limit.
func testCompleteJobSettlesHold(t *testing.T, c *suite) {
	tests := []struct {
		name       string
		p          billing.Product
		credits    billing.Units
		others     billing.Units // held by another job meanwhile
		reserve    billing.Units
		complete   billing.Units
		charged    billing.Units
		claimed    billing.Units
		used, cost billing.Units
	}{
		{"fewer than reserved", quotaBlock, 0, 0, whole(4), whole(2), whole(2), 0, whole(2), 0},
		{"as many as reserved", quotaBlock, 0, 0, whole(4), whole(4), whole(4), 0, whole(4), 0},
		{"more than reserved, within the quota", quotaBlock, 0, 0, whole(4), whole(9), whole(9), 0, whole(9), 0},
		{"past the quota", quotaBlock, 0, 0, whole(4), whole(12), whole(10), whole(12), whole(10), 0},
		{"past the quota with another job held", quotaBlock, 0, whole(3), whole(4), whole(12), whole(7), whole(12), whole(7), 0},
		{"past the balance", prepaidWhole, whole(5), 0, whole(2), whole(20), whole(5), whole(20), whole(5), whole(5)},
		// 10 included, then 0.5 each up to a cap of 10: 30 in all.
		{"past the spending cap", quotaAllow, 0, 0, whole(4), whole(40), whole(30), whole(40), whole(30), whole(10)},
		{"nothing stated", quotaBlock, 0, 0, whole(4), 0, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := c.store(t)
			a := subscribe(t, s, "u1", "svc", tt.p, tt.credits)
			if tt.others > 0 {
				reserveJob(t, s, "other", a, tt.others)
			}
			reserveJob(t, s, "job", a, tt.reserve)
			j, err := s.CompleteJob(ctx, "job", a, completion(a, "job", tt.complete), complete(store.JobCompleted, "d"))
			if err != nil || j.Status != store.JobCompleted || j.Units != tt.charged || j.Cost != tt.cost {
				t.Fatalf("CompleteJob = %+v, %v; want %s charged costing %s", j, err, tt.charged, tt.cost)
			}
			st := c.state(t, s, a, T0)
			if st.Used != tt.used || st.Reserved != tt.others || st.CreditsHeld != 0 {
				t.Errorf("state %+v, want %s used and %s held", st, tt.used, tt.others)
			}
			es := Ledger(t, s, store.LedgerFilter{})
			if tt.complete == 0 {
				if len(es) != 0 {
					t.Errorf("a completion without units wrote %+v", es)
				}
				return
			}
			if len(es) != 1 || es[0].Units != tt.charged || es[0].UnitsClaimed != tt.claimed || es[0].Cost != tt.cost ||
				es[0].Source != store.SourceCompletion || es[0].RequestID != "job" {
				t.Errorf("ledger %+v, want %s charged of %s claimed", es, tt.charged, tt.claimed)
			}
			// The hold is gone with the job: the same completion again, or
			// any other end, settles nothing more.
			for _, again := range []func() error{
				func() error {
					_, err := s.CompleteJob(ctx, "job", a, completion(a, "job", tt.complete), func(j *store.Job) error { return nil })
					return err
				},
				func() error {
					_, err := s.UpdateJob(ctx, "job", func(j *store.Job) error { j.Status = store.JobFailed; return nil })
					return err
				},
				func() error { _, err := s.ExpireJobs(ctx, T0.Add(48*time.Hour), "expired"); return err },
			} {
				if err := again(); err != nil {
					t.Fatal(err)
				}
			}
			want := st
			want.Reserved = 0 // the other job expired meanwhile
			if got := c.state(t, s, a, T0); got != want {
				t.Errorf("repeated ends: state %+v, want %+v", got, want)
			}
			if n := len(Ledger(t, s, store.LedgerFilter{})); n != 1 {
				t.Errorf("%d ledger entries after repeated ends", n)
			}
		})
	}
}

// testJobEndsReleaseHold: every end but a completion with units gives the
// hold back and charges nothing, exactly once.
func testJobEndsReleaseHold(t *testing.T, c *suite) {
	ends := []struct {
		name string
		end  func(s store.Store, a store.Account) error
	}{
		{"FAILED completion with units", func(s store.Store, a store.Account) error {
			_, err := s.CompleteJob(ctx, "job", a, completion(a, "job", whole(5)), complete(store.JobFailed, "d"))
			return err
		}},
		{"COMPLETED without units", func(s store.Store, a store.Account) error {
			_, err := s.CompleteJob(ctx, "job", a, completion(a, "job", 0), complete(store.JobCompleted, "d"))
			return err
		}},
		{"backend refused the envelope", func(s store.Store, a store.Account) error {
			_, err := s.UpdateJob(ctx, "job", func(j *store.Job) error {
				j.Status, j.ErrorMessage = store.JobFailed, "the service backend refused the job (HTTP 500)"
				return nil
			})
			return err
		}},
		{"expired", func(s store.Store, a store.Account) error {
			n, err := s.ExpireJobs(ctx, T0.Add(2*time.Hour), "expired")
			if err == nil && n != 1 {
				err = fmt.Errorf("ExpireJobs expired %d jobs, want 1", n)
			}
			return err
		}},
	}
	for _, p := range []billing.Product{quotaBlock, prepaid} {
		for _, tt := range ends {
			t.Run(p.ID+"/"+tt.name, func(t *testing.T) {
				s := c.store(t)
				a := subscribe(t, s, "u1", "svc", p, whole(2))
				before := c.state(t, s, a, T0)
				reserveJob(t, s, "job", a, whole(6))
				if st := c.state(t, s, a, T0); st == before {
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
				if st := c.state(t, s, a, T0); st != before {
					t.Errorf("state %+v, want %+v as before the job", st, before)
				}
				// Every other end afterwards changes nothing: the hold was
				// given back once.
				for _, other := range ends {
					other.end(s, a)
				}
				if st := c.state(t, s, a, T0); st != before {
					t.Errorf("after repeated ends: %+v, want %+v", st, before)
				}
				if n := len(Ledger(t, s, store.LedgerFilter{})); n != 0 {
					t.Errorf("%d ledger entries", n)
				}
			})
		}
	}
}

// testCompleteJobNegativeUnits: a negative completion is refused whole.
func testCompleteJobNegativeUnits(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", quotaAllow, 0)
	if err := s.CreateJob(ctx, newJob("job-1", T0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompleteJob(ctx, "job-1", a, EntryFor(a, -whole(1), T0), complete(store.JobCompleted, "d")); !errors.Is(err, billing.ErrInvalidUnits) {
		t.Errorf("CompleteJob(-1) = %v, want ErrInvalidUnits", err)
	}
	if j, _ := s.GetJob(ctx, "job-1"); j.Terminal() {
		t.Errorf("job completed: %+v", j)
	}
}

// testJobHoldProductChanged: a job is charged under the product it was
// accepted (and held) under, whatever account its completion is handed: a
// plan change or a reload that reprices the product, or one that removes
// it (the gateway then has no product to hand but a free account), changes
// nothing. The hold is given back exactly.
func testJobHoldProductChanged(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", prepaid, whole(10)) // 0.25 a unit
	reserveJob(t, s, "job-1", a, whole(8))                // 2 credits held
	now := store.Account{UserID: "u1", ServiceID: "svc", Product: quotaBlock}
	j, err := s.CompleteJob(ctx, "job-1", now, completion(now, "job-1", whole(3)), complete(store.JobCompleted, "d"))
	if err != nil || j.Units != whole(3) || j.Cost != 750_000 {
		t.Fatalf("CompleteJob(another product) = %+v, %v; want 3 units costing 0.75 under the job's product", j, err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.CreditsHeld != 0 || sub.Credits != 9_250_000 {
		t.Errorf("credits %s held %s, want 9.25 and nothing held", sub.Credits, sub.CreditsHeld)
	}
	if st := c.state(t, s, a, T0); st.Used != whole(3) || st.Reserved != 0 {
		t.Errorf("state %+v", st)
	}

	reserveJob(t, s, "job-2", a, whole(4)) // 1 credit held
	free := store.Account{UserID: "u1", ServiceID: "svc", Free: true}
	j, err = s.CompleteJob(ctx, "job-2", free, completion(free, "job-2", whole(5)), complete(store.JobCompleted, "d"))
	if err != nil || j.Units != whole(5) || j.Cost != 1_250_000 {
		t.Fatalf("CompleteJob(product gone) = %+v, %v; want 5 units costing 1.25", j, err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.CreditsHeld != 0 || sub.Credits != whole(8) {
		t.Errorf("credits %s held %s, want 8 and nothing held", sub.Credits, sub.CreditsHeld)
	}
	es := Ledger(t, s, store.LedgerFilter{})
	if len(es) != 2 || es[0].ProductID != prepaid.ID || es[0].Cost != 750_000 || es[1].ProductID != prepaid.ID || es[1].Cost != 1_250_000 {
		t.Errorf("ledger %+v, want both under %s", es, prepaid.ID)
	}
}

// testJobWithoutTermsCharged: a job stored without terms (by a version
// before they were kept) is charged with the account its completion is
// handed, as that version did: priced by the product given, recorded free
// when given a free account. Its hold is given back exactly.
func testJobWithoutTermsCharged(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", prepaid, whole(10))
	reserveLegacyJob(t, s, "job-1", a, whole(8)) // 2 credits held
	if j, _ := s.GetJob(ctx, "job-1"); j.Terms != nil {
		t.Fatalf("a job created without terms has %+v", j.Terms)
	}
	now := store.Account{UserID: "u1", ServiceID: "svc", Product: quotaBlock}
	if _, err := s.CompleteJob(ctx, "job-1", now, completion(now, "job-1", whole(3)), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.CreditsHeld != 0 || sub.Credits != whole(10) {
		t.Errorf("prepaid hold not given back: %+v", sub)
	}
	if st := c.state(t, s, now, T0); st.Used != whole(3) || st.Reserved != 0 {
		t.Errorf("state %+v", st)
	}

	reserveLegacyJob(t, s, "job-2", a, whole(4))
	free := store.Account{UserID: "u1", ServiceID: "svc", Free: true}
	j, err := s.CompleteJob(ctx, "job-2", free, completion(free, "job-2", whole(5)), complete(store.JobCompleted, "d"))
	if err != nil || j.Units != whole(5) || j.Cost != 0 {
		t.Fatalf("CompleteJob(free) = %+v, %v", j, err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.CreditsHeld != 0 || sub.Credits != whole(10) {
		t.Errorf("hold of a job completed free not given back: %+v", sub)
	}
	if es := Ledger(t, s, store.LedgerFilter{}); len(es) != 2 || es[1].ProductID != "" || es[1].Units != whole(5) {
		t.Errorf("ledger %+v", es)
	}
}

// testJobTermsPriceChanged: a job is charged the price in force when it
// was accepted, not the one its completion is handed (a reload raised it a
// thousandfold meanwhile).
func testJobTermsPriceChanged(t *testing.T, c *suite) {
	s := c.store(t)
	tok := billing.Product{ID: "tok", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken, Price: 1_000} // 0.001
	a := subscribe(t, s, "u1", "svc", tok, 0)
	reserveJob(t, s, "job", a, whole(1))
	repriced := a
	repriced.Product.Price = whole(1)
	j, err := s.CompleteJob(ctx, "job", repriced, completion(repriced, "job", whole(10)), complete(store.JobCompleted, "d"))
	if err != nil || j.Units != whole(10) || j.Cost != 10_000 {
		t.Fatalf("CompleteJob = %+v, %v; want 10 units costing 0.01, the price at acceptance", j, err)
	}
	if st := c.state(t, s, a, T0); st.Used != whole(10) || st.Spend != 10_000 || st.Reserved != 0 || st.ReservedSpend != 0 {
		t.Errorf("state %+v, want 10 used, 0.01 spent, nothing held", st)
	}
	if es := Ledger(t, s, store.LedgerFilter{}); len(es) != 1 || es[0].Cost != 10_000 || es[0].ProductID != "tok" {
		t.Errorf("ledger %+v", es)
	}
}

// testJobTermsKept: a job's terms are stored with it, the product being
// the one its hold was taken under (a free account's job has none); no
// change of the job's can alter them, and they outlive its end. They are
// what the gateway charges a job completed without units with once a
// reload removed its endpoint or repriced it.
func testJobTermsKept(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0)
	j := newJob("job", T0.Add(time.Hour))
	j.Terms = &store.JobTerms{EndpointCost: 2_500_000, Product: &instant} // the product is the store's to set
	if res, err := s.CreateJobReserved(ctx, j, a, whole(1), T0); err != nil || !res.Decision.Allowed {
		t.Fatalf("CreateJobReserved: %+v, %v", res.Decision, err)
	}
	check := func(when string) {
		t.Helper()
		got, err := s.GetJob(ctx, "job")
		if err != nil || got.Terms == nil || got.Terms.EndpointCost != 2_500_000 || got.Terms.Product == nil ||
			got.Terms.Product.ID != quotaBlock.ID || got.Terms.Product.Quota == nil || *got.Terms.Product.Quota != whole(10) {
			t.Fatalf("%s: GetJob = %+v, %v; want the endpoint's cost 2.5 and the product held under", when, got.Terms, err)
		}
	}
	check("created")
	if _, err := s.UpdateJob(ctx, "job", func(j *store.Job) error {
		j.Status, j.Terms = store.JobRunning, &store.JobTerms{EndpointCost: whole(9)}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check("after progress that tried to change them")
	if _, err := s.CompleteJob(ctx, "job", a, completion(a, "job", 2_500_000), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	check("completed")

	owner := newJob("owner", T0.Add(time.Hour))
	owner.Free, owner.Terms = true, &store.JobTerms{EndpointCost: whole(3), Product: &quotaBlock}
	if _, err := s.CreateJobReserved(ctx, owner, store.Account{UserID: "u1", ServiceID: "svc", Free: true}, whole(3), T0); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetJob(ctx, "owner"); err != nil || got.Terms == nil || got.Terms.Product != nil || got.Terms.EndpointCost != whole(3) {
		t.Errorf("owner's job terms %+v, %v; want the cost and no product", got.Terms, err)
	}
}

// testJobTermsProductRemoved: a reload removed the PREPAID product a job
// was held under; its completion is still charged under it, in credits,
// and the hold is given back.
func testJobTermsProductRemoved(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", prepaidWhole, whole(10)) // 1 credit a unit
	reserveJob(t, s, "job", a, whole(1))
	if st := c.state(t, s, a, T0); st.CreditsHeld != whole(1) {
		t.Fatalf("held %s, want 1", st.CreditsHeld)
	}
	// What the gateway had left to hand once the product was gone.
	free := store.Account{UserID: "u1", ServiceID: "svc", Free: true}
	e := completion(free, "job", whole(3))
	j, err := s.CompleteJob(ctx, "job", free, e, complete(store.JobCompleted, "d"))
	if err != nil || j.Units != whole(3) || j.Cost != whole(3) {
		t.Fatalf("CompleteJob = %+v, %v; want 3 units costing 3 credits", j, err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.Credits != whole(7) || sub.CreditsHeld != 0 {
		t.Errorf("credits %s held %s, want 7 and nothing held", sub.Credits, sub.CreditsHeld)
	}
	if es := Ledger(t, s, store.LedgerFilter{}); len(es) != 1 || es[0].ProductID != prepaidWhole.ID || es[0].Units != whole(3) || es[0].Cost != whole(3) {
		t.Errorf("ledger %+v, want 3 units costing 3 under %s", es, prepaidWhole.ID)
	}
}

// testJobHoldPeriod: a job settles into the billing period its hold was
// taken in, as a sync call does.
func testJobHoldPeriod(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0) // renews on the 20th at 11:00
	end := T0.Add(-time.Hour).AddDate(0, 1, 0)
	j := newJob("job", end.Add(time.Hour))
	if res, err := s.CreateJobReserved(ctx, j, a, whole(10), end.Add(-time.Minute)); err != nil || !res.Decision.Allowed {
		t.Fatalf("CreateJobReserved: %+v, %v", res.Decision, err)
	}
	if st := c.state(t, s, a, end); st != (billing.State{}) {
		t.Errorf("next period %+v, want empty", st)
	}
	e := completion(a, "job", whole(12))
	e.Time = end.Add(time.Minute)
	if j, err := s.CompleteJob(ctx, "job", a, e, complete(store.JobCompleted, "d")); err != nil || j.Units != whole(10) {
		t.Fatalf("CompleteJob = %+v, %v; want 10 charged", j, err)
	}
	if st := c.state(t, s, a, end.Add(-time.Second)); st.Used != whole(10) || st.Reserved != 0 {
		t.Errorf("period of the hold: %+v", st)
	}
	if st := c.state(t, s, a, end); st != (billing.State{}) {
		t.Errorf("next period: %+v, want empty", st)
	}
}

// testCreateJobReservedConcurrent: jobs started at once never hold more
// than the quota, and their completions never charge more.
func testCreateJobReservedConcurrent(t *testing.T, c *suite) {
	s := c.store(t)
	p := billing.Product{ID: "q57", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: ptr(whole(57))}
	a := subscribe(t, s, "u1", "svc", p, 0)
	const callers = 200
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created []string
		refused int
	)
	for i := range callers {
		wg.Go(func() {
			j := newJob(fmt.Sprintf("job-%03d", i), T0.Add(time.Hour))
			res, err := s.CreateJobReserved(ctx, j, a, whole(1), T0)
			dec := res.Decision
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("CreateJobReserved: %v", err)
			case dec.Allowed:
				created = append(created, j.ID)
			default:
				refused++
			}
		})
	}
	wg.Wait()
	if len(created) != 57 || refused != callers-57 {
		t.Fatalf("%d jobs created, %d refused; want 57 and %d", len(created), refused, callers-57)
	}
	stored := 0
	for i := range callers {
		if _, err := s.GetJob(ctx, fmt.Sprintf("job-%03d", i)); err == nil {
			stored++
		}
	}
	if stored != 57 {
		t.Errorf("%d jobs stored, want 57", stored)
	}
	if st := c.state(t, s, a, T0); st.Reserved != whole(57) {
		t.Errorf("state %+v, want 57 held", st)
	}
	// Every job completes claiming 2 units at once: the quota is charged,
	// not a unit more.
	for _, id := range created {
		wg.Go(func() {
			if _, err := s.CompleteJob(ctx, id, a, completion(a, id, whole(2)), complete(store.JobCompleted, "d")); err != nil {
				t.Errorf("CompleteJob: %v", err)
			}
		})
	}
	wg.Wait()
	if st := c.state(t, s, a, T0); st.Used != whole(57) || st.Reserved != 0 {
		t.Errorf("after completions: %+v, want exactly the quota used", st)
	}
	if units, _ := SumUnits(Ledger(t, s, store.LedgerFilter{})); units != whole(57) {
		t.Errorf("ledger charges %s, want 57", units)
	}
}
