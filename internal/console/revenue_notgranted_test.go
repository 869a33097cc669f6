package console

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// TestRevenueTopUpsNotGranted: a top-up paid that the gateway ignored
// (its pack not in the config at that moment, a currency its Price does
// not have) is money the operator received: the Revenue page counts it
// with the top-ups, net of what went back, and lists it apart as paid and
// not granted, with its amount and currency, who paid, the pack and why,
// so the operator refunds it or grants it by hand. One granted since (its
// paid event applied later) is a top-up like any other and not listed;
// one ignored before the gateway kept its amount is listed without it.
// The old page left a paid top-up the gateway ignored out altogether:
// 10.00 USD paid, 4.00 USD refunded, showed nothing of it.
func TestRevenueTopUpsNotGranted(t *testing.T) {
	e, st := moneyEnv(t)
	pay := st.(store.Payments)
	bg := context.Background()
	paid := time.Date(2026, 11, 4, 9, 0, 0, 0, time.UTC)
	put := func(kind, id string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if err := pay.PutPaymentRecord(bg, kind, id, b, moneyNow); err != nil {
			t.Fatal(err)
		}
	}
	put(payments.KindTopUpIgnored, "pi_ig", payments.IgnoredTopUp{ID: "pi_ig", SessionID: "cs_ig", Reason: `the session names pack "retired", which pre/credits does not have`,
		At: paid, UserID: "ann", ServiceID: "pre", ProductID: "credits", Pack: "retired", Amount: 1000, Currency: "USD", PaidAt: paid, Refunded: 400})
	// Ignored, then granted when its paid event came again: a top-up.
	put(payments.KindTopUpIgnored, "pi_later", payments.IgnoredTopUp{ID: "pi_later", Reason: "no subscription", At: paid,
		UserID: "ben", ServiceID: "pre", Pack: "ten", Amount: 700, Currency: "USD", PaidAt: paid})
	put(payments.KindTopUp, "pi_later", payments.TopUpRecord{ID: "pi_later", UserID: "ben", ServiceID: "pre", ProductID: "credits", Pack: "ten",
		Credits: "10", Amount: 700, Currency: "USD", PaidAt: paid})
	// Another gateway's on the same Stripe account: none of this one's money.
	put(payments.KindTopUpIgnored, "pi_foreign", payments.IgnoredTopUp{ID: "pi_foreign", SessionID: "cs_foreign",
		Reason: "customer cus_x is not one the gateway made", At: paid, UserID: "ann", ServiceID: "pre", Pack: "ten",
		Amount: 5000, Currency: "USD", PaidAt: paid, Foreign: true})
	// Ignored by a gateway from before the amount was kept.
	put(payments.KindTopUpIgnored, "pi_old", payments.IgnoredTopUp{ID: "pi_old", SessionID: "cs_old", Reason: "old reason", At: paid})
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	got := getPage(t, h, "/console/revenue")
	// 6.00 (10.00 less 4.00) + 7.00 top-ups, 4.00 back.
	if !strings.Contains(got, "USD 0.00 USD 13.00 USD 13.00 USD 4.00 USD") {
		t.Errorf("no USD 13.00 of top-ups received and 4.00 refunded:\n%s", got)
	}
	for _, want := range []string{
		"Top-ups paid, not granted",
		"ann pre (credits) retired 10.00 USD 4.00 USD the session names pack \"retired\", which pre/credits does not have pi_ig",
		"not recorded not recorded: see Stripe nothing old reason pi_old",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the page does not say %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "pi_later") {
		t.Errorf("a top-up granted since is listed as not granted:\n%s", got)
	}
	if strings.Contains(got, "pi_foreign") {
		t.Errorf("another gateway's top-up is listed as this one's:\n%s", got)
	}
}

// TestRevenueNotGrantedPartialTopUps: when the top-ups listing stops at
// its record limit (the page says it is partial), a top-up ignored when
// it was paid and granted since, whose top-up record lies past the limit,
// is still a top-up: not listed as paid and not granted (which tells the
// operator to grant its credits by hand, a second time, or refund a
// top-up the caller has). The old page took "not among the top-ups read"
// for "not granted": with a limit of 2 and top-ups pi_a, pi_b, pi_c, the
// granted pi_c was listed as not granted and its 7.00 USD counted from
// the ignored record, as no other top-up past the limit is.
func TestRevenueNotGrantedPartialTopUps(t *testing.T) {
	old := maxRevenueRecords
	maxRevenueRecords = 2
	t.Cleanup(func() { maxRevenueRecords = old })
	e, st := moneyEnv(t)
	pay := st.(store.Payments)
	bg := context.Background()
	paid := time.Date(2026, 11, 4, 9, 0, 0, 0, time.UTC)
	put := func(kind, id string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if err := pay.PutPaymentRecord(bg, kind, id, b, moneyNow); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"pi_a", "pi_b", "pi_c"} {
		put(payments.KindTopUp, id, payments.TopUpRecord{ID: id, UserID: "ann", ServiceID: "pre", ProductID: "credits", Pack: "ten",
			Credits: "10", Amount: 700, Currency: "USD", PaidAt: paid})
	}
	// pi_c was ignored when it was paid, and granted since.
	put(payments.KindTopUpIgnored, "pi_c", payments.IgnoredTopUp{ID: "pi_c", Reason: "no subscription", At: paid,
		UserID: "ann", ServiceID: "pre", Pack: "ten", Amount: 700, Currency: "USD", PaidAt: paid})
	// pi_z is not granted, past the limit too.
	put(payments.KindTopUpIgnored, "pi_z", payments.IgnoredTopUp{ID: "pi_z", Reason: "pack retired", At: paid,
		UserID: "ann", ServiceID: "pre", Pack: "retired", Amount: 300, Currency: "USD", PaidAt: paid})
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	got := getPage(t, h, "/console/revenue")
	if !strings.Contains(got, "the figures are partial") {
		t.Errorf("the page does not say it is partial:\n%s", got)
	}
	if strings.Contains(got, "pi_c") {
		t.Errorf("a top-up granted since, past the listing's limit, is listed as not granted:\n%s", got)
	}
	if !strings.Contains(got, "pi_z") {
		t.Errorf("a top-up not granted is not listed:\n%s", got)
	}
	// pi_a and pi_b read (14.00), pi_z not granted (3.00); pi_c past the
	// limit, as a top-up, not counted.
	if !strings.Contains(got, "USD 0.00 USD 17.00 USD 17.00 USD") {
		t.Errorf("the top-ups are not 17.00 USD:\n%s", got)
	}
}
