package storetest

import "testing"

// testBlockedQuotaHeldSpend: nothing past a blocked SUBSCRIPTION quota is
// priced, so a call in flight there holds no spend, even once a usage
// report has taken the period past the quota; its settlement charges
// nothing, and the report neither.
func testBlockedQuotaHeldSpend(t *testing.T, c *suite) {
	s := c.store(t)
	p := quotaBlock
	p.ID, p.Price, p.SpendingCap = "quota-block-priced", whole(1), ptr(whole(1000))
	a := subscribe(t, s, "u1", "svc", p, 0)
	res, err := s.Reserve(ctx, a, whole(8), T0)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("Reserve inside the quota: %+v, %v", res.Decision, err)
	}
	if _, err := s.Record(ctx, a, EntryFor(a, whole(20), T0), OKResponse); err != nil {
		t.Fatalf("a report past the quota: %v", err)
	}
	st, err := s.State(ctx, a, T0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Used != whole(20) || st.Spend != 0 || st.ReservedSpend != 0 {
		t.Fatalf("after a report past the blocked quota, a call in flight: used %s, spend %s, spend held %s; want 20, 0, 0",
			st.Used, st.Spend, st.ReservedSpend)
	}
	if _, err := s.Settle(ctx, res, whole(8), EntryFor(a, whole(8), T0)); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if st, err := s.State(ctx, a, T0); err != nil || st.Spend != 0 || st.ReservedSpend != 0 {
		t.Fatalf("after its settlement: %+v, %v; want no spend", st, err)
	}
}
