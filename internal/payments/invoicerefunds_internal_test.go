package payments

import "testing"

// TestMoneyBackSumsChargesOnce: what went back of an invoice is the sum
// over its charges (and lost disputes), each charge's refunds counted
// once however often told; a record written before the amounts were kept
// per charge is never taken lower than what it said.
func TestMoneyBackSumsChargesOnce(t *testing.T) {
	r := InvoiceRecord{AmountPaid: 2900}
	for _, step := range []struct {
		charge             string
		refunded, disputed int64
		changed            bool
		wantRef, wantDis   int64
	}{
		{"ch_a", 1000, 0, true, 1000, 0},
		{"ch_b", 400, 0, true, 1400, 0},
		{"ch_a", 1000, 0, false, 1400, 0}, // told again
		{"ch_a", 600, 0, false, 1400, 0},  // an older event, late
		{"ch_b", 500, 0, true, 1500, 0},
		{"dp_a", 0, 2000, true, 1500, 2000},
		{"dp_b", 0, 2000, true, 1500, 2900}, // at most what was paid
	} {
		if got := moneyBack(&r, step.charge, step.refunded, step.disputed); got != step.changed || r.Refunded != step.wantRef || r.Disputed != step.wantDis {
			t.Fatalf("%+v: changed %v, refunded %d, disputed %d", step, got, r.Refunded, r.Disputed)
		}
	}
	// A record from before: 1000 went back of a charge it does not name.
	old := InvoiceRecord{AmountPaid: 2900, Refunded: 1000}
	if !moneyBack(&old, "ch_b", 400, 0) || old.Refunded != 1000 || old.RefundedBefore != 1000 {
		t.Fatalf("a smaller charge's refunds over an old record: %+v, want 1000 kept", old)
	}
	if !moneyBack(&old, "ch_a", 1000, 0) || old.Refunded != 1400 {
		t.Fatalf("the old record's charge named again: %+v, want 1400", old)
	}
	// Refunded while nothing was paid yet (the first charge failed), then
	// paid: summed again against what was paid, once.
	open := InvoiceRecord{}
	if !moneyBack(&open, "ch_retry", 1000, 0) || open.Refunded != 0 || open.RefundedBy["ch_retry"] != 1000 {
		t.Fatalf("a refund of an invoice not paid yet: %+v, want 1000 kept for ch_retry, 0 refunded", open)
	}
	open.AmountPaid = 2900
	if !sumMoneyBack(&open) || open.Refunded != 1000 {
		t.Fatalf("the invoice paid: %+v, want 1000 refunded", open)
	}
	if sumMoneyBack(&open) || open.Refunded != 1000 {
		t.Fatalf("summed again: %+v, want nothing grown", open)
	}
}
