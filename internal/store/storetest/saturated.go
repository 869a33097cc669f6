package storetest

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testSaturatedCountersRefuse: reports are charged in full past the hard
// limits, so a period's usage and spend can reach the most a quantity
// holds (they saturate there) and a prepaid balance the least. A call
// or an async job then asking for a hold is refused as past the limit
// (no error), as Decide refuses it: a blocked quota whose usage saturated, a spending
// cap whose spend saturated, a balance at its floor while a call holds
// credits. The PostgreSQL store added those counters in bigint in its
// lease statement and failed the call with "bigint out of range" (the
// caller's 500) where the embedded store answers 429 or 403.
func testSaturatedCountersRefuse(t *testing.T, c *suite) {
	s := c.store(t)
	dear := billing.Product{ID: "dear-capped", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken,
		Price: whole(100), SpendingCap: ptr(whole(5))}
	quota := subscribe(t, s, "u-quota", "svc", quotaBlock, 0)
	capped := subscribe(t, s, "u-cap", "svc2", dear, 0)
	pre := subscribe(t, s, "u-pre", "svc3", prepaidWhole, whole(10))
	held, err := s.Reserve(ctx, pre, whole(2), T0)
	if err != nil || !held.Decision.Allowed {
		t.Fatalf("hold before the reports: %+v, %v", held.Decision, err)
	}
	for range 10 { // ten reports of the most one may state: past what a quantity holds
		for _, a := range []store.Account{quota, capped, pre} {
			if _, err := s.Record(ctx, a, EntryFor(a, billing.MaxUnits, T0), OKResponse); err != nil {
				t.Fatalf("report for %s: %v", a.UserID, err)
			}
		}
	}
	if st := c.state(t, s, quota, T0); st.Used != math.MaxInt64 {
		t.Errorf("usage %d, want saturated", st.Used)
	}
	if st := c.state(t, s, capped, T0); st.Spend != math.MaxInt64 {
		t.Errorf("spend %d, want saturated", st.Spend)
	}
	if st := c.state(t, s, pre, T0); st.Credits != math.MinInt64 {
		t.Errorf("balance %d, want the least a balance holds", st.Credits)
	}
	for _, a := range []store.Account{quota, capped, pre} {
		for _, units := range []billing.Units{0, 1, whole(1)} {
			res, err := s.Reserve(ctx, a, units, T0)
			if err != nil {
				t.Errorf("%s: a hold of %s past saturated counters: %v, want a refusal", a.UserID, units, err)
				continue
			}
			if units > 0 && res.Decision.Allowed {
				t.Errorf("%s: a hold of %s past saturated counters allowed", a.UserID, units)
			}
			if res.Decision.Allowed {
				if _, err := s.Settle(ctx, res, 0, EntryFor(a, 0, T0)); err != nil {
					t.Error(err)
				}
			}
		}
	}
	// An async job's hold is taken the same way.
	for i, a := range []store.Account{quota, capped, pre} {
		j := store.Job{ID: fmt.Sprintf("job-saturated-%d", i), UserID: a.UserID, ServiceID: a.ServiceID, EndpointID: "e",
			ProductID: a.Product.ID, Status: store.JobPending, CreatedAt: T0, UpdatedAt: T0, ExpiresAt: T0.Add(time.Hour)}
		res, err := s.CreateJobReserved(ctx, j, a, whole(1), T0)
		if err != nil || res.Decision.Allowed {
			t.Errorf("%s: a job past saturated counters: %+v, %v; want refused", a.UserID, res.Decision, err)
		}
	}
	if _, err := s.Settle(ctx, held, whole(2), EntryFor(pre, 0, T0)); err != nil {
		t.Errorf("settling the hold taken before: %v", err)
	}
}
