package platform

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// paidService is a public service with a paid self-service product pro
// (USD), a free one, and a prepaid one, for the payments block's cases.
const paidService = `service s {
		backend http://127.0.0.1:9000
		secret {env.S}
		endpoint e
		public
		product pro {
			billing SUBSCRIPTION
			measurement PER_REQUEST
			quota 1000 per month
			currency USD
			period_price 29
			self_service
		}
		product free {
			billing SUBSCRIPTION
			measurement PER_REQUEST
			quota 10
			self_service
		}
		product credits {
			billing PREPAID
			measurement PER_REQUEST
			price 1
			currency USD
		}
	}
`

func paymentsBlock(settings string) string { return storedPayments("", settings) }

// storedPayments is the platform block with a store path (when given),
// paidService and a payments block of settings.
func storedPayments(store, settings string) string {
	if store != "" {
		store = "\tstore " + store + "\n"
	}
	return "platform {\n" + store + "\t" + paidService + "\tpayments stripe {\n" + settings + "\n\t}\n}"
}

const goodPayments = "\t\tsecret_key sk_test_x\n\t\twebhook_secret whsec_x\n\t\tprice s pro price_pro\n"

// TestCaddyfilePayments: the payments block is read into the app's
// Config, and each mistake is refused with what to fix: at adapt time
// for its syntax, at provision (caddy validate) for what needs the
// catalog.
func TestCaddyfilePayments(t *testing.T) {
	raw, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(platformConfig(paymentsBlock(goodPayments+
		"\t\tpast_due_grace 24h\n\t\tapi_base http://127.0.0.1:12111\n\t\tmeter s pro calls price_metered\n\t\ttopup s credits small price_small 1000 365d"))), nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			Platform struct {
				Payments json.RawMessage `json:"payments"`
			} `json:"platform"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"secret_key":"sk_test_x"`, `"webhook_secret":"whsec_x"`, `"price":"price_pro"`, `"meter":"calls"`,
		`"metered_price":"price_metered"`, `"name":"small"`, `"api_base":"http://127.0.0.1:12111"`} {
		if !strings.Contains(string(cfg.Apps.Platform.Payments), want) {
			t.Errorf("adapted payments lack %s: %s", want, cfg.Apps.Platform.Payments)
		}
	}

	for _, tc := range []struct{ name, settings, want string }{
		{"unknown setting", goodPayments + "\t\tcurrency EUR", "currency"},
		{"missing webhook secret", "\t\tsecret_key sk_test_x\n\t\tprice s pro price_pro", "webhook_secret are both required"},
		{"missing secret key", "\t\twebhook_secret whsec_x\n\t\tprice s pro price_pro", "secret_key and webhook_secret"},
		{"price without its id", goodPayments + "\t\tprice s free", "price"},
		{"price twice", goodPayments + "\t\tprice s pro price_again", "given twice"},
		{"bad credits", goodPayments + "\t\ttopup s credits small price_small lots", "topup credits 'lots'"},
		{"bad expiry", goodPayments + "\t\ttopup s credits small price_small 10 never", "expires_after 'never'"},
		{"bad api base", goodPayments + "\t\tapi_base ftp://stripe", "api_base"},
		{"setting twice", goodPayments + "\t\tsecret_key sk_test_y", "secret_key"},
	} {
		t.Run("adapt/"+tc.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(platformConfig(paymentsBlock(tc.settings))), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
	if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(platformConfig("platform {\n\t"+paidService+"\tpayments paypal {\n\t}\n}")), nil); err == nil ||
		!strings.Contains(err.Error(), "only stripe") {
		t.Errorf("another provider: %v", err)
	}

	for _, tc := range []struct{ name, settings, want string }{
		{"bad price id", "\t\tsecret_key sk_test_x\n\t\twebhook_secret whsec_x\n\t\tprice s pro prod_123", "is not a Stripe Price id"},
		{"paid self-service product without a price", "\t\tsecret_key sk_test_x\n\t\twebhook_secret whsec_x", "paid self_service product but has no Stripe price (price s pro price_…)"},
		{"topup on a product that is not prepaid", goodPayments + "\t\ttopup s pro small price_small 100", "top-ups buy prepaid credits"},
		{"webhook secret not whsec", "\t\tsecret_key sk_test_x\n\t\twebhook_secret abc\n\t\tprice s pro price_pro", "starts with whsec_"},
		{"price of an unknown product", goodPayments + "\t\tprice s gold price_gold", `has no product "gold"`},
		{"recurring price on a prepaid product", goodPayments + "\t\tprice s credits price_c", "prepaid product is paid by top-ups"},
		{"one price for two products", goodPayments + "\t\tprice s free price_pro", "Stripe Price price_pro is used twice, by price s pro and by price s free"},
		{"one price as price and metered price", goodPayments + "\t\tmeter s pro calls price_pro", "Stripe Price price_pro is used twice, by price s pro and by the metered price of meter s pro"},
		{"one price for a product and a pack", goodPayments + "\t\ttopup s credits small price_pro 100", "Stripe Price price_pro is used twice, by price s pro and by topup s credits small"},
		{"one price for two packs", goodPayments + "\t\ttopup s credits small price_small 100\n\t\ttopup s credits big price_small 1000", "Stripe Price price_small is used twice, by topup s credits small and by topup s credits big"},
	} {
		t.Run("validate/"+tc.name, func(t *testing.T) {
			t.Setenv("S", "s-secret-0123456789abcdef0123456789")
			raw, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(platformConfig(
				storedPayments(t.TempDir()+"/platform.db", tc.settings))), nil)
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			var cfg caddy.Config
			if err := json.Unmarshal(raw, &cfg); err != nil {
				t.Fatal(err)
			}
			err = caddy.Validate(&cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// TestCLIStripeWithoutPayments: `caddy platform stripe sync|resync`
// against a gateway with no payments block say so (404, as reconcile)
// and change nothing.
func TestCLIStripeWithoutPayments(t *testing.T) {
	admStart(t)
	for _, sub := range []string{"sync", "resync"} {
		out, err := cliRun(t, "stripe", sub)
		if err == nil || !strings.Contains(err.Error(), "HTTP 404 not_found") {
			t.Errorf("stripe %s: %v\n%s", sub, err, out)
		}
	}
}
