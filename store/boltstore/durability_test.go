package boltstore

import (
	"errors"
	"testing"
	"time"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

// TestCrashReleasesHolds: a process killed with calls in flight never
// settled them and never answered their callers. Close without settling
// leaves the file exactly as kill -9 would (every hold is committed before
// its call is forwarded); reopening releases the holds and charges nothing.
func TestCrashReleasesHolds(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	q := subscribe(t, s, "u1", "quota", quotaBlock, 0)
	p := subscribe(t, s, "u1", "prepaid", prepaid, whole(10))
	c := subscribe(t, s, "u1", "capped", postpaid, 0)
	var held []store.Reservation
	for _, r := range []struct {
		a     store.Account
		units billing.Units
	}{{q, whole(6)}, {q, whole(4)}, {p, whole(40)}, {c, whole(500)}} {
		res, dec, _, err := s.Reserve(ctx, r.a, r.units, t0)
		if err != nil || !dec.Allowed {
			t.Fatalf("Reserve: %+v, %v", dec, err)
		}
		held = append(held, res)
	}
	if _, dec, _, _ := s.Reserve(ctx, q, whole(1), t0); dec.Allowed {
		t.Fatal("quota not held")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openAt(t, path)
	for _, a := range []store.Account{q, p, c} {
		st := stateOf(t, s, a, t0)
		if st.Reserved != 0 || st.ReservedSpend != 0 || st.CreditsHeld != 0 || st.Used != 0 || st.Spend != 0 {
			t.Errorf("%s after restart: %+v, want nothing held or charged", a.ServiceID, st)
		}
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "prepaid"); sub.Credits != whole(10) || sub.CreditsHeld != 0 {
		t.Errorf("prepaid balance after restart: %+v", sub)
	}
	if n := len(ledger(t, s, store.LedgerFilter{})); n != 0 {
		t.Errorf("%d ledger entries after restart", n)
	}
	// The old reservations are gone: settling one late charges nothing.
	for _, res := range held {
		if _, err := s.Settle(ctx, res, res.Decision.Units, entryFor(res.Account, 0, t0)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Settle of a released hold = %v, want ErrNotFound", err)
		}
	}
	// The whole quota is available again.
	if _, dec, _, err := s.Reserve(ctx, q, whole(10), t0); err != nil || !dec.Allowed {
		t.Errorf("Reserve(10) after restart = %+v, %v", dec, err)
	}
	// A restart with nothing held changes nothing.
	s.Close()
	s = openAt(t, path)
	if st := stateOf(t, s, q, t0); st.Reserved != 0 {
		t.Errorf("second restart: %+v", st)
	}
}

// TestDurableAcrossReopen: everything acknowledged is in the file after
// Close and Open, and the ledger carries on without reusing ids or going
// back in time.
func TestDurableAcrossReopen(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	key := store.KeyRecord{ID: "key_1", Hash: keyHash("sk_1"), UserID: "u1", Roles: []string{"r"}, Label: "l", Created: t0}
	if err := s.CreateKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeKey(ctx, "key_1", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	p := subscribe(t, s, "u1", "svc", prepaid, whole(10))
	res, _, _, err := s.Reserve(ctx, p, whole(8), t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Settle(ctx, res, whole(4), entryFor(p, 0, t0.Add(time.Second))); err != nil {
		t.Fatal(err)
	}
	e := entryFor(p, whole(4), t0.Add(2*time.Second))
	e.IdempotencyKey = "idem"
	first, err := s.Record(ctx, p, e, okResponse)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(ctx, store.Job{ID: "job", UserID: "u1", ServiceID: "svc", Status: store.JobPending,
		CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	before := ledger(t, s, store.LedgerFilter{})
	wantState := stateOf(t, s, p, t0)
	s.Close()

	s = openAt(t, path)
	if k, err := s.KeyByHash(ctx, keyHash("sk_1")); err != nil || k.ID != "key_1" || !k.RevokedAt.Equal(t0.Add(time.Hour)) || k.Label != "l" {
		t.Errorf("key after reopen: %+v, %v", k, err)
	}
	if sub, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || sub.Credits != whole(8) || !sub.StartedAt.Equal(t0.Add(-time.Hour)) {
		t.Errorf("subscription after reopen: %+v, %v", sub, err)
	}
	if st := stateOf(t, s, p, t0); st != wantState || st.Used != whole(8) {
		t.Errorf("state after reopen %+v, want %+v", st, wantState)
	}
	after := ledger(t, s, store.LedgerFilter{})
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
	// The idempotency claim survived.
	if again, err := s.Record(ctx, p, e, okResponse); !errors.Is(err, store.ErrConflict) || string(again) != string(first) {
		t.Errorf("retried report after reopen: %q, %v", again, err)
	}
	// A new entry gets a fresh id and sorts after the old ones even when
	// its clock says earlier.
	if _, err := s.Record(ctx, p, entryFor(p, whole(1), t0), okResponse); err != nil {
		t.Fatal(err)
	}
	all := ledger(t, s, store.LedgerFilter{})
	if len(all) != 3 || all[2].ID == all[0].ID || all[2].ID == all[1].ID || all[2].Seq <= all[1].Seq || all[2].Time.Before(all[1].Time) {
		t.Errorf("ledger after a new entry: %+v", all)
	}
}
