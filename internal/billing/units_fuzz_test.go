package billing

import (
	"math/big"
	"testing"
)

// FuzzParseUnits: every quantity a backend or an operator sends goes
// through ParseUnits. What it accepts is exactly the decimal's value in
// millionths (checked with math/big, never float64), within [0, MaxUnits],
// and survives a round trip through String and JSON.
func FuzzParseUnits(f *testing.F) {
	for _, s := range []string{
		"0", "1", "0.5", "12.000001", "1e3", "1E-6", "+2", "1.", ".5", "-1", "NaN", "Infinity",
		"1e400", "0.0000001", "1000000000000", "1000000000000.000001", "9223372036854775807",
		"00000000000000000000001", "1e30", "1e-30", "0e99", "1_000", "0x10", " 1", "",
	} {
		f.Add(s)
	}
	million := big.NewRat(int64(Scale), 1)
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseUnits(s)
		if err != nil {
			return
		}
		if u < 0 || u > MaxUnits {
			t.Fatalf("%q accepted as %d", s, u)
		}
		r, ok := new(big.Rat).SetString(s)
		if !ok {
			t.Fatalf("%q accepted as %s but is not a decimal", s, u)
		}
		r.Mul(r, million)
		if !r.IsInt() || r.Num().Int64() != int64(u) || !r.Num().IsInt64() {
			t.Fatalf("%q accepted as %d millionths, exactly %s", s, u, r.RatString())
		}
		back, err := ParseUnits(u.String())
		if err != nil || back != u {
			t.Fatalf("%q → %s → %d, %v", s, u, back, err)
		}
		var j Units
		b, _ := u.MarshalJSON()
		if err := j.UnmarshalJSON(b); err != nil || j != u {
			t.Fatalf("JSON %s → %d, %v", b, j, err)
		}
	})
}
