package catalog

import (
	"cmp"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/billing"
)

// How the catalog is shown: a service's card (name, description, images,
// feature bullets, tags), whether it is public, and per product what a
// caller reads before buying (name, description, price in a currency,
// trial, whether they may take it themselves). The field names of the
// public catalog follow the marketplace of the platform this replaces
// where they overlap (logoUrl, coverImageUrl, cardMarketing.features[]);
// docs/wire-contract.md, "Public catalog", has that JSON.

// Feature is one bullet of a service's card (upstream
// cardMarketing.features[]).
type Feature struct {
	ID    string `json:"id"`
	Label string `json:"label"`
	// DisplayOrder sorts the bullets, lowest first; equal orders keep the
	// configured order.
	DisplayOrder int `json:"display_order,omitempty"`
	// InfoTooltip is shown beside the label, if set.
	InfoTooltip string `json:"info_tooltip,omitempty"`
}

// ProductListing is how one product of a service is sold (Caddyfile: the
// listing options of the product block). A product without one is listed
// under its id, with the price its billing states.
type ProductListing struct {
	Product     string `json:"product"`
	DisplayName string `json:"display_name,omitempty"`
	Description string `json:"description,omitempty"`
	// Currency is the ISO 4217 code of every money amount of the product:
	// PeriodPrice, and the product's unit price unless it is PREPAID
	// (whose price is in credits).
	Currency string `json:"currency,omitempty"`
	// PeriodPrice is what one period of the product costs (the quota's
	// period, a month by default), on top of any priced usage; nil when
	// the product has no recurring price.
	PeriodPrice *billing.Units `json:"period_price,omitempty"`
	// TrialDays is how long a new subscription is free; 0 for none.
	TrialDays int `json:"trial_days,omitempty"`
	// SelfService lets callers subscribe to the product themselves (the
	// storefront and payments); otherwise only the operator assigns it.
	SelfService bool `json:"self_service,omitempty"`
	// Private keeps the product out of the public catalog though its
	// service is public (a plan made for one customer).
	Private bool `json:"private,omitempty"`
}

// Limits of the listing's texts, in characters.
const (
	MaxDisplayName = 100
	MaxDescription = 2000
	MaxLabel       = 120
	MaxTooltip     = 500
	MaxTags        = 20
	MaxTrialDays   = 366
)

// CheckText checks a text shown to callers (what names it, and its limit):
// printable, no more than max characters; newlines only where multiline.
func CheckText(what, s string, max int, multiline bool) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not UTF-8 text", what)
	}
	if n := utf8.RuneCountInString(s); n > max {
		return fmt.Errorf("%s is %d characters, more than %d", what, n, max)
	}
	for _, c := range s {
		if !unicode.IsPrint(c) && !(multiline && (c == '\n' || c == '\t')) {
			return fmt.Errorf("%s holds a control character (%U)", what, c)
		}
	}
	return nil
}

// CheckImageURL checks a logo or cover image URL: an absolute http or
// https URL with no credentials, or a path on the same site ("/img/x.png").
func CheckImageURL(what, s string) error {
	u, err := url.Parse(s)
	switch {
	case err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil:
		return nil
	case err == nil && u.Scheme == "" && u.Host == "" && strings.HasPrefix(s, "/") && !strings.HasPrefix(s, "//"):
		return nil
	}
	return fmt.Errorf("%s '%s' must be an http or https URL, or a path starting with /", what, ShownURL(s))
}

var tagPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// CheckTag checks a tag: lower-case letters, digits and '-', at most 32.
func CheckTag(tag string) error {
	if !tagPattern.MatchString(tag) {
		return fmt.Errorf("tag '%s': lower-case letters, digits and '-' only, at most 32", tag)
	}
	return nil
}

// CheckFeature checks a feature bullet on its own.
func CheckFeature(f *Feature) error {
	if err := CheckID("feature", f.ID); err != nil {
		return err
	}
	if f.Label == "" {
		return fmt.Errorf("feature %s has no label", f.ID)
	}
	if err := CheckText("feature "+f.ID+" label", f.Label, MaxLabel, false); err != nil {
		return err
	}
	if err := CheckText("feature "+f.ID+" tooltip", f.InfoTooltip, MaxTooltip, false); err != nil {
		return err
	}
	if f.DisplayOrder < 0 {
		return fmt.Errorf("feature %s: display order %d is negative", f.ID, f.DisplayOrder)
	}
	return nil
}

