package payments

import (
	"encoding/json"

	"github.com/stripe/stripe-go/v82"
)

// Events carry their objects in the API version of the webhook endpoint
// they were sent to, not in this build's (stripe-go's, 2025-03-31 "basil"
// or later). An endpoint made in the Dashboard takes the account's default
// version, which for older accounts is before basil, where:
//
//   - a subscription's period end is its own `current_period_end`, not
//     each item's (basil moved it onto the items);
//   - an invoice names its subscription as `subscription` (an id or the
//     object) with `subscription_details.metadata`, not under
//     `parent.subscription_details`, and a line its Price as `price`, not
//     `pricing.price_details.price`.
//
// Read with basil's types alone, such a subscription had no period end
// (a cancellation at its end got no end date) and such an invoice named
// no subscription and no configured Price (ignored: the invoice never
// recorded). The fields basil left empty are filled in from the older
// ones; an object in basil's shape is left as it is.

// legacySubscription is what a subscription of an older API version
// says that basil's type does not read.
type legacySubscription struct {
	CurrentPeriodEnd int64 `json:"current_period_end"`
}

// fillLegacySubscription sets st's period end from raw when the items
// gave none.
func fillLegacySubscription(st *state, raw []byte) {
	if !st.PeriodEnd.IsZero() {
		return
	}
	var old legacySubscription
	if json.Unmarshal(raw, &old) == nil {
		st.PeriodEnd = unix(old.CurrentPeriodEnd)
	}
}

// legacyInvoice is what an invoice of an older API version says that
// basil's type does not read.
type legacyInvoice struct {
	Subscription        json.RawMessage `json:"subscription"`
	SubscriptionDetails *struct {
		Metadata map[string]string `json:"metadata"`
	} `json:"subscription_details"`
	Lines *struct {
		Data []struct {
			Price json.RawMessage `json:"price"`
		} `json:"data"`
	} `json:"lines"`
}

// idOf reads an expandable field: an id, or an object with an id.
func idOf(raw json.RawMessage) string {
	var id string
	if json.Unmarshal(raw, &id) == nil {
		return id
	}
	var obj struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return obj.ID
	}
	return ""
}

// fillLegacyInvoice sets inv's subscription and its lines' Prices from
// raw where basil's fields are empty.
func fillLegacyInvoice(inv *stripe.Invoice, raw []byte) {
	var old legacyInvoice
	if json.Unmarshal(raw, &old) != nil {
		return
	}
	if inv.Parent == nil || inv.Parent.SubscriptionDetails == nil {
		if id := idOf(old.Subscription); id != "" {
			d := &stripe.InvoiceParentSubscriptionDetails{Subscription: &stripe.Subscription{ID: id}}
			if old.SubscriptionDetails != nil {
				d.Metadata = old.SubscriptionDetails.Metadata
			}
			inv.Parent = &stripe.InvoiceParent{SubscriptionDetails: d, Type: "subscription_details"}
		}
	}
	if inv.Lines == nil || old.Lines == nil || len(inv.Lines.Data) != len(old.Lines.Data) {
		return
	}
	for i, l := range inv.Lines.Data {
		if l == nil || l.Pricing != nil && l.Pricing.PriceDetails != nil && l.Pricing.PriceDetails.Price != "" {
			continue
		}
		if id := idOf(old.Lines.Data[i].Price); id != "" {
			l.Pricing = &stripe.InvoiceLineItemPricing{PriceDetails: &stripe.InvoiceLineItemPricingPriceDetails{Price: id}, Type: "price_details"}
		}
	}
}
