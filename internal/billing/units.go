// Package billing holds the pure arithmetic of the gateway: exact decimal
// units, billing periods, and the decision whether a subscription may consume
// some units, with the breakdown shown to backends and callers. It knows
// nothing of HTTP, Caddy or the store, so the gateway, the usage service, the
// estimate routes and the SDK all share one implementation.
package billing

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Units is an exact decimal quantity (units of service, credits or money)
// stored as an integer count of millionths, so sums never drift the way
// float sums do.
type Units int64

// Scale is the number of Units in one whole unit.
const Scale Units = 1_000_000

// MaxUnits is the largest quantity accepted from configuration or the wire:
// a trillion whole units, far beyond any real bill, and small enough that
// sums of many of them cannot overflow int64.
const MaxUnits Units = 1_000_000_000_000 * Scale

// Whole returns n whole units.
func Whole(n int64) Units { return Units(n) * Scale }

// ErrInvalidUnits is wrapped by every parse failure.
var ErrInvalidUnits = errors.New("invalid decimal quantity")

// ParseUnits parses a non-negative decimal such as "12", "0.5" or "1e3" with
// at most six fractional digits. It never goes through float64, so "0.1" is
// exactly 100000 millionths.
func ParseUnits(s string) (Units, error) {
	orig := s
	if s == "" {
		return 0, fmt.Errorf("%w: empty", ErrInvalidUnits)
	}
	if s[0] == '+' {
		s = s[1:]
	}
	exp := 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(s[i+1:])
		if err != nil || e > 30 || e < -30 {
			return 0, fmt.Errorf("%w: %q", ErrInvalidUnits, orig)
		}
		exp = e
		s = s[:i]
	}
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" && frac == "" || hasDot && frac == "" && intPart == "" {
		return 0, fmt.Errorf("%w: %q", ErrInvalidUnits, orig)
	}
	digits := intPart + frac
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: %q", ErrInvalidUnits, orig)
		}
	}
	// value = digits * 10^(exp - len(frac)); we want value * 10^6.
	shift := exp - len(frac) + 6
	digits = strings.TrimLeft(digits, "0")
	if shift < 0 {
		cut := -shift
		if cut >= len(digits) {
			if strings.Trim(digits, "0") != "" {
				return 0, fmt.Errorf("%w: %q has more than 6 decimal places", ErrInvalidUnits, orig)
			}
			return 0, nil
		}
		if strings.Trim(digits[len(digits)-cut:], "0") != "" {
			return 0, fmt.Errorf("%w: %q has more than 6 decimal places", ErrInvalidUnits, orig)
		}
		digits = digits[:len(digits)-cut]
		shift = 0
	}
	v, ok := magnitude(digits, shift, uint64(MaxUnits))
	if !ok {
		return 0, fmt.Errorf("%w: %q is too large", ErrInvalidUnits, orig)
	}
	return Units(v), nil
}

// ParseStoredUnits reads a quantity as String writes it ("-12.5", "3"),
// over the whole signed int64 range: what the stores read back.
//
// ParseUnits refuses negatives and anything past MaxUnits, rightly for
// configuration and the wire, but stored figures legitimately go there: a
// prepaid balance overdrawn by a report, a period's usage summed from many
// large reports, a cost that saturated. It takes only String's form: an
// optional minus, whole digits, and at most six fractional digits after
// a dot; no plus, no exponent.
func ParseStoredUnits(s string) (Units, error) {
	orig := s
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(frac) > 6 || !allDigits(whole) || !allDigits(frac) {
		return 0, fmt.Errorf("%w: %q", ErrInvalidUnits, orig)
	}
	limit := uint64(math.MaxInt64)
	if neg {
		limit++ // math.MinInt64
	}
	m, ok := magnitude(strings.TrimLeft(whole+frac, "0"), 6-len(frac), limit)
	if !ok {
		return 0, fmt.Errorf("%w: %q is out of range", ErrInvalidUnits, orig)
	}
	if neg {
		return Units(-int64(m)), nil // m == 1<<63 wraps to math.MinInt64, as wanted
	}
	return Units(m), nil
}

// magnitude is digits followed by shift zeros, as a number no larger than
// limit; digits has no leading zeros. Both parsers end here, so a decimal
// text means the same number of millionths wherever it is read.
func magnitude(digits string, shift int, limit uint64) (uint64, bool) {
	if digits == "" {
		return 0, true
	}
	if len(digits)+shift > 19 { // past uint64, whatever the digits
		return 0, false
	}
	v, err := strconv.ParseUint(digits+strings.Repeat("0", shift), 10, 64)
	return v, err == nil && v <= limit
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// String renders the quantity as a plain decimal with no trailing zeros:
// 1500000 is "1.5", 2000000 is "2".
func (u Units) String() string {
	neg := u < 0
	var v uint64
	if neg {
		v = uint64(-u)
	} else {
		v = uint64(u)
	}
	whole := v / uint64(Scale)
	frac := v % uint64(Scale)
	s := strconv.FormatUint(whole, 10)
	if frac != 0 {
		f := strconv.FormatUint(frac+uint64(Scale), 10)[1:]
		s += "." + strings.TrimRight(f, "0")
	}
	if neg {
		s = "-" + s
	}
	return s
}

// Grouped renders the quantity as String does, its whole part with
// thousands separators ("10,000", "1,234.5"): how the console's limit
// bars and the storefront's plans write counts a reader compares at a
// glance.
func (u Units) Grouped() string {
	whole, frac, hasFrac := strings.Cut(u.String(), ".")
	sign := ""
	if strings.HasPrefix(whole, "-") {
		sign, whole = "-", whole[1:]
	}
	var b strings.Builder
	for i, d := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	if hasFrac {
		return sign + b.String() + "." + frac
	}
	return sign + b.String()
}

// MarshalJSON writes the quantity as a JSON number with its exact decimal
// text, never a float rendering.
func (u Units) MarshalJSON() ([]byte, error) { return []byte(u.String()), nil }

// UnmarshalJSON accepts a JSON number or a string holding one.
func (u *Units) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		// encoding/json's convention: null leaves the value as it was
		// (it would otherwise fail as "invalid decimal quantity", so an
		// optional field sent as null broke the whole document).
		return nil
	}
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	v, err := ParseUnits(s)
	if err != nil {
		return err
	}
	*u = v
	return nil
}

// SatAdd is a + b, saturated at the int64 bounds instead of wrapping:
// sums of counters, rollups and shown totals, whose parts may each be
// saturated already (a rollup of reports past MaxUnits).
func SatAdd(a, b Units) Units {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		if b > 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return s
}

// Mul returns u*price rounded half up to a millionth, saturating at
// math.MaxInt64: the cost of u units at price credits per unit.
func Mul(u, price Units) Units {
	if u <= 0 || price <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(u), uint64(price))
	lo, carry := bits.Add64(lo, uint64(Scale)/2, 0)
	hi += carry
	if hi >= uint64(Scale) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(Scale))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return Units(q)
}

// Div returns how many units (rounded down to a millionth) budget credits buy
// at price credits per unit; with a zero price any number is affordable.
func Div(budget, price Units) Units {
	if budget <= 0 {
		return 0
	}
	if price <= 0 {
		return math.MaxInt64
	}
	hi, lo := bits.Mul64(uint64(budget), uint64(Scale))
	if hi >= uint64(price) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(price))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return Units(q)
}
