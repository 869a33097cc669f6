package payments

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/stripe/stripe-go/v82"
)

// CheckPrices asks Stripe for every configured Price and checks it
// against the catalog: a Price in another currency than its product's
// listing, a pack's Price without a fixed unit_amount (the customer
// chooses the price: the pack's credits for whatever was paid), or one
// Stripe says does not exist, is a wrong config
// (returned as bad, which fails the start). Stripe unreachable (a
// network error, a 5xx, a 429, the deadline of ctx) is not: it comes
// back as unreachable, for a warning, since an invoke never needs Stripe
// and the Price is checked again at the next start or reload.
func (s *Service) CheckPrices(ctx context.Context) (bad, unreachable error) {
	type check struct {
		where, price, service, product string
		// pack: a top-up's Price, sold for its fixed unit_amount.
		pack bool
	}
	var checks []check
	for _, p := range s.cfg.Prices {
		where := fmt.Sprintf("price %s %s", p.Service, p.Product)
		if p.Price != "" {
			checks = append(checks, check{where: where, price: p.Price, service: p.Service, product: p.Product})
		}
		if p.MeteredPrice != "" {
			checks = append(checks, check{where: "meter " + p.Service + " " + p.Product, price: p.MeteredPrice, service: p.Service, product: p.Product})
		}
	}
	for _, t := range s.cfg.TopUps {
		checks = append(checks, check{where: fmt.Sprintf("topup %s %s %s", t.Service, t.Product, t.Name), price: t.Price, service: t.Service, product: t.Product, pack: true})
	}
	var errs []error
	for _, c := range checks {
		pr, err := s.sc.V1Prices.Retrieve(ctx, c.price, nil)
		if err != nil {
			var se *stripe.Error
			if errors.As(err, &se) && se.HTTPStatusCode == 404 {
				errs = append(errs, fmt.Errorf("payments stripe: %s: Stripe has no Price %s (in the mode of this secret key)", c.where, c.price))
				continue
			}
			if errors.As(err, &se) && se.HTTPStatusCode >= 400 && se.HTTPStatusCode < 500 && se.HTTPStatusCode != 429 && se.HTTPStatusCode != 408 {
				errs = append(errs, fmt.Errorf("payments stripe: %s: Stripe refused to read Price %s: %v", c.where, c.price, stripeErr(err)))
				continue
			}
			return errors.Join(errs...), fmt.Errorf("payments stripe: Stripe could not be reached to check the Prices: %v", stripeErr(err))
		}
		if c.pack && pr.UnitAmount <= 0 {
			errs = append(errs, fmt.Errorf("payments stripe: %s: Price %s has no fixed unit_amount (a price the customer chooses, tiered or fractional); a pack is sold for a fixed amount: use a Price with a unit amount",
				c.where, c.price))
		}
		_, prod, err := lookup(s.cat, c.service, c.product)
		if err != nil {
			continue // Validate said so already
		}
		if got := strings.ToUpper(string(pr.Currency)); got != prod.Currency {
			errs = append(errs, fmt.Errorf("payments stripe: %s: Price %s is in %s but the product's listing is in %s; use a Price in %s (or `caddy platform stripe sync`)",
				c.where, c.price, got, prod.Currency, prod.Currency))
		}
	}
	return errors.Join(errs...), nil
}
