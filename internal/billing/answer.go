package billing

import (
	"encoding/json"
	"strings"
)

// ParseAnswerUnits reads an amount of an answer the gateway wrote, a JSON
// number or a string holding one. Answers describe a subscription as it
// stands, and their figures go where input never may: an overdrawn
// prepaid balance (the remainingCredits of every insufficient_credits
// estimate is below zero), a period's usage past MaxUnits, a cost that
// saturated. Units' own decoder refuses those, rightly for input, and an
// SDK reading the answer failed on them ("invalid decimal quantity").
func ParseAnswerUnits(raw []byte) (Units, error) {
	s := strings.TrimSpace(string(raw))
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	if u, err := ParseUnits(s); err == nil {
		return u, nil
	}
	return ParseStoredUnits(s)
}

// UnmarshalJSON reads a breakdown as the gateway writes it, its amounts by
// ParseAnswerUnits. An absent or null amount leaves the field as it was
// (a pointer field nil), as encoding/json does.
func (b *Breakdown) UnmarshalJSON(data []byte) error {
	var raw struct {
		UnitsUsed               json.RawMessage `json:"unitsUsed"`
		UnitsRemaining          json.RawMessage `json:"unitsRemaining"`
		TotalUnitsUsedThisCycle json.RawMessage `json:"totalUnitsUsedThisCycle"`
		IsOverLimit             *bool           `json:"isOverLimit"`
		IsOverage               *bool           `json:"isOverage"`
		IsOverageAllowed        *bool           `json:"isOverageAllowed"`
		RemainingCredits        json.RawMessage `json:"remainingCredits"`
		RemainingSpendingCap    json.RawMessage `json:"remainingSpendingCap"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	for _, f := range []struct {
		raw json.RawMessage
		to  *Units
	}{{raw.UnitsUsed, &b.UnitsUsed}, {raw.TotalUnitsUsedThisCycle, &b.TotalUnitsUsedThisCycle}} {
		if len(f.raw) == 0 || string(f.raw) == "null" {
			continue
		}
		u, err := ParseAnswerUnits(f.raw)
		if err != nil {
			return err
		}
		*f.to = u
	}
	for _, f := range []struct {
		raw json.RawMessage
		to  **Units
	}{{raw.UnitsRemaining, &b.UnitsRemaining}, {raw.RemainingCredits, &b.RemainingCredits}, {raw.RemainingSpendingCap, &b.RemainingSpendingCap}} {
		if len(f.raw) == 0 || string(f.raw) == "null" {
			continue
		}
		u, err := ParseAnswerUnits(f.raw)
		if err != nil {
			return err
		}
		*f.to = &u
	}
	for _, f := range []struct {
		from *bool
		to   *bool
	}{{raw.IsOverLimit, &b.IsOverLimit}, {raw.IsOverage, &b.IsOverage}, {raw.IsOverageAllowed, &b.IsOverageAllowed}} {
		if f.from != nil {
			*f.to = *f.from
		}
	}
	return nil
}
