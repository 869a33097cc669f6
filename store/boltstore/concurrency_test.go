package boltstore

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

// TestHardLimitsUnderConcurrency: 200 calls race for 57 units' worth of
// quota, credits or spending cap; exactly 57 get through, and once all are
// settled the counter and the ledger agree on 57.
func TestHardLimitsUnderConcurrency(t *testing.T) {
	const callers, limit = 200, 57
	tests := []struct {
		name    string
		p       billing.Product
		credits billing.Units
		code    string
	}{
		{"quota", billing.Product{ID: "q", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
			Quota: ptr(whole(limit)), Overage: "block"}, 0, billing.CodeQuotaExceeded},
		{"prepaid", billing.Product{ID: "p", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest,
			Price: whole(1)}, whole(limit), billing.CodeInsufficientCredits},
		{"spending cap", billing.Product{ID: "c", BillingModel: billing.UsageInstant, MeasurementType: billing.PerRequest,
			Price: whole(1), SpendingCap: ptr(whole(limit))}, 0, billing.CodeQuotaExceeded},
		{"overage cap", billing.Product{ID: "o", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
			Quota: ptr(whole(7)), Overage: "allow", Price: whole(1), SpendingCap: ptr(whole(limit - 7))}, 0, billing.CodeQuotaExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openTemp(t)
			a := subscribe(t, s, "u1", "svc", tt.p, tt.credits)
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				held     []store.Reservation
				refused  atomic.Int32
				failures atomic.Int32
			)
			for range callers {
				wg.Go(func() {
					res, dec, _, err := s.Reserve(ctx, a, whole(1), t0)
					switch {
					case err != nil:
						failures.Add(1)
					case dec.Allowed:
						mu.Lock()
						held = append(held, res)
						mu.Unlock()
					case dec.Code == tt.code:
						refused.Add(1)
					default:
						failures.Add(1)
					}
				})
			}
			wg.Wait()
			if len(held) != limit || refused.Load() != callers-limit || failures.Load() != 0 {
				t.Fatalf("%d allowed, %d refused, %d failed; want %d allowed", len(held), refused.Load(), failures.Load(), limit)
			}
			if st := stateOf(t, s, a, t0); st.Reserved != whole(limit) {
				t.Errorf("Reserved = %s, want %d", st.Reserved, limit)
			}
			for _, res := range held {
				wg.Go(func() {
					if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
						failures.Add(1)
					}
				})
			}
			wg.Wait()
			if failures.Load() != 0 {
				t.Fatalf("%d settlements failed", failures.Load())
			}
			st := stateOf(t, s, a, t0)
			units, cost := sumUnits(ledger(t, s, store.LedgerFilter{}))
			if st.Used != whole(limit) || units != whole(limit) || st.Reserved != 0 || st.ReservedSpend != 0 || st.CreditsHeld != 0 {
				t.Errorf("after settling: state %+v, ledger %s units; want %d used, nothing held", st, units, limit)
			}
			if cost != st.Spend {
				t.Errorf("ledger cost %s, counter spend %s", cost, st.Spend)
			}
			if p := tt.p; p.OverageAllowed() {
				// Only the units past the quota are billed, whatever order
				// the calls settled in.
				if want := billing.Mul(st.Used-*p.Quota, p.Price); st.Spend != want {
					t.Errorf("spend %s for %s used of a %s quota, want %s", st.Spend, st.Used, *p.Quota, want)
				}
			}
			if tt.p.BillingModel == billing.Prepaid && st.Credits != 0 {
				t.Errorf("credits left %s, want 0", st.Credits)
			}
			if _, dec, _, _ := s.Reserve(ctx, a, whole(1), t0); dec.Allowed {
				t.Errorf("one more unit allowed past the limit")
			}
		})
	}
}

// TestRecordIdempotent: ten parallel reports with one idempotency key count
// once; every caller gets the first response's bytes.
func TestRecordIdempotent(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	e := entryFor(a, whole(3), t0)
	e.IdempotencyKey = "idem-1"
	const n = 10
	var (
		wg     sync.WaitGroup
		bodies [n][]byte
		errs   [n]error
	)
	for i := range n {
		wg.Go(func() { bodies[i], errs[i] = s.Record(ctx, a, e, okResponse) })
	}
	wg.Wait()
	first, dups := 0, 0
	for i := range n {
		switch {
		case errs[i] == nil:
			first++
		case errors.Is(errs[i], store.ErrConflict):
			dups++
		default:
			t.Errorf("Record #%d: %v", i, errs[i])
		}
		if len(bodies[i]) == 0 || !bytes.Equal(bodies[i], bodies[0]) {
			t.Errorf("Record #%d returned %q, #0 %q", i, bodies[i], bodies[0])
		}
	}
	if first != 1 || dups != n-1 {
		t.Errorf("%d firsts and %d duplicates, want 1 and %d", first, dups, n-1)
	}
	entries := ledger(t, s, store.LedgerFilter{})
	if len(entries) != 1 || stateOf(t, s, a, t0).Used != whole(3) {
		t.Fatalf("ledger %+v, state %+v; want one entry of 3", entries, stateOf(t, s, a, t0))
	}
	if entries[0].IdempotencyKey != "idem-1" || !bytes.Contains(bodies[0], []byte(entries[0].ID)) {
		t.Errorf("entry %+v, body %q", entries[0], bodies[0])
	}

	// The key is scoped per service: another service's report with the
	// same key counts.
	b := subscribe(t, s, "u1", "svc2", unlimited, 0)
	e2 := entryFor(b, whole(3), t0)
	e2.IdempotencyKey = "idem-1"
	if _, err := s.Record(ctx, b, e2, okResponse); err != nil {
		t.Errorf("same key, other service: %v", err)
	}
	// Without a key, every report counts.
	for range 2 {
		if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
			t.Fatal(err)
		}
	}
	if got := stateOf(t, s, a, t0).Used; got != whole(5) {
		t.Errorf("Used = %s, want 5", got)
	}
}

