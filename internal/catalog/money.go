package catalog

import (
	"fmt"
	"strings"

	"github.com/platformgw/gateway/internal/billing"
)

// Money is an exact amount in one currency: what a product costs wherever
// it is shown or exported. The amount is billing.Units (millionths, never a
// float); the currency is an ISO 4217 code checked by CheckCurrency.
type Money struct {
	Amount   billing.Units
	Currency string
}

// String is the amount in the currency's minor units and the code, as
// "29.00 USD"; a price finer than the minor unit keeps its digits
// ("0.0025 USD"), since rounding a unit price would misstate every bill.
func (m Money) String() string { return FormatAmount(m.Amount, m.Currency) + " " + m.Currency }

// CheckCurrency checks an ISO 4217 currency code: three upper-case letters
// naming a currency in use (currencies.go). XXX (no currency), XTS
// (testing), the metals and withdrawn codes sell nothing.
func CheckCurrency(code string) error {
	if _, ok := currencies[code]; !ok {
		return fmt.Errorf("currency '%s' is not an ISO 4217 code of a currency in use, such as USD or EUR", code)
	}
	return nil
}

// MinorDigits is how many decimals the currency's amounts are written
// with: 2 for USD and EUR, 0 for JPY, 3 for KWD. An unknown code has 2.
func MinorDigits(code string) int {
	if d, ok := currencies[code]; ok {
		return d
	}
	return 2
}

// FormatAmount writes an amount of the currency as an exact decimal with
// at least the currency's minor digits: 29 USD is "29.00", 500 JPY is
// "500", 0.0025 USD is "0.0025". It never rounds.
func FormatAmount(amount billing.Units, code string) string {
	s := amount.String()
	want := MinorDigits(code)
	whole, frac, _ := strings.Cut(s, ".")
	if len(frac) >= want {
		return s
	}
	frac += strings.Repeat("0", want-len(frac))
	if frac == "" {
		return whole
	}
	return whole + "." + frac
}

// MinorUnits is the amount as a whole number of the currency's minor
// units, as payment providers take it (29.00 USD is 2900, 500 JPY is
// 500); false when the amount is finer than the minor unit (a unit price
// of 0.0025 USD), which must be billed summed, never rounded alone.
func (m Money) MinorUnits() (int64, bool) {
	return m.MinorUnitsOf(MinorDigits(m.Currency))
}

// MinorUnitsOf is MinorUnits for a count of minor digits of the caller's
// (a payment provider that counts a currency otherwise than ISO 4217).
func (m Money) MinorUnitsOf(digits int) (int64, bool) {
	if digits > 6 {
		return 0, false
	}
	per := int64(billing.Scale)
	for range digits {
		per /= 10
	}
	if int64(m.Amount)%per != 0 {
		return 0, false
	}
	return int64(m.Amount) / per, true
}
