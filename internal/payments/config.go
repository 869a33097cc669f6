// Package payments takes money for the gateway through Stripe: Checkout
// for paid subscriptions and prepaid top-ups, signed webhooks that drive
// subscription status and credit grants exactly once, and a shipper that
// sends metered usage to Stripe Billing Meters exactly once. Nothing here
// is on the call path: an invoke never waits for Stripe (docs/payments.md).
//
// The platform app owns one Service per config (platform.App.Payments);
// the webhook endpoint is the platform_stripe_webhook handler, the
// storefront and portal start Checkout through the Service, and the
// console reads what the Service recorded.
package payments

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
)

// Defaults of the settings.
const (
	DefaultWebhookTolerance = 5 * time.Minute
	DefaultPastDueGrace     = 72 * time.Hour
	DefaultMeterInterval    = time.Minute
	// MaxWebhookBytes bounds a webhook body; Stripe's events are far
	// smaller.
	MaxWebhookBytes = 1 << 20
)

// Config is the `payments stripe { … }` block of the platform app.
type Config struct {
	// Provider is "stripe", the only one.
	Provider string `json:"provider"`
	// SecretKey is Stripe's secret API key (sk_test_… or sk_live_…, or a
	// restricted rk_…); give it as {env.STRIPE_SECRET_KEY}.
	SecretKey string `json:"secret_key"`
	// WebhookSecret is the endpoint's signing secret (whsec_…).
	WebhookSecret string `json:"webhook_secret"`
	// APIBase replaces https://api.stripe.com, for stripe-mock in tests.
	APIBase string `json:"api_base,omitempty"`
	// WebhookTolerance is how old a signed webhook may be; 5m.
	WebhookTolerance caddy.Duration `json:"webhook_tolerance,omitempty"`
	// PastDueGrace is how long a subscription whose payment failed keeps
	// working before it is SUSPENDED; 72h.
	PastDueGrace caddy.Duration `json:"past_due_grace,omitempty"`
	// MeterInterval is how often metered usage is shipped; 1m.
	MeterInterval caddy.Duration `json:"meter_interval,omitempty"`
	// Prices are the products paid through Stripe.
	Prices []Price `json:"prices,omitempty"`
	// TopUps are the credit packs callers of prepaid products can buy.
	TopUps []TopUp `json:"topups,omitempty"`
}

// Price says how one product of the catalog is paid in Stripe.
type Price struct {
	Service string `json:"service"`
	Product string `json:"product"`
	// Price is the recurring Stripe Price of the product's period_price;
	// a subscription Checkout charges it.
	Price string `json:"price,omitempty"`
	// Meter is the event_name of the Stripe Billing Meter its metered
	// usage (postpaid usage, overage) is sent to; empty when it has none.
	Meter string `json:"meter,omitempty"`
	// MeteredPrice is the metered Stripe Price attached to Meter; a
	// subscription Checkout adds it so the usage is invoiced.
	MeteredPrice string `json:"metered_price,omitempty"`
}

// TopUp is a pack of prepaid credits sold for a one-time Stripe Price.
type TopUp struct {
	Service string `json:"service"`
	Product string `json:"product"`
	// Name names the pack in URLs and pages ("small", "1000").
	Name string `json:"name"`
	// Price is the one-time Stripe Price.
	Price   string        `json:"price"`
	Credits billing.Units `json:"credits"`
	// ExpiresAfter, when set, is how long the credits last.
	ExpiresAfter caddy.Duration `json:"expires_after,omitempty"`
}

// Defaults fills the unset durations.
func (c *Config) Defaults() {
	if c.WebhookTolerance == 0 {
		c.WebhookTolerance = caddy.Duration(DefaultWebhookTolerance)
	}
	if c.PastDueGrace == 0 {
		c.PastDueGrace = caddy.Duration(DefaultPastDueGrace)
	}
	if c.MeterInterval == 0 {
		c.MeterInterval = caddy.Duration(DefaultMeterInterval)
	}
}