// CheckListing checks a product's listing against the product and its
// service's visibility: the one rule set both the Caddyfile parser and
// Compile apply. public is whether the service is public.
//
//   - a currency is an ISO 4217 code, and there is one wherever a money
//     price is: a period price, and the unit price of a product that is
//     not PREPAID once the product is shown (public service, not private);
//   - a product is not both self_service and private, and self_service
//     only on a public service: a caller cannot take what they cannot see;
//   - a trial is 0 to 366 days.
func CheckListing(l *ProductListing, p *billing.Product, public bool) error {
	if err := CheckText("display_name", l.DisplayName, MaxDisplayName, false); err != nil {
		return err
	}
	if err := CheckText("description", l.Description, MaxDescription, true); err != nil {
		return err
	}
	if l.Currency != "" {
		if err := CheckCurrency(l.Currency); err != nil {
			return err
		}
	}
	if l.PeriodPrice != nil {
		if *l.PeriodPrice < 0 || *l.PeriodPrice > billing.MaxUnits {
			return fmt.Errorf("period_price %s is out of range", l.PeriodPrice)
		}
		if l.Currency == "" {
			return fmt.Errorf("period_price %s has no currency (currency USD, EUR, ...)", l.PeriodPrice)
		}
	}
	shown := public && !l.Private
	if shown && chargesMoneyPerUnit(p) && l.Currency == "" {
		return fmt.Errorf("price %s is money on a %s product shown in the public catalog: it needs a currency (currency USD, EUR, ...)", p.Price, p.BillingModel)
	}
	if l.TrialDays < 0 || l.TrialDays > MaxTrialDays {
		return fmt.Errorf("trial of %d days: 0 to %d", l.TrialDays, MaxTrialDays)
	}
	switch {
	case l.SelfService && l.Private:
		return fmt.Errorf("self_service and private together: callers cannot take a product they cannot see")
	case l.SelfService && !public:
		return fmt.Errorf("self_service on a service that is not public: callers cannot take a product they cannot see (add public to the service)")
	}
	return nil
}

// compileListing checks the service's presentation and its products'
// listings, and orders the feature bullets.
func (s *Service) compileListing() error {
	if err := CheckText("display_name", s.DisplayName, MaxDisplayName, false); err != nil {
		return fmt.Errorf("service %s: %w", s.ID, err)
	}
	if err := CheckText("description", s.Description, MaxDescription, true); err != nil {
		return fmt.Errorf("service %s: %w", s.ID, err)
	}
	if s.LogoURL != "" {
		if err := CheckImageURL("logo_url", s.LogoURL); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
	}
	if s.CoverImageURL != "" {
		if err := CheckImageURL("cover_image_url", s.CoverImageURL); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
	}
	if len(s.Tags) > MaxTags {
		return fmt.Errorf("service %s: %d tags, more than %d", s.ID, len(s.Tags), MaxTags)
	}
	for i, t := range s.Tags {
		if err := CheckTag(t); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
		if slices.Contains(s.Tags[:i], t) {
			return fmt.Errorf("service %s: tag %s given twice", s.ID, t)
		}
	}
	seen := make(map[string]bool, len(s.Features))
	for _, f := range s.Features {
		if f == nil {
			return fmt.Errorf("service %s: empty feature", s.ID)
		}
		if err := CheckFeature(f); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
		if seen[f.ID] {
			return fmt.Errorf("service %s: feature %s declared twice", s.ID, f.ID)
		}
		seen[f.ID] = true
	}
	s.features = slices.Clone(s.Features)
	slices.SortStableFunc(s.features, func(a, b *Feature) int { return cmp.Compare(a.DisplayOrder, b.DisplayOrder) })

	s.listings = make(map[string]*ProductListing, len(s.Products))
	for _, l := range s.ProductListings {
		if l == nil {
			return fmt.Errorf("service %s: empty product listing", s.ID)
		}
		if _, ok := s.products[l.Product]; !ok {
			return fmt.Errorf("service %s: listing for product %q, which the service does not have", s.ID, l.Product)
		}
		if _, dup := s.listings[l.Product]; dup {
			return fmt.Errorf("service %s: listing for product %s given twice", s.ID, l.Product)
		}
		s.listings[l.Product] = l
	}
	// Every product is held to the rules, listed or not: a public
	// service's product with a money price and no listing has no currency.
	for _, p := range s.Products {
		l, ok := s.listings[p.ID]
		if !ok {
			l = &ProductListing{Product: p.ID}
			s.listings[p.ID] = l
		}
		if err := CheckListing(l, p, s.Public); err != nil {
			return fmt.Errorf("service %s: product %s: %w", s.ID, p.ID, err)
		}
		p.Currency = l.Currency
	}
	return nil
}

// FeaturesInOrder are the service's feature bullets sorted by display
// order; the slice is the catalog's own.
func (s *Service) FeaturesInOrder() []*Feature { return s.features }

// Listing is how the product is sold: its configured listing, or an empty
// one naming it (every product of a compiled service has one).
func (s *Service) Listing(productID string) (*ProductListing, bool) {
	l, ok := s.listings[productID]
	return l, ok
}

// Listed reports whether the product appears in the public catalog: its
// service is public and the product is not private.
func (s *Service) Listed(productID string) bool {
	l, ok := s.listings[productID]
	return ok && s.Public && !l.Private
}

// Name is what the service is called for humans: its display name, or its
// id when it has none.
func (s *Service) Name() string { return cmp.Or(s.DisplayName, s.ID) }

