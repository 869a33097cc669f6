package payments_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
)

// TestTopUpPaidThePacksPrice: a paid session is granted its pack only
// when it paid what the pack's Price costs, in its currency (or, with
// Stripe's Adaptive Pricing, its currency_conversion did, or one of the
// Price's currency_options). Before the fix the credits came from the
// pack's name alone: a session paid 0.01 USD, or in another currency,
// got the whole pack. A session paid otherwise is ignored (200, nothing
// granted, its refund ignored too), and a pack's Price without a fixed
// unit_amount (the customer chooses the price) fails the config check.
func TestTopUpPaidThePacksPrice(t *testing.T) {
	payments.ForgetPackPrices()
	t.Cleanup(payments.ForgetPackPrices)
	e := startTopUps(t)
	e.mock.Answer("/v1/prices/price_big", map[string]any{"unit_amount": 5000, "unit_amount_decimal": "5000", "currency": "usd",
		"currency_options": map[string]any{"eur": map[string]any{"unit_amount": 4600, "unit_amount_decimal": "4600", "custom_unit_amount": nil, "tiers": nil, "tax_behavior": "unspecified"}}})
	e.payer("pia")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	ignored := func(evt string, sess map[string]any) {
		t.Helper()
		status, body := e.deliver(evt, "checkout.session.completed", at, sess)
		var got struct {
			Received bool
			Ignored  string
		}
		if status != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || !got.Received || !strings.Contains(got.Ignored, "not credited") {
			t.Errorf("%s: %d %s, want 200 ignored (paid otherwise than the pack costs)", evt, status, body)
		}
	}
	ignored("evt_cent", paidSession("cs_cent", "pi_cent", "pia", "small", 1))
	eur := paidSession("cs_eur", "pi_eur", "pia", "small", 1000)
	eur["currency"] = "eur"
	ignored("evt_eur", eur)
	cheapLocal := paidSession("cs_loc1", "pi_loc1", "pia", "small", 92)
	cheapLocal["currency"] = "eur"
	cheapLocal["currency_conversion"] = map[string]any{"amount_subtotal": 100, "amount_total": 100, "fx_rate": "0.92", "source_currency": "usd"}
	ignored("evt_loc1", cheapLocal)
	bigEUR := paidSession("cs_big_eur", "pi_big_eur", "pia", "big", 4000)
	bigEUR["currency"] = "eur"
	ignored("evt_big_eur", bigEUR)
	e.wantBalance("pia", "0")
	if gs := e.grants("pia"); len(gs) != 0 {
		t.Fatalf("grants of sessions that did not pay the pack: %+v", gs)
	}
	refund := map[string]any{"id": "ch_cent", "object": "charge", "amount": 1, "amount_refunded": 1, "currency": "usd",
		"payment_intent": "pi_cent", "refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_cent", "object": "refund", "amount": 1, "status": "succeeded", "created": at.Unix()}}}}
	if status, body := e.deliver("evt_cent_refund", "charge.refunded", at, refund); status != http.StatusOK || !strings.Contains(body, "ignored when it was paid") {
		t.Errorf("refund of a session not credited: %d %s, want 200 ignored", status, body)
	}

	// Paid as the pack costs: in its currency, in the local currency of
	// Adaptive Pricing (10.00 USD shown as 9.20 EUR), in one of the
	// Price's currency_options.
	e.mustDeliver("evt_ok", "checkout.session.completed", at, paidSession("cs_ok", "pi_ok", "pia", "small", 1000))
	e.wantBalance("pia", "100")
	local := paidSession("cs_loc2", "pi_loc2", "pia", "small", 920)
	local["currency"] = "eur"
	local["currency_conversion"] = map[string]any{"amount_subtotal": 1000, "amount_total": 1000, "fx_rate": "0.92", "source_currency": "usd"}
	e.mustDeliver("evt_loc2", "checkout.session.completed", at, local)
	e.wantBalance("pia", "200")
	// Tax Stripe added (or a promotion code the operator allows) changes
	// what was charged, not the pack sold: its subtotal is the pack's.
	taxed := paidSession("cs_tax", "pi_tax", "pia", "small", 1000)
	taxed["amount_total"] = 1190
	e.mustDeliver("evt_tax", "checkout.session.completed", at, taxed)
	e.wantBalance("pia", "300")
	bigEUR = paidSession("cs_big_eur2", "pi_big_eur2", "pia", "big", 4600)
	bigEUR["currency"] = "eur"
	e.mustDeliver("evt_big_eur2", "checkout.session.completed", at, bigEUR)
	e.wantBalance("pia", "1300")

	// A pack whose Price lets the customer choose the amount: the config
	// check refuses it.
	e.mock.Answer("/v1/prices/price_trio", map[string]any{"unit_amount": nil, "unit_amount_decimal": nil, "currency": "usd",
		"custom_unit_amount": map[string]any{"minimum": 100, "maximum": nil, "preset": nil}})
	bad, unreachable := e.app.PaymentsService().CheckPrices(context.Background())
	if unreachable != nil || bad == nil || !strings.Contains(bad.Error(), "topup echo credits trio") || !strings.Contains(bad.Error(), "no fixed unit_amount") {
		t.Errorf("CheckPrices with a customer-chooses-price pack: bad %v, unreachable %v", bad, unreachable)
	}
	if bad != nil && (strings.Contains(bad.Error(), "credits small") || strings.Contains(bad.Error(), "credits big")) {
		t.Errorf("CheckPrices refused a Price with a unit amount: %v", bad)
	}
}
