package ops

import (
	"encoding/json"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

// FuzzParseSignedUnits: the credit amounts an operator posts. Whatever the
// JSON text, an accepted amount is a quantity within ±MaxUnits that reads
// back the same from its own rendering (so a top-up is never silently
// changed), and a refusal is an error, never a panic.
func FuzzParseSignedUnits(f *testing.F) {
	for _, s := range []string{`10`, `-2`, `"0.5"`, `"-0.000001"`, `1e3`, `--1`, `-+1`, `"-"`, `""`, `null`,
		`1e400`, `NaN`, `-9223372036854.775808`, `"1.0000001"`, `[1]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := parseSignedUnits(json.RawMessage(raw))
		if err != nil {
			return
		}
		if u > billing.MaxUnits || u < -billing.MaxUnits {
			t.Fatalf("%q accepted as %d", raw, u)
		}
		back, err := parseSignedUnits(json.RawMessage(u.String()))
		if err != nil || back != u {
			t.Fatalf("%q → %s → %d, %v", raw, u, back, err)
		}
	})
}
