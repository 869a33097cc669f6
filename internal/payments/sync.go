package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

// SyncedPrice is a Stripe Product and Price `stripe sync` made for a
// catalog product, and the config line that uses it.
type SyncedPrice struct {
	Service   string `json:"serviceId"`
	Product   string `json:"productId"`
	StripeID  string `json:"stripeProductId"`
	PriceID   string `json:"priceId"`
	Amount    string `json:"amount"` // "29.00 USD"
	Interval  string `json:"interval"`
	Line      string `json:"line"` // price <service> <product> <price_…>
	Duplicate bool   `json:"-"`
}

// SyncResult is what SyncCatalog did.
type SyncResult struct {
	Created []SyncedPrice `json:"created"`
	// Skipped says why a paid product got no Price.
	Skipped []string `json:"skipped,omitempty"`
}

// SyncCatalog creates, in Stripe, a Product and a recurring Price for
// every listed product with a period price that has no Price configured:
// the amount in the currency's minor units as Stripe counts them
// (StripeMinorUnits),
// the listing's currency, the product's period as the interval. Each
// create carries an Idempotency-Key made of the product and its price, so
// running it twice within Stripe's 24 hours makes nothing twice. The
// config is not changed: the result's lines go into the payments block.
func (s *Service) SyncCatalog(ctx context.Context) (SyncResult, error) {
	var out SyncResult
	for _, svc := range s.cat.Services() {
		for _, prod := range svc.Products {
			l, ok := svc.Listing(prod.ID)
			if !ok {
				continue
			}
			m, ok := l.PeriodPriceMoney()
			if !ok || m.Amount <= 0 {
				continue
			}
			if p := s.cfg.PriceFor(svc.ID, prod.ID); p != nil && p.Price != "" {
				continue
			}
			where := svc.ID + " " + prod.ID
			minor, ok := StripeMinorUnits(m)
			if !ok || m.Currency == "" {
				out.Skipped = append(out.Skipped, fmt.Sprintf("%s: period price %s is not a whole amount of the currency's minor units in Stripe", where, m))
				continue
			}
			interval := strings.ToLower(prod.Period)
			if interval == "" {
				interval = "month"
			}
			sp, err := s.syncOne(ctx, svc, l, prod.ID, minor, m, interval)
			if err != nil {
				return out, fmt.Errorf("%s: %w", where, err)
			}
			out.Created = append(out.Created, sp)
		}
	}
	return out, nil
}

func (s *Service) syncOne(ctx context.Context, svc *catalog.Service, l *catalog.ProductListing, productID string, minor int64, m catalog.Money, interval string) (SyncedPrice, error) {
	meta := map[string]string{MetaService: svc.ID, MetaProduct: productID}
	pp := &stripe.ProductCreateParams{Name: stripe.String(svc.Name() + " · " + l.Name()), Metadata: meta}
	if l.Description != "" {
		pp.Description = stripe.String(l.Description)
	}
	pp.SetIdempotencyKey(idemKey("product", svc.ID+"/"+productID))
	sp, err := s.sc.V1Products.Create(ctx, pp)
	if err != nil {
		return SyncedPrice{}, fmt.Errorf("create the Stripe Product: %w", stripeErr(err))
	}
	prp := &stripe.PriceCreateParams{Product: stripe.String(sp.ID), UnitAmount: stripe.Int64(minor),
		Currency: stripe.String(strings.ToLower(m.Currency)), Metadata: meta,
		Recurring: &stripe.PriceCreateRecurringParams{Interval: stripe.String(interval)}}
	prp.SetIdempotencyKey(idemKey("price", fmt.Sprintf("%s/%s/%d/%s/%s", svc.ID, productID, minor, m.Currency, interval)))
	pr, err := s.sc.V1Prices.Create(ctx, prp)
	if err != nil {
		return SyncedPrice{}, fmt.Errorf("create the Stripe Price: %w", stripeErr(err))
	}
	return SyncedPrice{Service: svc.ID, Product: productID, StripeID: sp.ID, PriceID: pr.ID, Amount: m.String(),
		Interval: interval, Line: fmt.Sprintf("price %s %s %s", svc.ID, productID, pr.ID)}, nil
}

