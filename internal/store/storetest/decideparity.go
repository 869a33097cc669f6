package storetest

import (
	"fmt"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testReserveAsDecide: a store allows a hold exactly when billing.Decide
// allows it on the state the store shows, and refuses it with Decide's
// code, for every billing model and limit around its boundaries: below,
// at and past a quota, a balance below zero, at zero and above, and holds
// of nothing (an endpoint of cost 0), of a millionth whose price rounds
// to nothing, and of whole units. PostgreSQL's leases read a grant of
// nothing as a refusal ("quota for this period is used up": every call
// of a PREPAID product of price 0, a cost-0 call near any limit), refused
// a cost-0 call past a quota or cap a report had overdrawn, and named the
// cap before the balance.
func testReserveAsDecide(t *testing.T, c *suite) {
	s := c.store(t)
	products := []billing.Product{
		quotaBlock, quotaAllow, unlimited, prepaid, postpaid, instant, prepaidWhole,
		{ID: "pq", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, Price: 250_000, Quota: ptr(whole(10))},
		{ID: "pqa", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, Price: 250_000, Quota: ptr(whole(10)), Overage: "allow"},
		{ID: "pcap", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, Price: whole(1), SpendingCap: ptr(whole(5))},
		{ID: "p0", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken},
		{ID: "p0q", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, Quota: ptr(whole(10))},
		{ID: "uq", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken, Price: 10_000, Quota: ptr(whole(10))},
		{ID: "uqa", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken, Price: whole(1), Quota: ptr(whole(10)), Overage: "allow", SpendingCap: ptr(whole(12))},
		{ID: "scap0", BillingModel: billing.Subscription, MeasurementType: billing.PerToken, Quota: ptr(whole(10)), Overage: "allow", SpendingCap: ptr(whole(1))},
		{ID: "ucap0", BillingModel: billing.UsageInstant, MeasurementType: billing.PerToken, SpendingCap: ptr(whole(0))},
		{ID: "scapz", BillingModel: billing.Subscription, MeasurementType: billing.PerToken, Quota: ptr(whole(10)), Overage: "allow", Price: whole(1), SpendingCap: ptr(whole(0))},
		{ID: "qz", BillingModel: billing.Subscription, MeasurementType: billing.PerToken, Quota: ptr(whole(0))},
	}
	n := 0
	for _, p := range products {
		for _, credits := range []billing.Units{-whole(2), 0, whole(3)} {
			for _, used := range []billing.Units{0, whole(9), whole(10), whole(11)} {
				for _, units := range []billing.Units{0, 1, whole(1), whole(5)} {
					n++
					user := fmt.Sprintf("u%d", n)
					a := subscribe(t, s, user, "svc", p, 0)
					if credits != 0 {
						if _, err := s.AddCredits(ctx, user, "svc", credits, T0); err != nil {
							t.Fatal(err)
						}
					}
					if used > 0 {
						if _, err := s.Record(ctx, a, EntryFor(a, used, T0), OKResponse); err != nil {
							t.Fatal(err)
						}
					}
					st := c.state(t, s, a, T0)
					want := billing.Decide(p, st, units)
					res, err := s.Reserve(ctx, a, units, T0)
					if err != nil {
						t.Fatal(err)
					}
					if res.Decision.Allowed != want.Allowed || (!want.Allowed && res.Decision.Code != want.Code) {
						t.Errorf("%s credits %s used %s units %s: store %v %s, Decide %v %s (state %+v)", p.ID, credits, used, units,
							res.Decision.Allowed, res.Decision.Code, want.Allowed, want.Code, st)
					}
					if res.Decision.Allowed {
						if _, err := s.Settle(ctx, res, 0, store.LedgerEntry{Time: T0, UserID: user, ServiceID: "svc", ProductID: p.ID}); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		}
	}
}
