package billing_test

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

// TestBreakdownReadsWhatItWrites: every breakdown the gateway writes reads
// back as it was, the figures input may never have included: an
// overdrawn balance, usage past MaxUnits, the floor and the ceiling.
// Units' own decoder refused them, so an SDK could not read an
// insufficient_credits estimate or an overdrawing report's answer.
func TestBreakdownReadsWhatItWrites(t *testing.T) {
	for _, b := range []billing.Breakdown{
		{UnitsUsed: whole(3), TotalUnitsUsedThisCycle: whole(3), IsOverLimit: true, RemainingCredits: ptr(-whole(5))},
		{UnitsUsed: whole(1), TotalUnitsUsedThisCycle: 2 * billing.MaxUnits, UnitsRemaining: ptr(0), IsOverage: true, IsOverageAllowed: true,
			RemainingSpendingCap: ptr(whole(7) + 5)},
		{RemainingCredits: ptr(math.MinInt64), TotalUnitsUsedThisCycle: math.MaxInt64},
		{},
	} {
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		var back billing.Breakdown
		if err := json.Unmarshal(raw, &back); err != nil {
			t.Errorf("%s does not read back: %v", raw, err)
			continue
		}
		if !sameBreakdown(back, b) {
			t.Errorf("%s read back as %s", raw, showBreakdown(back))
		}
	}
	// As the SDK's tests and other servers write them: strings, exponents,
	// nulls for the fields that may be absent.
	var b billing.Breakdown
	if err := json.Unmarshal([]byte(`{"unitsUsed":"2.5","totalUnitsUsedThisCycle":1e3,"remainingCredits":null,"isOverage":true}`), &b); err != nil ||
		b.UnitsUsed != 2_500_000 || b.TotalUnitsUsedThisCycle != whole(1000) || b.RemainingCredits != nil || !b.IsOverage {
		t.Errorf("read %+v, %v", b, err)
	}
	for _, bad := range []string{`{"unitsUsed":"x"}`, `{"remainingCredits":1.0000001}`, `{"unitsUsed":true}`, `[]`} {
		if err := json.Unmarshal([]byte(bad), &b); err == nil {
			t.Errorf("%s read without an error", bad)
		}
	}
}
