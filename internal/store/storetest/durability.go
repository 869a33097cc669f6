package storetest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testClose: writes racing Close either commit or fail with an error; none
// hangs; a write after Close fails; a second Close is harmless; with a
// restart, every write reported committed is there.
func testClose(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	var ok atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			<-start
			for range 5 {
				if _, err := s.Record(ctx, a, EntryFor(a, whole(1), T0), OKResponse); err == nil {
					ok.Add(1)
				}
			}
		})
	}
	close(start)
	if err := s.Writable(ctx); err != nil {
		t.Errorf("Writable of an open store: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Writable(cancelled); err == nil {
		t.Error("Writable with a cancelled context: nil")
	}
	time.Sleep(time.Millisecond) // let some writes in first
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("writers still blocked 20s after Close")
	}
	if _, err := s.Record(ctx, a, EntryFor(a, whole(1), T0), OKResponse); err == nil {
		t.Error("Record after Close succeeded")
	}
	if err := s.Writable(ctx); err == nil {
		t.Error("Writable after Close: nil (a pre-flight answer would allow what Reserve refuses)")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if c.reopen == nil {
		return
	}
	s = c.restart(t, s)
	if n := len(Ledger(t, s, store.LedgerFilter{})); n != int(ok.Load()) {
		t.Errorf("%d entries stored, %d writes reported committed", n, ok.Load())
	}
}

