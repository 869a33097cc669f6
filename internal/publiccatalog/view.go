package publiccatalog

import (
	"strings"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
)

// The public catalog's JSON (docs/wire-contract.md, "Public catalog").
// Field names are those of the marketplace of the platform this replaces
// where they overlap (logoUrl, coverImageUrl, cardMarketing.features[]
// with id, label, displayOrder, infoTooltip), camelCase like the rest of
// the wire contract otherwise. Amounts are strings holding exact
// decimals, so no client reads a price as a float; money is written with
// at least its currency's minor digits ("29.00") and never rounded.
// Nothing here is secret: no backend, secret, owner or alert, no private
// product and no service that is not public.

// ServiceList is the body of GET {base}/services.
type ServiceList struct {
	Services []Service `json:"services"`
}

// Service is one public service: its card, endpoints and products.
type Service struct {
	ID            string        `json:"id"`
	DisplayName   string        `json:"displayName"`
	Description   string        `json:"description,omitempty"`
	LogoURL       string        `json:"logoUrl,omitempty"`
	CoverImageURL string        `json:"coverImageUrl,omitempty"`
	CardMarketing CardMarketing `json:"cardMarketing"`
	Tags          []string      `json:"tags"`
	Endpoints     []Endpoint    `json:"endpoints"`
	Products      []Product     `json:"products"`
	// OpenAPIPath is where the service's OpenAPI document is served,
	// relative to the catalog's base: "services/{id}/openapi.json".
	OpenAPIPath string `json:"openapiPath"`
}

// CardMarketing is the card's marketing copy (upstream cardMarketing).
type CardMarketing struct {
	Features []Feature `json:"features"`
}

// Feature is one bullet of a card.
type Feature struct {
	ID           string `json:"id"`
	Label        string `json:"label"`
	DisplayOrder int    `json:"displayOrder"`
	InfoTooltip  string `json:"infoTooltip,omitempty"`
}

// Endpoint is one operation a caller invokes.
type Endpoint struct {
	ID      string   `json:"id"`
	Methods []string `json:"methods"`
	// InvokePath is the sync invoke route under the first gateway prefix;
	// AsyncInvokePath the async one, on async endpoints.
	InvokePath      string `json:"invokePath,omitempty"`
	AsyncInvokePath string `json:"asyncInvokePath,omitempty"`
	Async           bool   `json:"async"`
	AsyncOnly       bool   `json:"asyncOnly"`
	Streaming       bool   `json:"streaming"`
	WebSocket       bool   `json:"webSocket"`
	// Cost is the units one call counts (or reserves, when measured).
	Cost string `json:"cost"`
}

// Product is one product on sale.
type Product struct {
	ID              string `json:"id"`
	DisplayName     string `json:"displayName"`
	Description     string `json:"description,omitempty"`
	BillingModel    string `json:"billingModel"`
	MeasurementType string `json:"measurementType"`
	UnitLabel       string `json:"unitLabel,omitempty"`
	// Currency is the ISO 4217 code of Price, OveragePrice and UnitPrice;
	// absent when the product states no money.
	Currency string `json:"currency,omitempty"`
	// Price is what one Period costs; absent when nothing is charged per
	// period.
	Price  string `json:"price,omitempty"`
	Period string `json:"period"`
	// CalendarPeriods: periods start on calendar boundaries rather than
	// on the subscription's start.
	CalendarPeriods bool `json:"calendarPeriods"`
	// Quota is the units included per period; absent for no quota.
	Quota string `json:"quota,omitempty"`
	// Overage is "block" (refused past the quota) or "allow".
	Overage string `json:"overage"`
	// OveragePrice is the price of a unit past the quota (a SUBSCRIPTION
	// that allows overage); UnitPrice the price of every unit (usage
	// billing); CreditsPerUnit what a unit takes from a PREPAID balance.
	OveragePrice   string     `json:"overagePrice,omitempty"`
	UnitPrice      string     `json:"unitPrice,omitempty"`
	CreditsPerUnit string     `json:"creditsPerUnit,omitempty"`
	RateLimit      *RateLimit `json:"rateLimit,omitempty"`
	TrialDays      int        `json:"trialDays"`
	SelfService    bool       `json:"selfService"`
}

// RateLimit is a product's per-key rate limit.
type RateLimit struct {
	Requests      int `json:"requests"`
	WindowSeconds int `json:"windowSeconds"`
	Burst         int `json:"burst"`
}

