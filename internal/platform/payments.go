package platform

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// PaymentsService is the payments integration of this config, nil when
// the config has no payments block.
func (a *App) PaymentsService() *payments.Service { return a.pay }

// provisionPayments resolves the block's placeholders ({env.…}), checks it
// against the catalog and builds the Service. It asks Stripe nothing:
// `caddy validate` provisions too.
func (a *App) provisionPayments(repl *caddy.Replacer) error {
	if a.Payments == nil {
		return nil
	}
	cfg := *a.Payments
	for _, f := range []*string{&cfg.SecretKey, &cfg.WebhookSecret, &cfg.APIBase} {
		v, err := repl.ReplaceOrErr(*f, true, true)
		if err != nil {
			return fmt.Errorf("platform payments: %w", err)
		}
		*f = v
	}
	cfg.Defaults()
	if err := cfg.Validate(a.catalog); err != nil {
		return fmt.Errorf("platform %w", err)
	}
	host, _ := os.Hostname()
	svc, err := payments.New(cfg, payments.Deps{Store: a.DataStore, Catalog: a.catalog, Ops: a.ops, Now: a.Now,
		Logger: a.logger.Named("payments"), NodeID: fmt.Sprintf("%s/%d", host, os.Getpid())})
	if err != nil {
		return fmt.Errorf("platform payments: %w", err)
	}
	a.pay = svc
	return nil
}

// priceCheckTimeout bounds the start's check of the Prices with Stripe.
const priceCheckTimeout = 5 * time.Second

// startPayments checks that the open store keeps payment records, and
// asks Stripe for each configured Price: one in another currency than its
// product (or unknown to Stripe) fails the start; Stripe unreachable is a
// warning, since no call needs it (docs/payments.md).
func (a *App) startPayments() error {
	if a.pay == nil {
		return nil
	}
	if _, ok := a.DataStore().(store.Payments); !ok {
		return fmt.Errorf("platform payments: %w", payments.ErrNoPayments)
	}
	ctx, cancel := context.WithTimeout(context.Background(), priceCheckTimeout)
	defer cancel()
	bad, unreachable := a.pay.CheckPrices(ctx)
	if unreachable != nil {
		a.logger.Warn("the Stripe Prices were not checked at start; they are checked again at the next start or reload", zap.Error(unreachable))
	}
	if bad != nil {
		return fmt.Errorf("platform %w", bad)
	}
	return nil
}

// parsePayments reads the payments block:
//
//	payments stripe {
//		secret_key <key>                     # {env.STRIPE_SECRET_KEY}
//		webhook_secret <whsec_…>             # {env.STRIPE_WEBHOOK_SECRET}
//		api_base <url>                       # stripe-mock in tests
//		webhook_tolerance <duration>         # 5m
//		past_due_grace <duration>            # 72h
//		meter_interval <duration>            # 1m
//		price <service> <product> <price_…>  # the product's recurring Price
//		meter <service> <product> <event_name> [<metered price_…>]
//		topup <service> <product> <name> <price_…> <credits> [<expires_after>]
//	}
func parsePayments(d *caddyfile.Dispenser) (*payments.Config, error) {
	at := d.Token()
	if !d.NextArg() {
		return nil, d.Errf("payments: which provider? (payments stripe { … })")
	}
	c := &payments.Config{Provider: d.Val()}
	if c.Provider != "stripe" {
		return nil, d.Errf("payments '%s': only stripe is supported", c.Provider)
	}
	if d.NextArg() {
		return nil, d.Errf("payments stripe takes no further arguments, got '%s'; settings go in its block", d.Val())
	}
	seen := settings{block: "payments"}
	price := func(service, product string) *payments.Price {
		if p := c.PriceFor(service, product); p != nil {
			return p
		}
		c.Prices = append(c.Prices, payments.Price{Service: service, Product: product})
		return &c.Prices[len(c.Prices)-1]
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name != "price" && name != "meter" && name != "topup" {
			if err := seen.once(d); err != nil {
				return nil, err
			}
		}
		var err error
		switch name {
		case "secret_key":
			c.SecretKey, err = oneArg(d)
		case "webhook_secret":
			c.WebhookSecret, err = oneArg(d)
		case "api_base":
			if c.APIBase, err = oneArg(d); err == nil {
				err = checkBaseURL(d, name, c.APIBase)
			}
		case "webhook_tolerance":
			c.WebhookTolerance, err = durationArg(d)
		case "past_due_grace":
			c.PastDueGrace, err = durationArg(d)
		case "meter_interval":
			c.MeterInterval, err = durationArg(d)
		case "price":
			var args []string
			if args, err = lineArgs(d, 3, 3); err == nil {
				p := price(args[0], args[1])
				if p.Price != "" {
					return nil, d.Errf("price %s %s given twice", args[0], args[1])
				}
				p.Price = args[2]
			}
		case "meter":
			var args []string
			if args, err = lineArgs(d, 3, 4); err == nil {
				p := price(args[0], args[1])
				if p.Meter != "" {
					return nil, d.Errf("meter %s %s given twice", args[0], args[1])
				}
				p.Meter = args[2]
				if len(args) == 4 {
					p.MeteredPrice = args[3]
				}
			}
		case "topup":
			var args []string
			if args, err = lineArgs(d, 5, 6); err == nil {
				t := payments.TopUp{Service: args[0], Product: args[1], Name: args[2], Price: args[3]}
				if t.Credits, err = billing.ParseUnits(args[4]); err != nil {
					return nil, d.Errf("topup credits '%s': %v", args[4], err)
				}
				if len(args) == 6 {
					dur, perr := caddy.ParseDuration(args[5])
					if perr != nil || dur <= 0 {
						return nil, d.Errf("topup expires_after '%s' is not a positive duration (e.g. 8760h, 365d)", args[5])
					}
					t.ExpiresAfter = caddy.Duration(dur)
				}
				c.TopUps = append(c.TopUps, t)
			}
		default:
			err = seen.unknown(d)
		}
		if err != nil {
			return nil, err
		}
	}
	if c.SecretKey == "" || c.WebhookSecret == "" {
		return nil, errAt(at, "payments stripe: secret_key and webhook_secret are both required (give them as {env.STRIPE_SECRET_KEY} and {env.STRIPE_WEBHOOK_SECRET})")
	}
	return c, nil
}

// expireCredits ends the credit grants whose expires_after has passed at
// t, oldest first (payments.ExpireCredits); the store audits each. It runs
// in the maintenance of every node: the store expires a grant once.
func (a *App) expireCredits(ctx context.Context, t time.Time) {
	expired, err := payments.ExpireCredits(ctx, a.DataStore(), t)
	if err != nil {
		a.logger.Error("expiring credit grants", zap.Error(err))
	}
	if len(expired) > 0 {
		a.logger.Info("expired credit grants", zap.Int("count", len(expired)))
	}
}
