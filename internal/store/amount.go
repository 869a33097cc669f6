package store

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/platformgw/gateway/internal/billing"
)

// Amount is a quantity as the stores write it: the same decimal text as
// billing.Units, read back over the whole signed int64 range.
//
// billing.Units refuses negatives and anything past MaxUnits when it reads
// JSON, rightly for the wire, but stored figures legitimately go there: a
// prepaid balance overdrawn by a report or by AddCredits, a period's usage
// summed from many large reports, a cost that saturated. Read through
// billing.Units, such a record failed to decode, and with it every later
// call for that subscription, every ledger export, or Open itself (held
// reservations are read back at start).
type Amount billing.Units

// MarshalJSON writes the quantity as billing.Units does.
func (a Amount) MarshalJSON() ([]byte, error) { return billing.Units(a).MarshalJSON() }

// UnmarshalJSON reads what MarshalJSON wrote, negative or past MaxUnits
// included; null leaves the value as it was.
func (a *Amount) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	whole, frac, _ := strings.Cut(s, ".")
	w, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || len(frac) > 6 {
		return fmt.Errorf("stored quantity %q: %w", b, billing.ErrInvalidUnits)
	}
	var f uint64
	if frac != "" {
		if f, err = strconv.ParseUint(frac+strings.Repeat("0", 6-len(frac)), 10, 64); err != nil {
			return fmt.Errorf("stored quantity %q: %w", b, billing.ErrInvalidUnits)
		}
	}
	limit := uint64(math.MaxInt64)
	if neg {
		limit++ // math.MinInt64
	}
	if w > (limit-f)/uint64(billing.Scale) {
		return fmt.Errorf("stored quantity %q out of range: %w", b, billing.ErrInvalidUnits)
	}
	m := w*uint64(billing.Scale) + f
	if neg {
		*a = Amount(-int64(m)) // m == 1<<63 wraps to math.MinInt64, as wanted
	} else {
		*a = Amount(m)
	}
	return nil
}
