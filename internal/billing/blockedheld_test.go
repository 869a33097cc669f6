package billing_test

import (
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

// TestBlockedQuotaHoldsHoldNoSpend: past a blocked SUBSCRIPTION quota
// nothing is priced (price), so the calls in flight hold no spend either,
// even once a usage report has taken the period past the quota: the
// spend held (the admin API's spendHeld, remainingSpendingCap) said the
// holds would cost what their settlements never charge.
func TestBlockedQuotaHoldsHoldNoSpend(t *testing.T) {
	p := billing.Product{ID: "qbp", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(whole(100)), Price: whole(1), SpendingCap: ptr(whole(1000))}
	s := billing.State{Used: whole(90)}
	call := billing.Decide(p, s, whole(10))
	if !call.Allowed || call.Cost != 0 {
		t.Fatalf("a call inside the quota: %+v, want allowed at no cost", call)
	}
	s.Hold(p, call)
	report := billing.Decide(p, s, whole(50)) // refused, recorded all the same
	if report.Cost != 0 {
		t.Fatalf("a report past the blocked quota costs %s, want 0", report.Cost)
	}
	s.Charge(p, report)
	if s.Spend != 0 || s.ReservedSpend != 0 {
		t.Fatalf("after the report: spend %s, spend held %s; want 0 and 0 (nothing past a blocked quota is priced)", s.Spend, s.ReservedSpend)
	}
	mine := s
	mine.Unhold(p, call)
	if settle := billing.DecideCharge(p, mine, whole(10)); settle.Cost != 0 {
		t.Fatalf("the held call's charge costs %s, want 0", settle.Cost)
	}
	if left := s.SpendingCapLeft(*p.SpendingCap); left != whole(1000) {
		t.Fatalf("remaining spending cap %s, want 1000 (nothing spent or to be spent)", left)
	}
}