// ResyncResult is what Resync applied.
type ResyncResult struct {
	Customers     int `json:"customers"`
	Subscriptions int `json:"subscriptions"`
	Invoices      int `json:"invoices"`
	// Skipped are the objects that could not apply (a price no product
	// has), with why; Stripe's own objects of other uses land here.
	Skipped []string `json:"skipped,omitempty"`
}

// ResyncInvoiceWindow is how far back Resync reads invoices.
const ResyncInvoiceWindow = 35 * 24 * time.Hour

// Resync reads back from Stripe the subscriptions and the recent invoices
// of every customer the gateway made, and applies them with the webhook
// handlers' code: for a webhook that was missed (the endpoint down for
// longer than Stripe retries, an event not enabled). The state read is
// stamped with the time it was read, so an event created before the
// resync and delivered after it changes nothing.
func (s *Service) Resync(ctx context.Context) (ResyncResult, error) {
	var out ResyncResult
	pay, err := s.Payments()
	if err != nil {
		return out, err
	}
	for r, err := range store.PaymentRecords(ctx, pay, KindCustomer, "") {
		if err != nil {
			return out, err
		}
		var c CustomerRecord
		if json.Unmarshal(r.Body, &c) != nil || c.CustomerID == "" {
			continue
		}
		out.Customers++
		if err := s.resyncCustomer(ctx, c, &out); err != nil {
			return out, err
		}
	}
	return out, nil
}

func (s *Service) resyncCustomer(ctx context.Context, c CustomerRecord, out *ResyncResult) error {
	pay, err := s.Payments()
	if err != nil {
		return err
	}
	lp := &stripe.SubscriptionListParams{Customer: stripe.String(c.CustomerID), Status: stripe.String("all")}
	listedAt := s.now().UTC()
	for sub, err := range s.sc.V1Subscriptions.List(ctx, lp) {
		if err != nil {
			return fmt.Errorf("list the subscriptions of customer %s: %w", c.CustomerID, stripeErr(err))
		}
		st := stateOf(sub)
		st.Customer, st.fetched, st.listedAt = c.CustomerID, true, listedAt
		var fb *ident
		if rec, found, err := s.getSubRecord(ctx, pay, sub.ID); err != nil {
			return err
		} else if found {
			fb = &ident{User: rec.UserID, Service: rec.ServiceID, Product: rec.ProductID}
		} else if s.Sells(sub.Metadata[MetaService], sub.Metadata[MetaProduct]) {
			fb = &ident{User: c.UserID, Service: sub.Metadata[MetaService], Product: sub.Metadata[MetaProduct]}
		} else if _, _, ok := s.productOfPrices(st.Prices); ok {
			fb = &ident{User: c.UserID}
		} else {
			out.Skipped = append(out.Skipped, fmt.Sprintf("subscription %s of %s: no configured product has its price", sub.ID, c.UserID))
			continue
		}
		// Stamped with when the list began, not when it is applied: an
		// event Stripe made after the list read the subscription (a
		// deletion whose webhook comes after the resync) is newer than
		// the state listed, and applies; one of the list's second has
		// the subscription read from Stripe again (applyState).
		if err := s.applyState(ctx, st, listedAt.Truncate(time.Second), fb); err != nil {
			var be badEventError
			if errors.As(err, &be) {
				out.Skipped = append(out.Skipped, be.Error())
				continue
			}
			return err
		}
		out.Subscriptions++
	}
	ip := &stripe.InvoiceListParams{Customer: stripe.String(c.CustomerID)}
	ip.CreatedRange = &stripe.RangeQueryParams{GreaterThanOrEqual: s.now().Add(-ResyncInvoiceWindow).Unix()}
	for inv, err := range s.sc.V1Invoices.List(ctx, ip) {
		if err != nil {
			return fmt.Errorf("list the invoices of customer %s: %w", c.CustomerID, stripeErr(err))
		}
		if inv.Status != stripe.InvoiceStatusPaid && inv.Status != stripe.InvoiceStatusOpen && inv.Status != stripe.InvoiceStatusUncollectible {
			continue
		}
		id, subID, err := s.invoiceIdent(ctx, pay, inv, c.UserID)
		if err != nil {
			out.Skipped = append(out.Skipped, err.Error())
			continue
		}
		if err := s.putInvoice(ctx, pay, inv, id, subID, c.CustomerID); err != nil {
			return err
		}
		out.Invoices++
	}
	return nil
}
