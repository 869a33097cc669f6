package boltstore

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

// Reserve answers before its hold is durable, so a hold's number must stay
// unique even when the batch it first ran in fails and every write of it
// runs again: callers reserving alongside failing writes all hold distinct
// reservations, every one settles once, and nothing stays held.
func TestReserveAlongsideFailingWrites(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", billing.Product{ID: "q", BillingModel: billing.Subscription,
		MeasurementType: billing.PerRequest, Quota: ptr(whole(1000))}, 0)
	boom := errors.New("boom")
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		held = map[string]bool{}
	)
	for i := range 200 {
		wg.Go(func() {
			if i%5 == 0 {
				if err := s.update(func(*bolt.Tx) error { return boom }); !errors.Is(err, boom) {
					t.Errorf("failing write = %v", err)
				}
				return
			}
			res, dec, _, err := s.Reserve(ctx, a, whole(1), t0)
			if err != nil || !dec.Allowed {
				t.Errorf("Reserve: %+v, %v", dec, err)
				return
			}
			mu.Lock()
			if held[res.ID] {
				t.Errorf("reservation %s handed out twice", res.ID)
			}
			held[res.ID] = true
			mu.Unlock()
			if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
				t.Errorf("Settle(%s): %v", res.ID, err)
			}
		})
	}
	wg.Wait()
	st := stateOf(t, s, a, t0)
	if st.Reserved != 0 || st.Used != whole(160) {
		t.Errorf("after 160 settled calls: %+v", st)
	}
	if n := len(ledger(t, s, store.LedgerFilter{})); n != 160 {
		t.Errorf("%d ledger entries, want 160", n)
	}
}

// A hold is numbered past every hold of the previous run of the store, so a
// reservation from before a restart never names one made after it.
func TestReservationNumbersSurviveRestart(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	old, _, _, err := s.Reserve(ctx, a, whole(1), t0)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openAt(t, path)
	res, _, _, err := s.Reserve(ctx, a, whole(1), t0)
	if err != nil {
		t.Fatal(err)
	}
	if res.ID == old.ID {
		t.Fatalf("reservation %s numbered again after a restart", res.ID)
	}
	if _, err := s.Settle(ctx, old, whole(1), entryFor(a, 0, t0)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Settle of a hold released at restart = %v, want ErrNotFound", err)
	}
	if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
		t.Errorf("Settle: %v", err)
	}
}

// Holds decided while the previous commit is in flight see everything that
// commit and the holds decided before them did: callers that reserve and
// settle in a loop, with reports charging alongside, are allowed exactly
// the quota, and the counters end equal to the ledger.
func TestPredecidedHoldsKeepTheQuota(t *testing.T) {
	const quota, callers = 300, 64
	s := openTemp(t)
	p := billing.Product{ID: "q", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(whole(quota)), Overage: "block"}
	a := subscribe(t, s, "u1", "svc", p, 0)
	other := subscribe(t, s, "u2", "svc", p, 0) // a second account in the same batches
	var allowed, otherAllowed atomic.Int64
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			acct, count := a, &allowed
			if i%4 == 0 {
				acct, count = other, &otherAllowed
			}
			for {
				res, dec, _, err := s.Reserve(ctx, acct, whole(1), t0)
				if err != nil {
					t.Errorf("Reserve: %v", err)
					return
				}
				if !dec.Allowed {
					return
				}
				count.Add(1)
				if _, err := s.Settle(ctx, res, whole(1), entryFor(acct, 0, t0)); err != nil {
					t.Errorf("Settle(%s): %v", res.ID, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() != quota || otherAllowed.Load() != quota {
		t.Errorf("allowed %d and %d calls, want %d each", allowed.Load(), otherAllowed.Load(), quota)
	}
	for _, acct := range []store.Account{a, other} {
		st := stateOf(t, s, acct, t0)
		if st.Used != whole(quota) || st.Reserved != 0 {
			t.Errorf("%s: %+v, want Used %d, nothing held", acct.UserID, st, quota)
		}
		if u, _ := sumUnits(ledger(t, s, store.LedgerFilter{UserID: acct.UserID})); u != whole(quota) {
			t.Errorf("%s: ledger holds %s units, want %d", acct.UserID, u, quota)
		}
	}
	t.Logf("%d holds decided during a commit", s.predecided.Load())
	if s.predecided.Load() == 0 {
		t.Log("no hold was decided during a commit: the path went unexercised this run")
	}
}
