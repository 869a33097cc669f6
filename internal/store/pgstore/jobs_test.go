package pgstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// A job created on a, polled on b and completed on c is charged once,
// from the hold a took.
func TestJobAcrossNodes(t *testing.T) {
	_, n := threeNodes(t)
	ctx := context.Background()
	subscribe(t, n[0], "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(10)}
	now := time.Now().UTC()
	j := store.Job{ID: "job-1", UserID: "u", ServiceID: "svc", EndpointID: "e", Status: store.JobPending,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
	res, err := n[0].CreateJobReserved(ctx, j, acct, units(4), now)
	dec := res.Decision
	if err != nil || !dec.Allowed || res.JobID != "job-1" {
		t.Fatalf("create: %+v %+v %v", res, dec, err)
	}
	if _, err := n[1].CreateJobReserved(ctx, j, acct, units(1), now); !errors.Is(err, store.ErrExists) {
		t.Fatalf("same id again: %v", err)
	}
	if _, err := n[1].Settle(ctx, res, units(1), store.LedgerEntry{}); !errors.Is(err, store.ErrJobHold) {
		t.Fatalf("a job's hold through Settle: %v", err)
	}
	got, err := n[1].GetJob(ctx, "job-1")
	if err != nil || got.Status != store.JobPending || got.ReservationID == "" {
		t.Fatalf("poll on b: %+v %v", got, err)
	}
	// 6 units left for others: a second job of 6 fits, then none.
	j2 := j
	j2.ID = "job-2"
	if res, err := n[2].CreateJobReserved(ctx, j2, acct, units(6), now); err != nil || !res.Decision.Allowed {
		t.Fatalf("job 2: %+v %v", res.Decision, err)
	}
	j3 := j
	j3.ID = "job-3"
	if res, err := n[2].CreateJobReserved(ctx, j3, acct, units(1), now); err != nil || res.Decision.Allowed {
		t.Fatalf("job 3 past the quota: %+v %v", res.Decision, err)
	}
	if _, err := n[1].GetJob(ctx, "job-3"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused job is not stored: %v", err)
	}
	done, err := n[2].CompleteJob(ctx, "job-1", acct, store.LedgerEntry{UserID: "u", ServiceID: "svc", Units: units(2), Time: now},
		func(j *store.Job) error { j.Status = store.JobCompleted; j.CompletedAt = now; return nil })
	if err != nil || done.Units != units(2) {
		t.Fatalf("complete on c: %+v %v", done, err)
	}
	again, err := n[0].CompleteJob(ctx, "job-1", acct, store.LedgerEntry{UserID: "u", ServiceID: "svc", Units: units(2), Time: now},
		func(j *store.Job) error { j.Status = store.JobCompleted; return nil })
	if err != nil || again.Units != units(2) {
		t.Fatalf("complete again: %+v %v", again, err)
	}
	st, _ := n[0].State(ctx, acct, now)
	if st.Used != units(2) || st.Reserved != units(6) {
		t.Fatalf("after job 1: used %s held %s, want 2 and 6", st.Used, st.Reserved)
	}
	// Job 2 expires: its hold is released, nothing charged.
	if n, err := n[1].ExpireJobs(ctx, now.Add(2*time.Hour), "expired"); err != nil || n != 1 {
		t.Fatalf("expire: %d %v", n, err)
	}
	st, _ = n[0].State(ctx, acct, now)
	if st.Used != units(2) || st.Reserved != 0 {
		t.Fatalf("after expiry: used %s held %s, want 2 and 0", st.Used, st.Reserved)
	}
	list, next, err := n[0].ListJobs(ctx, store.JobFilter{Status: store.JobFailed}, "", 10)
	if err != nil || len(list) != 1 || list[0].ID != "job-2" || next != "" {
		t.Fatalf("failed jobs: %+v %q %v", list, next, err)
	}
	list, next, err = n[0].ListJobs(ctx, store.JobFilter{UserID: "u"}, "", 1)
	if err != nil || len(list) != 1 || next == "" {
		t.Fatalf("page 1: %+v %q %v", list, next, err)
	}
	list, next, err = n[0].ListJobs(ctx, store.JobFilter{UserID: "u"}, next, 1)
	if err != nil || len(list) != 1 || list[0].ID != "job-2" || next != "" {
		t.Fatalf("page 2: %+v %q %v", list, next, err)
	}
}

// A completion racing on three nodes is metered exactly once.
func TestJobCompletionRace(t *testing.T) {
	_, n := threeNodes(t)
	ctx := context.Background()
	subscribe(t, n[0], "u", "svc", "pp")
	n[0].AddCredits(ctx, "u", "svc", units(100), time.Now())
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: prepaidProduct(1)}
	now := time.Now().UTC()
	j := store.Job{ID: "j", UserID: "u", ServiceID: "svc", Status: store.JobPending, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if res, err := n[0].CreateJobReserved(ctx, j, acct, units(5), now); err != nil || !res.Decision.Allowed {
		t.Fatal(res.Decision, err)
	}
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			n[i%3].CompleteJob(ctx, "j", acct, store.LedgerEntry{UserID: "u", ServiceID: "svc", Units: units(3)},
				func(j *store.Job) error {
					if j.Terminal() {
						return errors.New("finished")
					}
					j.Status = store.JobCompleted
					return nil
				})
		})
	}
	wg.Wait()
	sub, _ := n[1].GetSubscription(ctx, "u", "svc")
	n[1].cache.dropAll()
	sub, _ = n[1].GetSubscription(ctx, "u", "svc")
	if sub.Credits != units(97) || sub.CreditsHeld != 0 {
		t.Fatalf("credits %s held %s, want 97 and 0", sub.Credits, sub.CreditsHeld)
	}
}

