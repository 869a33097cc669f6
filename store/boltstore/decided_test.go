package boltstore

import (
	"errors"
	"sync"
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
