package storetest

import (
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testHoldKeptPastOutsideCharges: a call (or an async job) holds 3 units,
// then something that is no call takes the room its hold promised: a
// usage report charged past the hard limit (reports are), or, on a
// prepaid balance, a negative correction as a refund or a lost dispute
// makes it. The call was served on its hold, so it is charged at least
// what it held (docs/wire-contract.md, "Claims past a hard limit", rule
// 2: no served call is ever recorded with 0 units), taking the quota,
// the cap or the balance past its limit as the report did; a claim past
// the hold is cut as far as the limits allow, with the claim recorded. Before the fix both
// stores' Settle charged such a call FitCharge of the room left: 0
// units, `unitsClaimed 3`, served free.
func testHoldKeptPastOutsideCharges(t *testing.T, c *suite) {
	hold := whole(3)
	takers := []struct {
		name string
		take func(t *testing.T, s store.Store, a store.Account)
	}{
		{"report past the limit", func(t *testing.T, s store.Store, a store.Account) {
			if _, err := s.Record(ctx, a, EntryFor(a, whole(60), T0), OKResponse); err != nil {
				t.Fatalf("Record: %v", err)
			}
		}},
		{"credits taken back", func(t *testing.T, s store.Store, a store.Account) {
			if a.Product.BillingModel != billing.Prepaid {
				t.Skip("a balance only")
			}
			if _, err := s.AddCredits(ctx, a.UserID, a.ServiceID, -whole(100), T0); err != nil {
				t.Fatalf("AddCredits: %v", err)
			}
		}},
	}
	for _, lim := range overClaimLimits {
		for _, tk := range takers {
			for _, claim := range []billing.Units{hold, whole(5), whole(1)} {
				want := min(claim, hold)
				t.Run(lim.name+", "+tk.name+", call claims "+claim.String(), func(t *testing.T) {
					s := c.store(t)
					a := subscribe(t, s, "u1", "svc", lim.p, lim.credits)
					res, err := s.Reserve(ctx, a, hold, T0)
					if err != nil || !res.Decision.Allowed {
						t.Fatalf("hold: %v %+v", err, res.Decision)
					}
					tk.take(t, s, a)
					e := EntryFor(a, 0, T0)
					e.Source = store.SourceGateway
					out, err := s.Settle(ctx, res, claim, e)
					if err != nil {
						t.Fatalf("Settle: %v", err)
					}
					if !floorKept(out, claim, want) {
						t.Errorf("the call that held %s and claimed %s was charged %s (claimed %s); want at least %s charged",
							hold, claim, out.Units, out.UnitsClaimed, want)
					}
					checkHoldFloor(t, c, s, a)
					checkHoldFloorKept(t, c, s, a)
				})
				t.Run(lim.name+", "+tk.name+", job completes "+claim.String(), func(t *testing.T) {
					s := c.store(t)
					a := subscribe(t, s, "u1", "svc", lim.p, lim.credits)
					reserveJob(t, s, "job", a, hold)
					tk.take(t, s, a)
					j, err := s.CompleteJob(ctx, "job", a, completion(a, "job", claim), complete(store.JobCompleted, "d"))
					if err != nil {
						t.Fatalf("CompleteJob: %v", err)
					}
					for _, e := range Ledger(t, s, store.LedgerFilter{}) {
						if e.Source == store.SourceCompletion && (!floorKept(e, claim, want) || e.Units != j.Units) {
							t.Errorf("the job that held %s and stated %s was charged %s, its row %s (claimed %s); want at least %s charged",
								hold, claim, j.Units, e.Units, e.UnitsClaimed, want)
						}
					}
					checkHoldFloor(t, c, s, a)
					checkHoldFloorKept(t, c, s, a)
				})
			}
		}
	}
}

// checkHoldFloorKept: a restart (the embedded store replays its
// settlement log) reads the floored charge back as it was written: the
// same counters and the same ledger rows, unitsClaimed included.
func checkHoldFloorKept(t *testing.T, c *suite, s store.Store, a store.Account) {
	t.Helper()
	if c.reopen == nil {
		return
	}
	before, rows := c.state(t, s, a, T0), Ledger(t, s, store.LedgerFilter{})
	s = c.restart(t, s)
	after, again := c.state(t, s, a, T0), Ledger(t, s, store.LedgerFilter{})
	if after.Used != before.Used || after.Spend != before.Spend || after.Credits != before.Credits {
		t.Errorf("after a restart the counters are %+v; before it %+v", after, before)
	}
	if len(again) != len(rows) {
		t.Fatalf("after a restart %d ledger rows; before it %d", len(again), len(rows))
	}
	for i := range rows {
		x, y := rows[i], again[i]
		if x.ID != y.ID || x.Units != y.Units || x.UnitsClaimed != y.UnitsClaimed || x.Cost != y.Cost || x.Overage != y.Overage {
			t.Errorf("ledger row %d after a restart %+v; before it %+v", i, y, x)
		}
	}
	checkHoldFloor(t, c, s, a)
}

// floorKept: e is charged at least want and at most the claim, and
// records the claim when it is charged less. (A fleet node may charge a
// claim past its hold from the free units of its lease, taken before the
// report: docs/fleet.md.)
func floorKept(e store.LedgerEntry, claim, want billing.Units) bool {
	if e.Units < want || e.Units > claim {
		return false
	}
	if e.Units < claim {
		return e.UnitsClaimed == claim
	}
	return e.UnitsClaimed == 0
}

// checkHoldFloor: the counters equal the ledger, and nothing is held.
func checkHoldFloor(t *testing.T, c *suite, s store.Store, a store.Account) {
	t.Helper()
	units, cost := SumUnits(Ledger(t, s, store.LedgerFilter{}))
	st := c.state(t, s, a, T0)
	if st.Used != units || st.Spend != cost {
		t.Errorf("counters used %s spend %s, ledger %s units costing %s", st.Used, st.Spend, units, cost)
	}
	if st.Reserved != 0 || st.ReservedSpend != 0 || st.CreditsHeld != 0 {
		t.Errorf("holds left: %+v", st)
	}
}
