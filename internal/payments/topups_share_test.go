package payments

import (
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

// TestShare: the credits a part of the money bought, rounded down, the
// whole exactly at the whole, and no overflow at the largest amounts.
func TestShare(t *testing.T) {
	for _, c := range []struct {
		credits     billing.Units
		part, whole int64
		want        billing.Units
	}{
		{billing.Whole(100), 250, 1000, billing.Whole(25)},
		{billing.Whole(100), 100, 300, 33_333_333},
		{billing.Whole(100), 200, 300, 66_666_666},
		{billing.Whole(100), 300, 300, billing.Whole(100)},
		{billing.Whole(100), 400, 300, billing.Whole(100)},
		{billing.Whole(100), 0, 300, 0},
		{billing.Whole(100), -5, 300, 0},
		{billing.Whole(100), 5, 0, 0},
		{billing.MaxUnits, 99_999_998, 99_999_999, billing.MaxUnits - billing.MaxUnits/99_999_999 - 1},
	} {
		if got := share(c.credits, c.part, c.whole); got != c.want {
			t.Errorf("share(%s, %d, %d) = %d, want %d", c.credits, c.part, c.whole, got, c.want)
		}
	}
}

// TestMinorMoney: Stripe's minor units as money with its currency.
func TestMinorMoney(t *testing.T) {
	for _, c := range []struct {
		amount   int64
		currency string
		want     string
	}{
		{1000, "usd", "10.00 USD"},
		{1999, "eur", "19.99 EUR"},
		{500, "jpy", "500 JPY"},
		{1234, "kwd", "1.234 KWD"},
	} {
		if got := MinorMoney(c.amount, c.currency).String(); got != c.want {
			t.Errorf("MinorMoney(%d, %s) = %s, want %s", c.amount, c.currency, got, c.want)
		}
	}
}
