package boltstore

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
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
	res, dec, _, err := s.CreateJobReserved(ctx, j, a, units, t0)
	if err != nil || !dec.Allowed || res.ID == "" || res.JobID != id {
		t.Fatalf("CreateJobReserved(%s, %s) = %+v, %+v, %v", id, units, res, dec, err)
	}
	return res
}

func completion(a store.Account, id string, units billing.Units) store.LedgerEntry {
	return store.LedgerEntry{Time: t0.Add(time.Minute), UserID: a.UserID, ServiceID: a.ServiceID, ProductID: a.Product.ID,
		RequestID: id, Units: units, Source: store.SourceCompletion}
}

// TestCreateJobReserved: the hold and the job are written together, and a
// refusal writes neither.
func TestCreateJobReserved(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0)
	res := reserveJob(t, s, "job-1", a, whole(7))
	j, err := s.GetJob(ctx, "job-1")
	if err != nil || j.ReservationID != res.ID || j.Status != store.JobPending {
		t.Fatalf("GetJob = %+v, %v; want the job naming hold %s", j, err, res.ID)
	}
	if st := stateOf(t, s, a, t0); st.Reserved != whole(7) || st.Used != 0 {
		t.Errorf("state %+v, want 7 held", st)
	}

	// Over the quota: no job, no hold, nothing else written.
	before, holds := stateOf(t, s, a, t0), holdsStored(t, s)
	j2 := newJob("job-2", t0.Add(time.Hour))
	res2, dec, st, err := s.CreateJobReserved(ctx, j2, a, whole(4), t0)
	if err != nil || dec.Allowed || dec.Code != billing.CodeQuotaExceeded || res2.ID != "" || st != before {
		t.Fatalf("CreateJobReserved over quota = %+v, %+v, %+v, %v", res2, dec, st, err)
	}
	if _, err := s.GetJob(ctx, "job-2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused job was stored: %v", err)
	}
	if got := stateOf(t, s, a, t0); got != before || holdsStored(t, s) != holds {
		t.Errorf("a refusal wrote: state %+v, %d holds", got, holdsStored(t, s))
	}
	// An id already taken is a conflict and holds nothing.
	if _, _, _, err := s.CreateJobReserved(ctx, newJob("job-1", t0.Add(time.Hour)), a, whole(1), t0); !errors.Is(err, store.ErrConflict) {
		t.Errorf("duplicate id = %v, want ErrConflict", err)
	}
	if got := stateOf(t, s, a, t0); got != before {
		t.Errorf("a duplicate id held units: %+v", got)
	}
	// No subscription: nothing written.
	stranger := store.Account{UserID: "u2", ServiceID: "svc", Product: quotaBlock}
	if _, _, _, err := s.CreateJobReserved(ctx, newJob("job-3", t0.Add(time.Hour)), stranger, whole(1), t0); !errors.Is(err, store.ErrNoAccount) {
		t.Errorf("no subscription = %v, want ErrNoAccount", err)
	}
	if _, err := s.GetJob(ctx, "job-3"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a job without a subscription was stored: %v", err)
	}
	// A new job must be open.
	done := newJob("job-4", t0.Add(time.Hour))
	done.Status = store.JobCompleted
	if _, _, _, err := s.CreateJobReserved(ctx, done, a, whole(1), t0); err == nil {
		t.Error("a terminal job took a hold")
	}

	// An owner's job holds nothing, whatever the quota.
	free := store.Account{UserID: "owner", ServiceID: "svc", Free: true}
	fj := newJob("owner-job", t0.Add(time.Hour))
	fj.UserID, fj.Free, fj.ProductID = "owner", true, ""
	res, dec, _, err = s.CreateJobReserved(ctx, fj, free, whole(1000), t0)
	if err != nil || !dec.Allowed || res.ID != "" {
		t.Fatalf("owner's CreateJobReserved = %+v, %+v, %v", res, dec, err)
	}
	if j, err := s.GetJob(ctx, "owner-job"); err != nil || j.ReservationID != "" {
		t.Errorf("owner's job %+v, %v", j, err)
	}
	if holdsStored(t, s) != holds {
		t.Errorf("an owner's job stored a hold")
	}
	if _, err := s.CompleteJob(ctx, "owner-job", free, completion(free, "owner-job", whole(1000)), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	es := ledger(t, s, store.LedgerFilter{UserID: "owner"})
	if len(es) != 1 || es[0].Units != whole(1000) || es[0].ProductID != "" || es[0].Cost != 0 {
		t.Errorf("owner's completion recorded as %+v", es)
	}

	// The hold of a job never settles as a sync call's.
	if _, err := s.Settle(ctx, reserveJob(t, s, "job-5", a, whole(1)), whole(1), entryFor(a, 0, t0)); !errors.Is(err, store.ErrConflict) {
		t.Errorf("Settle of a job's hold = %v, want ErrConflict", err)
	}
	if st := stateOf(t, s, a, t0); st.Reserved != whole(8) || st.Used != 0 {
		t.Errorf("after a refused Settle: %+v, want 8 held", st)
	}
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
	if _, dec, _, err := s.Reserve(ctx, q, whole(6), t0); err != nil || !dec.Allowed {
		t.Fatalf("sync Reserve: %+v, %v", dec, err)
	}
	if _, dec, _, err := s.Reserve(ctx, p, whole(4), t0); err != nil || !dec.Allowed {
		t.Fatalf("sync Reserve: %+v, %v", dec, err)
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
	if _, dec, _, _ := s.Reserve(ctx, q, whole(8), t0); dec.Allowed {
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

// prepaidWhole costs a whole credit a unit, so what fits a balance is exact.
var prepaidWhole = billing.Product{ID: "prepaid-whole", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken,
	Price: whole(1)}

// TestCompleteJobSettlesHold: a completion's units replace the hold, as a
// sync call's settlement does, and never cross a hard limit.
func TestCompleteJobSettlesHold(t *testing.T) {
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
			s := openTemp(t)
			a := subscribe(t, s, "u1", "svc", tt.p, tt.credits)
			if tt.others > 0 {
				reserveJob(t, s, "other", a, tt.others)
			}
			reserveJob(t, s, "job", a, tt.reserve)
			j, err := s.CompleteJob(ctx, "job", a, completion(a, "job", tt.complete), complete(store.JobCompleted, "d"))
			if err != nil || j.Status != store.JobCompleted || j.Units != tt.charged || j.Cost != tt.cost {
				t.Fatalf("CompleteJob = %+v, %v; want %s charged costing %s", j, err, tt.charged, tt.cost)
			}
			st := stateOf(t, s, a, t0)
			if st.Used != tt.used || st.Reserved != tt.others || st.CreditsHeld != 0 {
				t.Errorf("state %+v, want %s used and %s held", st, tt.used, tt.others)
			}
			es := ledger(t, s, store.LedgerFilter{})
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
				func() error { _, err := s.ExpireJobs(ctx, t0.Add(48*time.Hour), "expired"); return err },
			} {
				if err := again(); err != nil {
					t.Fatal(err)
				}
			}
			want := st
			want.Reserved = 0 // the other job expired meanwhile
			if got := stateOf(t, s, a, t0); got != want {
				t.Errorf("repeated ends: state %+v, want %+v", got, want)
			}
			if n := len(ledger(t, s, store.LedgerFilter{})); n != 1 {
				t.Errorf("%d ledger entries after repeated ends", n)
			}
		})
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

// TestJobHoldProductChanged: a job started under one product and completed
// under another gives back exactly what it held and is priced by the new
// product; a product no longer offered records the units free.
func TestJobHoldProductChanged(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", prepaid, whole(10))
	reserveJob(t, s, "job-1", a, whole(8)) // 2 credits held
	now := store.Account{UserID: "u1", ServiceID: "svc", Product: quotaBlock}
	if _, err := s.CompleteJob(ctx, "job-1", now, completion(now, "job-1", whole(3)), complete(store.JobCompleted, "d")); err != nil {
		t.Fatal(err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.CreditsHeld != 0 || sub.Credits != whole(10) {
		t.Errorf("prepaid hold not given back: %+v", sub)
	}
	if st := stateOf(t, s, now, t0); st.Used != whole(3) || st.Reserved != 0 {
		t.Errorf("state %+v", st)
	}

	reserveJob(t, s, "job-2", a, whole(4))
	free := store.Account{UserID: "u1", ServiceID: "svc", Free: true}
	j, err := s.CompleteJob(ctx, "job-2", free, completion(free, "job-2", whole(5)), complete(store.JobCompleted, "d"))
	if err != nil || j.Units != whole(5) || j.Cost != 0 {
		t.Fatalf("CompleteJob(free) = %+v, %v", j, err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.CreditsHeld != 0 || sub.Credits != whole(10) {
		t.Errorf("hold of a job completed free not given back: %+v", sub)
	}
	if es := ledger(t, s, store.LedgerFilter{}); len(es) != 2 || es[1].ProductID != "" || es[1].Units != whole(5) {
		t.Errorf("ledger %+v", es)
	}
}

// TestJobHoldPeriod: a job settles into the billing period its hold was
// taken in, as a sync call does.
func TestJobHoldPeriod(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0) // renews on the 20th at 11:00
	end := t0.Add(-time.Hour).AddDate(0, 1, 0)
	j := newJob("job", end.Add(time.Hour))
	if _, dec, _, err := s.CreateJobReserved(ctx, j, a, whole(10), end.Add(-time.Minute)); err != nil || !dec.Allowed {
		t.Fatalf("CreateJobReserved: %+v, %v", dec, err)
	}
	if st := stateOf(t, s, a, end); st != (billing.State{}) {
		t.Errorf("next period %+v, want empty", st)
	}
	e := completion(a, "job", whole(12))
	e.Time = end.Add(time.Minute)
	if j, err := s.CompleteJob(ctx, "job", a, e, complete(store.JobCompleted, "d")); err != nil || j.Units != whole(10) {
		t.Fatalf("CompleteJob = %+v, %v; want 10 charged", j, err)
	}
	if st := stateOf(t, s, a, end.Add(-time.Second)); st.Used != whole(10) || st.Reserved != 0 {
		t.Errorf("period of the hold: %+v", st)
	}
	if st := stateOf(t, s, a, end); st != (billing.State{}) {
		t.Errorf("next period: %+v, want empty", st)
	}
}

// TestCreateJobReservedConcurrent: jobs started at once never hold more
// than the quota, and their completions never charge more.
func TestCreateJobReservedConcurrent(t *testing.T) {
	s := openTemp(t)
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := newJob(fmt.Sprintf("job-%03d", i), t0.Add(time.Hour))
			_, dec, _, err := s.CreateJobReserved(ctx, j, a, whole(1), t0)
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
		}()
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
	if st := stateOf(t, s, a, t0); st.Reserved != whole(57) {
		t.Errorf("state %+v, want 57 held", st)
	}
	// Every job completes claiming 2 units at once: the quota is charged,
	// not a unit more.
	for _, id := range created {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.CompleteJob(ctx, id, a, completion(a, id, whole(2)), complete(store.JobCompleted, "d")); err != nil {
				t.Errorf("CompleteJob: %v", err)
			}
		}()
	}
	wg.Wait()
	if st := stateOf(t, s, a, t0); st.Used != whole(57) || st.Reserved != 0 {
		t.Errorf("after completions: %+v, want exactly the quota used", st)
	}
	if units, _ := sumUnits(ledger(t, s, store.LedgerFilter{})); units != whole(57) {
		t.Errorf("ledger charges %s, want 57", units)
	}
}