// testDurableAcrossReopen: everything acknowledged is there after a
// restart, the idempotency claims too, and new entries get fresh ids.
func testDurableAcrossReopen(t *testing.T, c *suite) {
	c.needRestart(t)
	s := c.store(t)
	key := store.KeyRecord{ID: "key_1", Hash: KeyHash("sk_1"), UserID: "u1", Roles: []string{"r"}, Label: "l", Created: T0}
	if err := s.CreateKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeKey(ctx, "key_1", T0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	p := subscribe(t, s, "u1", "svc", prepaid, whole(10))
	res, err := s.Reserve(ctx, p, whole(8), T0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Settle(ctx, res, whole(4), EntryFor(p, 0, T0.Add(time.Second))); err != nil {
		t.Fatal(err)
	}
	e := EntryFor(p, whole(4), T0.Add(2*time.Second))
	e.IdempotencyKey = "idem"
	first, err := s.Record(ctx, p, e, OKResponse)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(ctx, store.Job{ID: "job", UserID: "u1", ServiceID: "svc", Status: store.JobPending,
		CreatedAt: T0, ExpiresAt: T0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateAlert(ctx, newAlert("u1", "quota 80%")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendAudit(ctx, store.AuditEntry{Time: T0, Actor: "test", Action: "key.create", KeyID: "k0"}); err != nil {
		t.Fatal(err)
	}
	before := Ledger(t, s, store.LedgerFilter{})
	wantState := c.state(t, s, p, T0)

	s = c.restart(t, s)
	if k, err := s.KeyByHash(ctx, KeyHash("sk_1")); err != nil || k.ID != "key_1" || !k.RevokedAt.Equal(T0.Add(time.Hour)) || k.Label != "l" {
		t.Errorf("key after reopen: %+v, %v", k, err)
	}
	if sub, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || sub.Credits != whole(8) || !sub.StartedAt.Equal(T0.Add(-time.Hour)) {
		t.Errorf("subscription after reopen: %+v, %v", sub, err)
	}
	if st := c.state(t, s, p, T0); st != wantState || st.Used != whole(8) {
		t.Errorf("state after reopen %+v, want %+v", st, wantState)
	}
	after := Ledger(t, s, store.LedgerFilter{})
	if len(after) != len(before) || len(after) != 2 {
		t.Fatalf("ledger after reopen: %d entries, want %d", len(after), len(before))
	}
	for i := range after {
		if after[i].ID != before[i].ID || after[i].Units != before[i].Units || !after[i].Time.Equal(before[i].Time) {
			t.Errorf("entry %d: %+v, was %+v", i, after[i], before[i])
		}
	}
	if j, err := s.GetJob(ctx, "job"); err != nil || j.Status != store.JobPending {
		t.Errorf("job after reopen: %+v, %v", j, err)
	}
	if _, err := s.CreateAlert(ctx, newAlert("u1", "quota 80%")); !errors.Is(err, store.ErrExists) {
		t.Errorf("alert after reopen fired again: %v", err)
	}
	if got := auditPages(t, s, 10); got != "[k0]" {
		t.Errorf("audit after reopen: %s", got)
	}
	if again, err := s.Record(ctx, p, e, OKResponse); !errors.Is(err, store.ErrReplayed) || string(again) != string(first) {
		t.Errorf("retried report after reopen: %q, %v", again, err)
	}
	if _, err := s.Record(ctx, p, EntryFor(p, whole(1), T0.Add(3*time.Second)), OKResponse); err != nil {
		t.Fatal(err)
	}
	all := Ledger(t, s, store.LedgerFilter{})
	if len(all) != 3 || all[2].ID == all[0].ID || all[2].ID == all[1].ID || all[2].Seq == all[0].Seq || all[2].Seq == all[1].Seq {
		t.Errorf("ledger after a new entry: %+v", all)
	}
}

// testRestartReleasesSyncHolds: a process gone with sync calls in flight
// never settled them and never answered their callers; after a restart
// their holds are released, nothing is charged, and settling one late is
// ErrNotFound.
func testRestartReleasesSyncHolds(t *testing.T, c *suite) {
	c.needRestart(t)
	s := c.store(t)
	q := subscribe(t, s, "u1", "quota", quotaBlock, 0)
	p := subscribe(t, s, "u1", "prepaid", prepaid, whole(10))
	cp := subscribe(t, s, "u1", "capped", postpaid, 0)
	var held []store.Reservation
	for _, r := range []struct {
		a     store.Account
		units billing.Units
	}{{q, whole(6)}, {q, whole(4)}, {p, whole(40)}, {cp, whole(500)}} {
		res, err := s.Reserve(ctx, r.a, r.units, T0)
		dec := res.Decision
		if err != nil || !dec.Allowed {
			t.Fatalf("Reserve: %+v, %v", dec, err)
		}
		held = append(held, res)
	}
	if res, _ := s.Reserve(ctx, q, whole(1), T0); res.Decision.Allowed {
		t.Fatal("quota not held")
	}
	c.state(t, s, q, T0) // every hold durable, as before a call is forwarded

	s = c.restart(t, s)
	for _, a := range []store.Account{q, p, cp} {
		st := c.state(t, s, a, T0)
		if st.Reserved != 0 || st.ReservedSpend != 0 || st.CreditsHeld != 0 || st.Used != 0 || st.Spend != 0 {
			t.Errorf("%s after restart: %+v, want nothing held or charged", a.ServiceID, st)
		}
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "prepaid"); sub.Credits != whole(10) || sub.CreditsHeld != 0 {
		t.Errorf("prepaid balance after restart: %+v", sub)
	}
	for _, res := range held {
		if _, err := s.Settle(ctx, res, res.Decision.Units, EntryFor(res.Account, 0, T0)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Settle of a released hold = %v, want ErrNotFound", err)
		}
	}
	if n := len(Ledger(t, s, store.LedgerFilter{})); n != 0 {
		t.Errorf("%d ledger entries after restart", n)
	}
	if res, err := s.Reserve(ctx, q, whole(10), T0); err != nil || !res.Decision.Allowed {
		t.Errorf("Reserve(10) after restart = %+v, %v", res.Decision, err)
	}
}

// testJobHoldSurvivesRestart: a restart releases the holds of sync calls
// but keeps those of open jobs, which complete against them afterwards.
func testJobHoldSurvivesRestart(t *testing.T, c *suite) {
	c.needRestart(t)
	s := c.store(t)
	q := subscribe(t, s, "u1", "quota", quotaBlock, 0)
	p := subscribe(t, s, "u1", "prepaid", prepaid, whole(10))
	reserveJob(t, s, "job-q", q, whole(3))
	reserveJob(t, s, "job-p", p, whole(8)) // 2 credits
	reserveJob(t, s, "job-failed", q, whole(2))
	if _, err := s.UpdateJob(ctx, "job-failed", complete(store.JobFailed, "d")); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Reserve(ctx, q, whole(6), T0); err != nil || !res.Decision.Allowed {
		t.Fatalf("sync Reserve: %+v, %v", res.Decision, err)
	}
	if st := c.state(t, s, q, T0); st.Reserved != whole(9) {
		t.Fatalf("before the restart: %+v", st)
	}

	s = c.restart(t, s)
	if st := c.state(t, s, q, T0); st.Reserved != whole(3) || st.Used != 0 {
		t.Errorf("quota after restart: %+v, want the job's 3 still held", st)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "prepaid"); sub.CreditsHeld != whole(2) || sub.Credits != whole(10) {
		t.Errorf("prepaid after restart: %+v, want the job's 2 credits held", sub)
	}
	if res, _ := s.Reserve(ctx, q, whole(8), T0); res.Decision.Allowed {
		t.Error("the job's hold was released by the restart")
	}
	j, err := s.CompleteJob(ctx, "job-q", q, completion(q, "job-q", whole(3)), complete(store.JobCompleted, "d"))
	if err != nil || j.Units != whole(3) {
		t.Fatalf("CompleteJob after restart = %+v, %v", j, err)
	}
	if n, err := s.ExpireJobs(ctx, T0.Add(2*time.Hour), "expired"); err != nil || n != 1 {
		t.Fatalf("ExpireJobs = %d, %v", n, err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "prepaid"); sub.CreditsHeld != 0 || sub.Credits != whole(10) {
		t.Errorf("prepaid after expiry: %+v", sub)
	}
	if st := c.state(t, s, q, T0); st.Reserved != 0 || st.Used != whole(3) {
		t.Errorf("after completion and expiry: %+v", st)
	}
}

// testJobTermsSurviveRestart: a job's terms are durable: after a restart
// its completion is still charged under the product it was accepted under,
// though handed another.
func testJobTermsSurviveRestart(t *testing.T, c *suite) {
	c.needRestart(t)
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", prepaid, whole(10)) // 0.25 a unit
	j := newJob("job", T0.Add(time.Hour))
	j.Terms = &store.JobTerms{EndpointCost: 1_500_000}
	j.ProductID = prepaid.ID
	if res, err := s.CreateJobReserved(ctx, j, a, whole(4), T0); err != nil || !res.Decision.Allowed {
		t.Fatalf("CreateJobReserved: %+v, %v", res.Decision, err)
	}
	s = c.restart(t, s)
	got, err := s.GetJob(ctx, "job")
	if err != nil || got.Terms == nil || got.Terms.EndpointCost != 1_500_000 || got.Terms.Product == nil || *got.Terms.Product != prepaid {
		t.Fatalf("after restart: terms %+v, %v", got.Terms, err)
	}
	repriced := a
	repriced.Product.Price = whole(1)
	done, err := s.CompleteJob(ctx, "job", repriced, completion(repriced, "job", whole(2)), complete(store.JobCompleted, "d"))
	if err != nil || done.Cost != 500_000 {
		t.Fatalf("CompleteJob after restart = %+v, %v; want 2 units costing 0.5", done, err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.Credits != 9_500_000 || sub.CreditsHeld != 0 {
		t.Errorf("credits %s held %s, want 9.5 and nothing held", sub.Credits, sub.CreditsHeld)
	}
}
