package payments_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
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

// TestTopUpPriceReReadFailingKeepsRemembered: a session that does not
// match the Price remembered makes the gateway read the Price again; with
// Stripe's API out of reach that read fails and the session is answered
// 500 (Stripe sends it again: not refused for good). The Price
// remembered must survive that failed read: before the fix it was
// dropped before the read, so every later top-up, paid exactly the
// pack's price, was answered 500 too and waited for Stripe's API to come
// back instead of being granted from the Price already known. Matching
// sessions never cost a Stripe read.
func TestTopUpPriceReReadFailingKeepsRemembered(t *testing.T) {
	payments.ForgetPackPrices()
	t.Cleanup(payments.ForgetPackPrices)
	e := startTopUps(t)
	e.payer("max")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	e.mustDeliver("evt_max_1", "checkout.session.completed", at, paidSession("cs_max_1", "pi_max_1", "max", "small", 1000))
	e.wantBalance("max", "100")

	// Stripe's API out of reach for Prices.
	e.mock.Fail(func(r stripetest.Request) int {
		if strings.HasPrefix(r.Path, "/v1/prices/") {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	odd := paidSession("cs_max_odd", "pi_max_odd", "max", "small", 920)
	odd["currency"] = "eur"
	if status, body := e.deliver("evt_max_odd", "checkout.session.completed", at, odd); status != http.StatusInternalServerError {
		t.Fatalf("a mismatching session while the Price cannot be read again: %d %s, want 500 (sent again)", status, body)
	}
	status, body := e.deliver("evt_max_2", "checkout.session.completed", at, paidSession("cs_max_2", "pi_max_2", "max", "small", 1000))
	if status != http.StatusOK {
		t.Fatalf("a session paid the pack's remembered price after a failed re-read: %d %s, want 200 granted", status, body)
	}
	e.wantBalance("max", "200")
	e.mock.Fail(nil)

	// Stripe back: the mismatch, still a mismatch after the re-read, is
	// refused for good (200 ignored) and the Price read once for it.
	before := len(e.mock.Requests("/v1/prices/price_small"))
	if status, body := e.deliver("evt_max_odd", "checkout.session.completed", at, odd); status != http.StatusOK || !strings.Contains(body, "not credited") {
		t.Errorf("the mismatching session again, Stripe back: %d %s, want 200 not credited", status, body)
	}
	if n := len(e.mock.Requests("/v1/prices/price_small")) - before; n != 1 {
		t.Errorf("the mismatching session read the Price %d times, want 1", n)
	}
	before = len(e.mock.Requests("/v1/prices/price_small"))
	e.mustDeliver("evt_max_3", "checkout.session.completed", at, paidSession("cs_max_3", "pi_max_3", "max", "small", 1000))
	if n := len(e.mock.Requests("/v1/prices/price_small")) - before; n != 0 {
		t.Errorf("a matching session read the Price %d times, want 0", n)
	}
	e.wantBalance("max", "300")
}