// Validate checks the block against the compiled catalog: what it can
// tell without asking Stripe. CheckPrices asks Stripe for the rest (each
// Price's currency).
func (c *Config) Validate(cat *catalog.Catalog) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Provider != "stripe" {
		bad("payments: provider %q: only stripe is supported", c.Provider)
	}
	if c.SecretKey == "" {
		bad("payments stripe: secret_key is missing (give it as {env.STRIPE_SECRET_KEY})")
	}
	if c.WebhookSecret == "" {
		bad("payments stripe: webhook_secret is missing: without it no webhook can be verified and no payment would change anything (give it as {env.STRIPE_WEBHOOK_SECRET})")
	} else if !strings.HasPrefix(c.WebhookSecret, "whsec_") {
		bad("payments stripe: webhook_secret must be the endpoint's signing secret, which starts with whsec_")
	}
	if c.APIBase != "" {
		u, err := url.Parse(c.APIBase)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("payments stripe: api_base '%s': an http or https URL", catalog.ShownURL(c.APIBase))
		}
	}
	if c.WebhookTolerance < 0 || c.PastDueGrace < 0 || c.MeterInterval < 0 {
		bad("payments stripe: durations must not be negative")
	}
	seen := map[string]bool{}
	for _, p := range c.Prices {
		where := fmt.Sprintf("payments stripe: price %s %s", p.Service, p.Product)
		if seen[p.Service+"\x00"+p.Product] {
			bad("%s: given twice", where)
			continue
		}
		seen[p.Service+"\x00"+p.Product] = true
		svc, prod, err := lookup(cat, p.Service, p.Product)
		if err != nil {
			bad("%s: %v", where, err)
			continue
		}
		if prod.Currency == "" {
			bad("%s: the product has no currency in its listing; a product paid in money needs one (listing currency)", where)
		}
		if p.Price == "" && p.Meter == "" {
			bad("%s: neither a Price nor a meter", where)
		}
		if p.Price != "" && !strings.HasPrefix(p.Price, "price_") {
			bad("%s: %q is not a Stripe Price id (price_…)", where, p.Price)
		}
		if p.MeteredPrice != "" && !strings.HasPrefix(p.MeteredPrice, "price_") {
			bad("%s: metered price %q is not a Stripe Price id (price_…)", where, p.MeteredPrice)
		}
		if p.Meter != "" && prod.BillingModel == billing.Prepaid {
			bad("%s: a prepaid product's usage is paid by credits; only postpaid usage and overage go to a meter", where)
		}
		if p.Meter != "" && !validEventName(p.Meter) {
			bad("%s: meter event name %q: letters, digits, _, - and ., at most 100", where, p.Meter)
		}
		if p.MeteredPrice != "" && p.Meter == "" {
			bad("%s: a metered price needs the meter it is attached to", where)
		}
		if listing, ok := svc.Listing(prod.ID); ok && listing.PeriodPrice != nil && *listing.PeriodPrice > 0 && p.Price == "" {
			bad("%s: the product has a period_price but no Stripe Price", where)
		}
		if prod.BillingModel == billing.Prepaid && p.Price != "" {
			bad("%s: a prepaid product is paid by top-ups, not a recurring Price", where)
		}
	}
	// A product sold for money in the catalog must be paid somewhere:
	// every self-service paid product needs a Stripe Price.
	for _, svc := range cat.Services() {
		for _, prod := range svc.Products {
			if svc.SelfServiceOffer(prod.ID) != catalog.OfferPaid {
				continue
			}
			if prod.BillingModel == billing.Prepaid {
				if len(c.TopUpsFor(svc.ID, prod.ID)) == 0 {
					bad("payments stripe: service %s product %s is a prepaid self_service product but has no credit pack to buy (topup %s %s <name> price_… <credits>)",
						svc.ID, prod.ID, svc.ID, prod.ID)
				}
				continue
			}
			if !seen[svc.ID+"\x00"+prod.ID] {
				bad("payments stripe: service %s product %s is a paid self_service product but has no Stripe price (price %s %s price_…)",
					svc.ID, prod.ID, svc.ID, prod.ID)
			}
		}
	}
	packs := map[string]bool{}
	for _, t := range c.TopUps {
		where := fmt.Sprintf("payments stripe: topup %s %s %s", t.Service, t.Product, t.Name)
		key := t.Service + "\x00" + t.Product + "\x00" + t.Name
		if packs[key] {
			bad("%s: given twice", where)
			continue
		}
		packs[key] = true
		_, prod, err := lookup(cat, t.Service, t.Product)
		if err != nil {
			bad("%s: %v", where, err)
			continue
		}
		if prod.BillingModel != billing.Prepaid {
			bad("%s: top-ups buy prepaid credits; the product's billing model is %s", where, prod.BillingModel)
		}
		if prod.Currency == "" {
			bad("%s: the product has no currency in its listing", where)
		}
		if !validPackName(t.Name) {
			bad("%s: a pack name is letters, digits, - and _", where)
		}
		if !strings.HasPrefix(t.Price, "price_") {
			bad("%s: %q is not a Stripe Price id (price_…)", where, t.Price)
		}
		if t.Credits <= 0 {
			bad("%s: credits must be positive", where)
		}
		if t.ExpiresAfter < 0 {
			bad("%s: expires_after must not be negative", where)
		}
	}
	// One Stripe Price, one use: the webhooks find the product of a
	// subscription or a top-up by its Price, so a Price given twice would
	// grant the wrong product or pack.
	uses := map[string]string{}
	use := func(price, what string) {
		if price == "" {
			return
		}
		if first, dup := uses[price]; dup {
			bad("payments stripe: Stripe Price %s is used twice, by %s and by %s: each product, metered price and pack needs a Price of its own", price, first, what)
			return
		}
		uses[price] = what
	}
	for _, p := range c.Prices {
		use(p.Price, fmt.Sprintf("price %s %s", p.Service, p.Product))
		use(p.MeteredPrice, fmt.Sprintf("the metered price of meter %s %s", p.Service, p.Product))
	}
	for _, t := range c.TopUps {
		use(t.Price, fmt.Sprintf("topup %s %s %s", t.Service, t.Product, t.Name))
	}
	return errors.Join(errs...)
}

func lookup(cat *catalog.Catalog, serviceID, productID string) (*catalog.Service, *billing.Product, error) {
	svc, ok := cat.Service(serviceID)
	if !ok {
		return nil, nil, fmt.Errorf("no service %q in the catalog", serviceID)
	}
	prod, ok := svc.Product(productID)
	if !ok {
		return nil, nil, fmt.Errorf("service %q has no product %q", serviceID, productID)
	}
	return svc, prod, nil
}

// validEventName is a Stripe meter's event_name as the gateway accepts
// it: at most 100 characters, no spaces or punctuation beyond _ - . .
func validEventName(s string) bool {
	if s == "" || len(s) > 100 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

func validPackName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// PriceFor returns the Stripe pricing of a product, or nil.
func (c *Config) PriceFor(serviceID, productID string) *Price {
	for i := range c.Prices {
		if c.Prices[i].Service == serviceID && c.Prices[i].Product == productID {
			return &c.Prices[i]
		}
	}
	return nil
}

// TopUpsFor returns the packs of a product, in configuration order.
func (c *Config) TopUpsFor(serviceID, productID string) []TopUp {
	var out []TopUp
	for _, t := range c.TopUps {
		if t.Service == serviceID && t.Product == productID {
			out = append(out, t)
		}
	}
	return out
}
