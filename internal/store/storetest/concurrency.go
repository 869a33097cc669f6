package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testHardLimitsUnderConcurrency: 200 calls race for 57 units' worth of
// quota, credits or spending cap; exactly 57 get through, and once all are
// settled the counter and the ledger agree on 57.
func testHardLimitsUnderConcurrency(t *testing.T, c *suite) {
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
			s := c.store(t)
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
					res, err := s.Reserve(ctx, a, whole(1), T0)
					dec := res.Decision
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
			if st := c.state(t, s, a, T0); st.Reserved != whole(limit) {
				t.Errorf("Reserved = %s, want %d", st.Reserved, limit)
			}
			for _, res := range held {
				wg.Go(func() {
					if _, err := s.Settle(ctx, res, whole(1), EntryFor(a, 0, T0)); err != nil {
						failures.Add(1)
					}
				})
			}
			wg.Wait()
			if failures.Load() != 0 {
				t.Fatalf("%d settlements failed", failures.Load())
			}
			st := c.state(t, s, a, T0)
			units, cost := SumUnits(Ledger(t, s, store.LedgerFilter{}))
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
			if res, _ := s.Reserve(ctx, a, whole(1), T0); res.Decision.Allowed {
				t.Errorf("one more unit allowed past the limit")
			}
		})
	}
}