// Name is what the product is called for humans: the display name, or
// the product id.
func (l *ProductListing) Name() string { return cmp.Or(l.DisplayName, l.Product) }

// PeriodPriceMoney is the price of one period with its currency; false
// when the product has none.
func (l *ProductListing) PeriodPriceMoney() (Money, bool) {
	if l.PeriodPrice == nil {
		return Money{}, false
	}
	return Money{Amount: *l.PeriodPrice, Currency: l.Currency}, true
}

// UnitPriceMoney is the product's unit price as money (a usage price, or
// the overage price of a SUBSCRIPTION that allows overage); false for a
// PREPAID product, whose price is credits, and for a product with no
// price.
func (l *ProductListing) UnitPriceMoney(p *billing.Product) (Money, bool) {
	if !chargesMoneyPerUnit(p) || l.Currency == "" {
		return Money{}, false
	}
	return Money{Amount: p.Price, Currency: l.Currency}, true
}

// chargesMoneyPerUnit reports whether the product's price is money that a
// caller may be billed: a usage price, or a SUBSCRIPTION's overage price
// when it has a quota and allows overage. A PREPAID price is credits; a
// SUBSCRIPTION that blocks at its quota, or has none, never bills its
// price (billing prices only the units past a quota).
func chargesMoneyPerUnit(p *billing.Product) bool {
	switch {
	case p.Price <= 0 || p.BillingModel == billing.Prepaid:
		return false
	case p.BillingModel == billing.Subscription:
		return p.Quota != nil && p.OverageAllowed()
	}
	return true
}

// Offer is how a caller may take a product themselves, the one rule the
// portal's plans page and the storefront's call to action both ask.
type Offer int

// The offers.
const (
	// NotOffered: only the operator assigns the product (it is not
	// self_service, is private, or its service is not public).
	NotOffered Offer = iota
	// OfferFree: self_service and costs no money; taken at once.
	OfferFree
	// OfferTrial: self_service with a trial; taken at once, on trial.
	OfferTrial
	// OfferPaid: self_service but costs money (a period price, a money
	// unit price, or prepaid credits to buy); taken through payments,
	// and until those are configured by asking the operator.
	OfferPaid
)

// SelfServiceOffer is how a caller may take the product themselves. A
// trial comes before the price: the trial is what a caller takes at once.
func (s *Service) SelfServiceOffer(productID string) Offer {
	l, ok := s.listings[productID]
	p, found := s.Product(productID)
	if !ok || !found || !s.Listed(productID) || !l.SelfService {
		return NotOffered
	}
	switch {
	case l.TrialDays > 0:
		return OfferTrial
	case l.CostsMoney(p):
		return OfferPaid
	}
	return OfferFree
}

// CostsMoney reports whether a subscription to p may cost its caller
// money: a period price above zero, a unit price billed as money, or a
// prepaid price, whose credits are bought.
func (l *ProductListing) CostsMoney(p *billing.Product) bool {
	return l.PeriodPrice != nil && *l.PeriodPrice > 0 || chargesMoneyPerUnit(p) ||
		p.BillingModel == billing.Prepaid && p.Price > 0
}

// Pricier reports whether product a of the service costs more than b, so
// that moving from b to a is an upgrade: a higher period price, then at
// the same a higher unit price, then a larger quota (none is unlimited).
func (s *Service) Pricier(a, b string) bool {
	pa, okA := s.Product(a)
	pb, okB := s.Product(b)
	la := s.listings[a]
	lb := s.listings[b]
	if !okA || !okB || la == nil || lb == nil {
		return false
	}
	var perA, perB billing.Units
	if la.PeriodPrice != nil {
		perA = *la.PeriodPrice
	}
	if lb.PeriodPrice != nil {
		perB = *lb.PeriodPrice
	}
	if perA != perB {
		return perA > perB
	}
	if pa.Price != pb.Price {
		return pa.Price > pb.Price
	}
	switch {
	case pa.Quota == nil:
		return pb.Quota != nil
	case pb.Quota == nil:
		return false
	}
	return *pa.Quota > *pb.Quota
}

// TrialWords says a product's trial of days as it is served
// (subscription.TrialTerms): "14-day free trial", and when the plan
// charges for some calls, that a trial does not: "nothing is charged"
// and, with a quota whose further calls would be charged, that they are
// refused in the trial. The storefront and the portal both say it so.
func TrialWords(days int, p *billing.Product) string {
	w := strconv.Itoa(days) + "-day free trial"
	charged := p.Price > 0 && (p.BillingModel != billing.Subscription || p.Quota != nil && p.OverageAllowed())
	switch {
	case !charged:
		return w
	case p.Quota != nil && p.OverageAllowed():
		return w + ": nothing is charged, and calls past the quota are refused until it ends"
	case p.BillingModel == billing.Prepaid:
		return w + ": calls take no credits until it ends"
	}
	return w + ": calls cost nothing until it ends"
}
