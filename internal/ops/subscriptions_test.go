package ops

import (
	"encoding/json"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

func TestParseSignedUnits(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want billing.Units
		ok   bool
	}{
		{`10.5`, 10_500_000, true},
		{`"10.5"`, 10_500_000, true},
		{`-0.25`, -250_000, true},
		{`"-3"`, -3_000_000, true},
		{`1e2`, 100_000_000, true},
		{`0`, 0, true},
		{`-`, 0, false},
		{`--1`, 0, false},
		{`-+1`, 0, false},
		{`"abc"`, 0, false},
		{`0.0000001`, 0, false},
		{`true`, 0, false},
	} {
		got, err := parseSignedUnits(json.RawMessage(tt.in))
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseSignedUnits(%s) = %v, %v; want %v, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