// A report's idempotency key is claimed once across the fleet; the
// duplicate gets the first response.
func TestIdempotencyAcrossNodes(t *testing.T) {
	_, n := threeNodes(t)
	ctx := context.Background()
	subscribe(t, n[0], "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	firsts, dups := 0, 0
	bodies := map[string]bool{}
	for i := range 30 {
		wg.Go(func() {
			body, err := n[i%3].Record(ctx, acct, store.LedgerEntry{UserID: "u", ServiceID: "svc", Units: units(2), Source: store.SourceReport,
				IdempotencyKey: "report-1"}, func(e store.LedgerEntry, st billing.State) ([]byte, error) {
				return []byte(e.ID), nil
			})
			mu.Lock()
			defer mu.Unlock()
			bodies[string(body)] = true
			switch {
			case err == nil:
				firsts++
			case errors.Is(err, store.ErrReplayed):
				dups++
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if firsts != 1 || dups != 29 || len(bodies) != 1 {
		t.Fatalf("%d first, %d duplicates, %d distinct responses", firsts, dups, len(bodies))
	}
	st, _ := n[2].State(ctx, acct, time.Now())
	if st.Used != units(2) {
		t.Fatalf("used %s, want 2", st.Used)
	}
	if pruned, err := n[1].PruneIdempotency(ctx, time.Now().Add(time.Minute)); err != nil || pruned != 1 {
		t.Fatalf("prune: %d %v", pruned, err)
	}
}

func TestAlertsOnce(t *testing.T) {
	_, n := threeNodes(t)
	ctx := context.Background()
	period := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	now := time.Now().UTC()
	a := store.Alert{UserID: "u", ServiceID: "svc", ProductID: "q", PeriodStart: period, Threshold: "quota 80%",
		Value: units(80), Limit: units(100), Created: now}
	first, err := n[0].CreateAlert(ctx, a)
	if err != nil || first.ID == "" || first.Status != store.AlertPending {
		t.Fatalf("create: %+v %v", first, err)
	}
	if dup, err := n[1].CreateAlert(ctx, a); !errors.Is(err, store.ErrExists) || dup.ID != first.ID {
		t.Fatalf("second: %+v %v", dup, err)
	}
	if ok, err := n[2].HasAlert(ctx, "u", "svc", period, "quota 80%"); !ok || err != nil {
		t.Fatalf("HasAlert: %v %v", ok, err)
	}
	due, err := n[2].DueAlerts(ctx, now, 10)
	if err != nil || len(due) != 1 {
		t.Fatalf("due: %+v %v", due, err)
	}
	sent := due[0]
	sent.Status, sent.Attempts, sent.DeliveredAt = store.AlertDelivered, 1, now
	if _, err := n[1].UpdateAlert(ctx, sent, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := n[2].UpdateAlert(ctx, sent, 0); !errors.Is(err, store.ErrStale) {
		t.Fatalf("second sender: %v", err)
	}
	if due, _ := n[0].DueAlerts(ctx, now, 10); len(due) != 0 {
		t.Fatalf("delivered alert still due: %+v", due)
	}
	b := a
	b.Threshold = "quota 100%"
	n[0].CreateAlert(ctx, b)
	list, next, err := n[0].ListAlerts(ctx, store.AlertFilter{UserID: "u"}, "", 1)
	if err != nil || len(list) != 1 || list[0].Threshold != "quota 100%" || next == "" {
		t.Fatalf("page 1: %+v %q %v", list, next, err)
	}
	list, next, err = n[0].ListAlerts(ctx, store.AlertFilter{UserID: "u"}, next, 1)
	if err != nil || len(list) != 1 || list[0].Status != store.AlertDelivered || next != "" {
		t.Fatalf("page 2: %+v %q %v", list, next, err)
	}
}