// TestPruneIdempotency: keys claimed before the cutoff are forgotten (a
// retry then counts again); later ones still answer as duplicates.
func TestPruneIdempotency(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	record := func(key string, at time.Time) error {
		e := entryFor(a, whole(1), at)
		e.IdempotencyKey = key
		_, err := s.Record(ctx, a, e, okResponse)
		return err
	}
	for _, c := range []struct {
		key string
		at  time.Time
	}{{"old", t0.Add(-48 * time.Hour)}, {"older", t0.Add(-72 * time.Hour)}, {"new", t0.Add(-time.Hour)}} {
		if err := record(c.key, c.at); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.PruneIdempotency(ctx, t0.Add(-24*time.Hour))
	if err != nil || n != 2 {
		t.Fatalf("PruneIdempotency = %d, %v; want 2", n, err)
	}
	if n, err := s.PruneIdempotency(ctx, t0.Add(-24*time.Hour)); err != nil || n != 0 {
		t.Errorf("second PruneIdempotency = %d, %v; want 0", n, err)
	}
	if err := record("new", t0); !errors.Is(err, store.ErrConflict) {
		t.Errorf("kept key: %v, want ErrConflict", err)
	}
	if err := record("old", t0); err != nil {
		t.Errorf("pruned key: %v, want a fresh record", err)
	}
	if n := len(ledger(t, s, store.LedgerFilter{})); n != 4 {
		t.Errorf("%d ledger entries, want 4", n)
	}
}

// TestGroupCommit: 64 writers × 50 reports all land, in fewer fdatasyncs
// than reports.
func TestGroupCommit(t *testing.T) {
	const writers, each = 64, 50
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	var commits, writes atomic.Int64
	s.ObserveCommits(func(_ time.Duration, n int) {
		commits.Add(1)
		writes.Add(int64(n))
	})
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range writers {
		wg.Go(func() {
			for range each {
				if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d Record calls failed", failed.Load())
	}
	nw, nc := writes.Load(), commits.Load() // before stateOf's own write
	entries := ledger(t, s, store.LedgerFilter{})
	if len(entries) != writers*each || stateOf(t, s, a, t0).Used != whole(writers*each) {
		t.Fatalf("%d entries, Used %s; want %d", len(entries), stateOf(t, s, a, t0).Used, writers*each)
	}
	// Every report is one settlement record made durable by some fdatasync
	// of the log; the applier's commits of the file count as writes too.
	if nw < writers*each || nc >= writers*each {
		t.Errorf("%d writes in %d commits; want %d writes sharing commits", nw, nc, writers*each)
	}
	t.Logf("%d writes in %d commits", nw, nc)
}

// TestObserveCommitsWhileWriting: the platform app sets the observer in
// every Provision, on a store a previous config is still writing through
// (the store outlives reloads), so setting it must not race the commit loop.
func TestObserveCommitsWhileWriting(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var seen atomic.Int64
	for range 50 {
		s.ObserveCommits(func(time.Duration, int) { seen.Add(1) })
	}
	wg.Wait()
	s.ObserveCommits(nil) // nil turns observing off
	if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
		t.Fatal(err)
	}
}

// TestCloseWhileWriting: writes racing Close either commit or fail with
// ErrClosed; none hangs, and every one reported committed is in the file.
func TestCloseWhileWriting(t *testing.T) {
	path := storePath(t)
	var committed int
	for round := range 30 {
		s := openAt(t, path)
		a := subscribe(t, s, "u1", "svc", unlimited, 0)
		var ok atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 16 {
			wg.Go(func() {
				<-start
				for range 5 {
					_, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse)
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, ErrClosed):
					default:
						t.Errorf("Record: %v", err)
					}
				}
			})
		}
		close(start)
		s.Close()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: writers still blocked 20s after Close", round)
		}
		committed += int(ok.Load())
	}
	s := openAt(t, path)
	if n := len(ledger(t, s, store.LedgerFilter{})); n != committed {
		t.Errorf("%d entries in the file, %d writes reported committed", n, committed)
	}
	if _, err := s.Record(ctx, store.Account{UserID: "u1", ServiceID: "svc", Free: true}, store.LedgerEntry{Time: t0}, okResponse); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := s.Record(ctx, store.Account{UserID: "u1", ServiceID: "svc", Free: true}, store.LedgerEntry{Time: t0}, okResponse); !errors.Is(err, ErrClosed) {
		t.Errorf("Record after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}