// Options are what the views need beyond the catalog.
type Options struct {
	// GatewayPrefix is the prefix the invoke paths are written under
	// (the first configured gateway prefix).
	GatewayPrefix string
}

// List is the public services of the catalog, in configured order.
func List(c *catalog.Catalog, o Options) ServiceList {
	out := ServiceList{Services: []Service{}}
	for _, s := range c.Services() {
		if s.Public {
			out.Services = append(out.Services, View(s, o))
		}
	}
	return out
}

// View is one service as the public catalog shows it; the caller checks
// the service is public.
func View(s *catalog.Service, o Options) Service {
	v := Service{
		ID:            s.ID,
		DisplayName:   s.Name(),
		Description:   s.Description,
		LogoURL:       s.LogoURL,
		CoverImageURL: s.CoverImageURL,
		CardMarketing: CardMarketing{Features: []Feature{}},
		Tags:          append([]string{}, s.Tags...),
		Endpoints:     []Endpoint{},
		Products:      []Product{},
		OpenAPIPath:   "services/" + s.ID + "/openapi.json",
	}
	for _, f := range s.FeaturesInOrder() {
		v.CardMarketing.Features = append(v.CardMarketing.Features, Feature{
			ID: f.ID, Label: f.Label, DisplayOrder: f.DisplayOrder, InfoTooltip: f.InfoTooltip,
		})
	}
	for _, e := range s.Endpoints {
		v.Endpoints = append(v.Endpoints, endpointView(s, e, o))
	}
	for _, p := range s.Products {
		if s.Listed(p.ID) {
			l, _ := s.Listing(p.ID)
			v.Products = append(v.Products, ProductView(p, l))
		}
	}
	return v
}

// InvokePath is the sync invoke route of an endpoint under prefix.
func InvokePath(prefix, service, endpoint string) string {
	return strings.TrimRight(prefix, "/") + "/service/" + service + "/endpoint/" + endpoint + "/invoke"
}

// Methods are the endpoint's methods in a fixed order.
func Methods(e *catalog.Endpoint) []string {
	var out []string
	for _, m := range []string{"GET", "POST", "PUT", "DELETE"} {
		if e.Allows(m) {
			out = append(out, m)
		}
	}
	return out
}

func endpointView(s *catalog.Service, e *catalog.Endpoint, o Options) Endpoint {
	v := Endpoint{
		ID: e.ID, Methods: Methods(e), Async: e.Async, AsyncOnly: e.AsyncOnly,
		Streaming: e.Streaming, WebSocket: e.AllowUpgrade, Cost: e.UnitCost().String(),
	}
	invoke := InvokePath(o.GatewayPrefix, s.ID, e.ID)
	if !e.AsyncOnly {
		v.InvokePath = invoke
	}
	if e.Async {
		v.AsyncInvokePath = invoke + "/async"
	}
	return v
}

// ProductView is a product with its listing as the public catalog shows
// it.
func ProductView(p *billing.Product, l *catalog.ProductListing) Product {
	v := Product{
		ID:              p.ID,
		DisplayName:     l.Name(),
		Description:     l.Description,
		BillingModel:    p.BillingModel,
		MeasurementType: p.MeasurementType,
		UnitLabel:       p.UnitLabel,
		Period:          strings.ToLower(p.Period),
		CalendarPeriods: p.CalendarPeriods,
		Overage:         "block",
		TrialDays:       l.TrialDays,
		SelfService:     l.SelfService,
	}
	if v.Period == "" {
		v.Period = "month"
	}
	if p.OverageAllowed() {
		v.Overage = "allow"
	}
	if p.Quota != nil {
		v.Quota = p.Quota.String()
	}
	if m, ok := l.PeriodPriceMoney(); ok {
		v.Currency, v.Price = m.Currency, catalog.FormatAmount(m.Amount, m.Currency)
	}
	if m, ok := l.UnitPriceMoney(p); ok {
		v.Currency = m.Currency
		if p.BillingModel == billing.Subscription {
			v.OveragePrice = catalog.FormatAmount(m.Amount, m.Currency)
		} else {
			v.UnitPrice = catalog.FormatAmount(m.Amount, m.Currency)
		}
	}
	if p.BillingModel == billing.Prepaid && p.Price > 0 {
		v.CreditsPerUnit = p.Price.String()
	}
	if rl := p.RateLimit; rl != nil {
		v.RateLimit = &RateLimit{Requests: rl.Requests, WindowSeconds: int(rl.Window().Seconds()), Burst: rl.Capacity()}
	}
	return v
}
