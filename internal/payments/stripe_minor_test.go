package payments

import (
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
)

// TestStripeMinorUnits: Stripe's minor units are not ISO 4217's for every
// currency. Stripe documents MGA as zero-decimal (5000 mga is 5000 MGA)
// while ISO gives it 2 digits, and keeps ISK two-decimal in its API ("an
// ISK amount of 100 represents 1 króna", whole kronur only) while ISO gives
// it 0. Reading them with ISO's digits recorded payments at 1/100 and 100
// times their worth, and `stripe sync` created Prices 100 times (MGA) or a
// hundredth (ISK) of the listing's.
func TestStripeMinorUnits(t *testing.T) {
	// Inbound: what a webhook's amount is worth (top-up records,
	// invoices, the console's revenue).
	for _, c := range []struct {
		amount   int64
		currency string
		want     string
	}{
		{5000, "mga", "5000.00 MGA"},
		{100000, "isk", "1000 ISK"},
		{1000, "usd", "10.00 USD"},
		{500, "jpy", "500 JPY"},
		{5120, "kwd", "5.120 KWD"},
		{2500, "UGX", "2500 UGX"},
	} {
		if got := MinorMoney(c.amount, c.currency).String(); got != c.want {
			t.Errorf("MinorMoney(%d, %s) = %s, want %s", c.amount, c.currency, got, c.want)
		}
	}
	// Outbound: the unit_amount `stripe sync` sends for a period price,
	// and back through MinorMoney to the same amount.
	for _, c := range []struct {
		m    catalog.Money
		want int64
	}{
		{catalog.Money{Amount: billing.Whole(5000), Currency: "MGA"}, 5000},
		{catalog.Money{Amount: billing.Whole(1000), Currency: "ISK"}, 100000},
		{catalog.Money{Amount: billing.Whole(29), Currency: "USD"}, 2900},
		{catalog.Money{Amount: billing.Whole(500), Currency: "JPY"}, 500},
	} {
		got, ok := StripeMinorUnits(c.m)
		if !ok || got != c.want {
			t.Errorf("%s: unit_amount %d (ok %v), want %d", c.m, got, ok, c.want)
			continue
		}
		if back := MinorMoney(got, c.m.Currency); back != c.m {
			t.Errorf("%s: %d minor units read back as %s", c.m, got, back)
		}
	}
	// What Stripe cannot charge is refused, never rounded.
	half := billing.Units(billing.Scale / 2)
	for _, m := range []catalog.Money{
		{Amount: billing.Whole(5000) + half, Currency: "MGA"}, // 5000.50 MGA: Stripe has no fraction of an ariary
		{Amount: billing.Whole(1000) + half, Currency: "ISK"}, // 1000.5 ISK: whole kronur only
		{Amount: billing.Units(billing.Scale / 1000), Currency: "USD"},
	} {
		if n, ok := StripeMinorUnits(m); ok {
			t.Errorf("%s: unit_amount %d, want refused", m, n)
		}
	}
}
