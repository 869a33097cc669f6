package store

import (
	"fmt"

	"github.com/platformgw/gateway/internal/billing"
)

// Amount is a quantity as the stores write it: the same decimal text as
// billing.Units, read back over the whole signed int64 range
// (billing.ParseStoredUnits).
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
	v, err := billing.ParseStoredUnits(s)
	if err != nil {
		return fmt.Errorf("stored quantity: %w", err)
	}
	*a = Amount(v)
	return nil
}
