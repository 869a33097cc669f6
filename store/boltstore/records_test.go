package boltstore

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/platformgw/gateway/billing"
)

// TestAmountRoundTrip: every quantity the store writes reads back, over the
// whole signed range; nothing else is accepted.
func TestAmountRoundTrip(t *testing.T) {
	for _, v := range []billing.Units{0, 1, -1, 1_500_000, -1_500_000, billing.MaxUnits, 3 * billing.MaxUnits,
		-3 * billing.MaxUnits, math.MaxInt64, math.MinInt64, math.MinInt64 + 1} {
		raw, err := json.Marshal(amount(v))
		if err != nil {
			t.Fatal(err)
		}
		var back amount
		if err := json.Unmarshal(raw, &back); err != nil || billing.Units(back) != v {
			t.Errorf("%d → %s → %d, %v", int64(v), raw, int64(back), err)
		}
	}
	for _, bad := range []string{`""`, `"1"`, `-`, `1e3`, `.5`, `1.1234567`, `9223372036854.775808`, `-9223372036854.775809`,
		`99999999999999999999`, `+1`, `--1`, `1.-5`, `true`} {
		var a amount
		if err := json.Unmarshal([]byte(bad), &a); err == nil {
			t.Errorf("%s read as %d, want an error", bad, int64(a))
		}
	}
}
