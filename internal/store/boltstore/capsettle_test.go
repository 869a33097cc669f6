package boltstore

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// capped is the attack run's product: 20 requests included, then 0.5 each
// up to a spending cap of 15, so 50 requests in all.
var capped = billing.Product{ID: "capped", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
	Quota: ptr(whole(20)), Overage: "allow", Price: 500_000, SpendingCap: ptr(whole(15))}

// TestSpendingCapHoldsSettledOutOfOrder: 50 holds take the quota and the
// cap; the hold taken last (priced overage) settles first, inside the
// quota, for nothing. The 30 holds still in flight will cost the whole cap
// together, so one more call must be refused. Counting the holds' own
// costs, the cap had 0.5 left and let it through, and the call settling
// last was cut to 0 units: served free.
func TestSpendingCapHoldsSettledOutOfOrder(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", capped, 0)
	var held []store.Reservation
	for i := range 50 {
		res, err := s.Reserve(ctx, a, whole(1), t0)
		dec := res.Decision
		if err != nil || !dec.Allowed {
			t.Fatalf("hold %d: %v %+v", i, err, dec)
		}
		held = append(held, res)
	}
	if _, err := s.Settle(ctx, held[49], whole(1), entryFor(a, 0, t0)); err != nil {
		t.Fatal(err)
	}
	held = held[:49]
	if res, err := s.Reserve(ctx, a, whole(1), t0); err != nil || res.Decision.Allowed || res.Decision.Code != billing.CodeQuotaExceeded {
		t.Fatalf("a 51st call: %v %+v, want it refused by the cap", err, res.Decision)
	}
	if st := stateOf(t, s, a, t0); st.ReservedSpend != whole(15) {
		t.Errorf("spend held %s for 49 calls on 1 used, want 15", st.ReservedSpend)
	}
	for i := len(held) - 1; i >= 0; i-- { // the overage holds first again
		if _, err := s.Settle(ctx, held[i], whole(1), entryFor(a, 0, t0)); err != nil {
			t.Fatal(err)
		}
	}
	checkCapLedger(t, s, a, 50)
}

// TestSpendingCapRaceNeverOverServes: 300 callers × 3 rounds race for what
// is left of the attack run's cap, from zero and from several points of
// it; each caller settles its hold after a random number of yields, so
// holds settle in every order while others are taken. Exactly as many
// calls are allowed as the quota and cap leave, every one is charged in
// full (no ledger row cut below its claim), and the spend ends at the cap.
func TestSpendingCapRaceNeverOverServes(t *testing.T) {
	const callers, rounds = 300, 3
	for _, used := range []int64{0, 1, 10, 19, 20, 21, 35, 48, 50} {
		t.Run(fmt.Sprintf("from %d used", used), func(t *testing.T) {
			s := openTemp(t)
			a := subscribe(t, s, "u1", "svc", capped, 0)
			if used > 0 {
				if _, err := s.Record(ctx, a, entryFor(a, whole(used), t0), okResponse); err != nil {
					t.Fatal(err)
				}
			}
			var allowed, refused, failed atomic.Int64
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					for r := range rounds {
						res, err := s.Reserve(ctx, a, whole(1), t0)
						dec := res.Decision
						switch {
						case err != nil:
							failed.Add(1)
							continue
						case !dec.Allowed:
							if dec.Code != billing.CodeQuotaExceeded {
								failed.Add(1)
							}
							refused.Add(1)
							continue
						}
						allowed.Add(1)
						for range (i*7 + r*13) % 11 {
							runtime.Gosched()
						}
						if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if failed.Load() != 0 {
				t.Fatalf("%d reservations or settlements failed", failed.Load())
			}
			if want := 50 - used; allowed.Load() != want {
				t.Errorf("%d calls allowed, %d refused; want %d allowed", allowed.Load(), refused.Load(), want)
			}
			checkCapLedger(t, s, a, 50)
		})
	}
}

// checkCapLedger: the period ends with used units, every one charged, the
// spend exactly the overage's price, nothing held.
func checkCapLedger(t *testing.T, s *Store, a store.Account, used int64) {
	t.Helper()
	st := stateOf(t, s, a, t0)
	entries := ledger(t, s, store.LedgerFilter{})
	units, cost := sumUnits(entries)
	for _, e := range entries {
		if e.UnitsClaimed > e.Units {
			t.Errorf("ledger row %s charged %s of %s units claimed: a call served (partly) free", e.ID, e.Units, e.UnitsClaimed)
		}
	}
	want := billing.Mul(whole(used)-*capped.Quota, capped.Price)
	if st.Used != whole(used) || units != whole(used) || st.Spend != want || cost != want {
		t.Errorf("used %s, ledger %s units cost %s, spend %s; want %d units costing %s", st.Used, units, cost, st.Spend, used, want)
	}
	if st.Reserved != 0 || st.ReservedSpend != 0 {
		t.Errorf("holds left: %+v", st)
	}
}