// testRecordIdempotent: ten parallel reports with one idempotency key count
// once; every caller gets the first response's bytes.
func testRecordIdempotent(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	e := EntryFor(a, whole(3), T0)
	e.IdempotencyKey = "idem-1"
	const n = 10
	var (
		wg     sync.WaitGroup
		bodies [n][]byte
		errs   [n]error
	)
	for i := range n {
		wg.Go(func() { bodies[i], errs[i] = s.Record(ctx, a, e, OKResponse) })
	}
	wg.Wait()
	first, dups := 0, 0
	for i := range n {
		switch {
		case errs[i] == nil:
			first++
		case errors.Is(errs[i], store.ErrReplayed):
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
	entries := Ledger(t, s, store.LedgerFilter{})
	if len(entries) != 1 || c.state(t, s, a, T0).Used != whole(3) {
		t.Fatalf("ledger %+v, state %+v; want one entry of 3", entries, c.state(t, s, a, T0))
	}
	if entries[0].IdempotencyKey != "idem-1" || !bytes.Contains(bodies[0], []byte(entries[0].ID)) {
		t.Errorf("entry %+v, body %q", entries[0], bodies[0])
	}

	// The key is scoped per service: another service's report with the
	// same key counts.
	b := subscribe(t, s, "u1", "svc2", unlimited, 0)
	e2 := EntryFor(b, whole(3), T0)
	e2.IdempotencyKey = "idem-1"
	if _, err := s.Record(ctx, b, e2, OKResponse); err != nil {
		t.Errorf("same key, other service: %v", err)
	}
	// Without a key, every report counts.
	for range 2 {
		if _, err := s.Record(ctx, a, EntryFor(a, whole(1), T0), OKResponse); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.state(t, s, a, T0).Used; got != whole(5) {
		t.Errorf("Used = %s, want 5", got)
	}
}

// testPruneIdempotency: keys claimed before the cutoff are forgotten (a
// retry then counts again); later ones still answer as duplicates.
func testPruneIdempotency(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	record := func(key string, at time.Time) error {
		e := EntryFor(a, whole(1), at)
		e.IdempotencyKey = key
		_, err := s.Record(ctx, a, e, OKResponse)
		return err
	}
	for _, c := range []struct {
		key string
		at  time.Time
	}{{"old", T0.Add(-48 * time.Hour)}, {"older", T0.Add(-72 * time.Hour)}, {"new", T0.Add(-time.Hour)}} {
		if err := record(c.key, c.at); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.PruneIdempotency(ctx, T0.Add(-24*time.Hour))
	if err != nil || n != 2 {
		t.Fatalf("PruneIdempotency = %d, %v; want 2", n, err)
	}
	if n, err := s.PruneIdempotency(ctx, T0.Add(-24*time.Hour)); err != nil || n != 0 {
		t.Errorf("second PruneIdempotency = %d, %v; want 0", n, err)
	}
	if err := record("new", T0); !errors.Is(err, store.ErrReplayed) {
		t.Errorf("kept key: %v, want ErrReplayed", err)
	}
	if err := record("old", T0); err != nil {
		t.Errorf("pruned key: %v, want a fresh record", err)
	}
	if n := len(Ledger(t, s, store.LedgerFilter{})); n != 4 {
		t.Errorf("%d ledger entries, want 4", n)
	}
}

func testScanLedger(t *testing.T, c *suite) {
	s := c.store(t)
	accounts := []store.Account{
		subscribe(t, s, "u1", "svc1", unlimited, 0),
		subscribe(t, s, "u2", "svc1", unlimited, 0),
		subscribe(t, s, "u1", "svc2", unlimited, 0),
	}
	// Ten entries a second apart: i%3 picks the account.
	for i := range 10 {
		a := accounts[i%3]
		if _, err := s.Record(ctx, a, EntryFor(a, whole(int64(i+1)), T0.Add(time.Duration(i)*time.Second)), OKResponse); err != nil {
			t.Fatal(err)
		}
	}
	at := func(i int) time.Time { return T0.Add(time.Duration(i) * time.Second) }
	tests := []struct {
		name string
		f    store.LedgerFilter
		want []int // entries by index
	}{
		{"all", store.LedgerFilter{}, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"from is inclusive", store.LedgerFilter{From: at(3)}, []int{3, 4, 5, 6, 7, 8, 9}},
		{"to is exclusive", store.LedgerFilter{To: at(3)}, []int{0, 1, 2}},
		{"from and to", store.LedgerFilter{From: at(2), To: at(5)}, []int{2, 3, 4}},
		{"between entries", store.LedgerFilter{From: at(2).Add(time.Millisecond), To: at(5).Add(-time.Millisecond)}, []int{3, 4}},
		{"empty range", store.LedgerFilter{From: at(5), To: at(5)}, nil},
		{"after the last", store.LedgerFilter{From: at(10)}, nil},
		{"user", store.LedgerFilter{UserID: "u1"}, []int{0, 2, 3, 5, 6, 8, 9}},
		{"service", store.LedgerFilter{ServiceID: "svc1"}, []int{0, 1, 3, 4, 6, 7, 9}},
		{"user and service", store.LedgerFilter{UserID: "u1", ServiceID: "svc2"}, []int{2, 5, 8}},
		{"user, service and time", store.LedgerFilter{UserID: "u1", ServiceID: "svc1", From: at(1), To: at(9)}, []int{3, 6}},
		{"unknown user", store.LedgerFilter{UserID: "u3"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []int
			for _, e := range Ledger(t, s, tt.f) {
				got = append(got, int(e.Units/whole(1))-1)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("entries %v, want %v", got, tt.want)
			}
		})
	}

	// Scanning stops at fn's first error and returns it.
	stop := errors.New("stop")
	calls := 0
	err := s.ScanLedger(ctx, store.LedgerFilter{}, func(store.LedgerEntry) error {
		calls++
		if calls == 4 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 4 {
		t.Errorf("ScanLedger = %v after %d calls, want stop after 4", err, calls)
	}
}

// testCountersEqualLedger: calls of several subscriptions settle at once
// (sharing commits); each subscription's counter then equals its ledger
// entries, units and spend, and its balance its top-up less their cost.
func testCountersEqualLedger(t *testing.T, c *suite) {
	s := c.store(t)
	accounts := []store.Account{
		subscribe(t, s, "u-quota", "svc", billing.Product{ID: "q", BillingModel: billing.Subscription,
			MeasurementType: billing.PerRequest, Quota: ptr(whole(1000))}, 0),
		subscribe(t, s, "u-prepaid", "svc", billing.Product{ID: "p", BillingModel: billing.Prepaid,
			MeasurementType: billing.PerRequest, Price: whole(1)}, whole(1000)),
		subscribe(t, s, "u-capped", "svc", billing.Product{ID: "c", BillingModel: billing.UsageInstant,
			MeasurementType: billing.PerRequest, Price: whole(1), SpendingCap: ptr(whole(1000))}, 0),
		subscribe(t, s, "u-free", "svc", unlimited, 0),
	}
	const callers, each = 120, 5
	var wg sync.WaitGroup
	var failures atomic.Int32
	for i := range callers {
		a := accounts[i%len(accounts)]
		wg.Go(func() {
			for range each {
				res, err := s.Reserve(ctx, a, whole(1), T0)
				dec := res.Decision
				if err != nil || !dec.Allowed {
					failures.Add(1)
					return
				}
				if _, err := s.Settle(ctx, res, whole(1), store.LedgerEntry{Time: T0, UserID: a.UserID, ServiceID: a.ServiceID,
					ProductID: a.Product.ID, Source: store.SourceGateway}); err != nil {
					failures.Add(1)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d calls failed or were refused well within every limit", n)
	}
	want := whole(callers / int64(len(accounts)) * each)
	for _, a := range accounts {
		st := c.state(t, s, a, T0)
		units, cost := SumUnits(Ledger(t, s, store.LedgerFilter{UserID: a.UserID}))
		if st.Used != want || units != want || st.Spend != cost || st.Reserved != 0 {
			t.Errorf("%s: state %+v, ledger %s units %s cost; want %s used, as many in the ledger, nothing held", a.UserID, st, units, cost, want)
		}
		if a.Product.BillingModel == billing.Prepaid && st.Credits != whole(1000)-cost {
			t.Errorf("%s: balance %s after %s charged of 1000", a.UserID, st.Credits, cost)
		}
	}
}
