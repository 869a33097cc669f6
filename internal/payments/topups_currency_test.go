package payments_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
)

// TestTopUpCurrencyOptionAddedLater: a pack's Price given a currency
// option after the gateway first read it (Stripe lets an operator add
// currency_options to a Price) is paid in that currency by Checkout;
// the session paid exactly what the option costs and is granted its
// pack. Before the fix the Price read first was remembered until the
// process restarted: every session paid in the new currency was
// "not credited", ignored for good (answered 200, so Stripe never sent
// it again), money taken and no credits.
func TestTopUpCurrencyOptionAddedLater(t *testing.T) {
	payments.ForgetPackPrices()
	t.Cleanup(payments.ForgetPackPrices)
	e := startTopUps(t)
	e.payer("lea")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	// Bought once in USD: the Price (10.00 USD, no other currency) is
	// read and remembered.
	e.mustDeliver("evt_lea_usd", "checkout.session.completed", at, paidSession("cs_lea_usd", "pi_lea_usd", "lea", "small", 1000))
	e.wantBalance("lea", "100")
	// The operator adds 9.20 EUR to the Price in Stripe's Dashboard.
	e.mock.Answer("/v1/prices/price_small", map[string]any{"unit_amount": 1000, "unit_amount_decimal": "1000", "currency": "usd",
		"currency_options": map[string]any{"eur": map[string]any{"unit_amount": 920, "unit_amount_decimal": "920",
			"custom_unit_amount": nil, "tiers": nil, "tax_behavior": "unspecified"}}})
	eur := paidSession("cs_lea_eur", "pi_lea_eur", "lea", "small", 920)
	eur["currency"] = "eur"
	status, body := e.deliver("evt_lea_eur", "checkout.session.completed", at, eur)
	if status != http.StatusOK || strings.Contains(body, "ignored") {
		t.Fatalf("a session paid in a currency option added to the Price since it was read: %d %s, want 200 granted", status, body)
	}
	e.wantBalance("lea", "200")
	// Still a session paid less than the option costs is not credited.
	cheap := paidSession("cs_lea_cheap", "pi_lea_cheap", "lea", "small", 1)
	cheap["currency"] = "eur"
	if status, body := e.deliver("evt_lea_cheap", "checkout.session.completed", at, cheap); status != http.StatusOK || !strings.Contains(body, "not credited") {
		t.Errorf("a session paid 0.01 EUR: %d %s, want 200 ignored", status, body)
	}
	e.wantBalance("lea", "200")
}
