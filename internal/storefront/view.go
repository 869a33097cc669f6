package storefront

import (
	"cmp"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/publiccatalog"
)

// What the pages show, built from the catalog once per config load. Only
// public services and their listed products ever get here: shop is the
// one place that asks the catalog, and it asks s.Public and s.Listed,
// the rules the public catalog's JSON follows too.

// shop is the storefront's content.
type shop struct {
	cards    []*card
	services map[string]*servicePage
	tags     []string // every tag of a public service, sorted
}

// card is one service on the front page.
type card struct {
	ID, Name, Description string
	Logo                  string // a URL the CSP lets the page load; "" for a monogram
	Initial               string // the monogram's letter
	Tags                  []string
	Features              []feature
	Plans                 int
	FromFree              bool // some plan is free
	haystack              string
}

// servicePage is one service's page.
type servicePage struct {
	*card
	Cover     string
	Plans     []plan
	Endpoints []endpoint
	// Reference and OpenAPI are the public catalog's API reference page
	// and document of the service; "" when no catalog_url is configured.
	Reference, OpenAPI string
	// SelfService: some plan may be taken by the caller (the catalog's
	// Service.SelfServiceOffer), so the call to action is "Subscribe" to
	// the portal's plans page of the service.
	SelfService bool
	// PaysOnline: a plan that costs money is paid in the portal through
	// Stripe Checkout, not asked of the operator.
	PaysOnline bool
}

type feature struct{ Label, Tooltip string }

// plan is one listed product, as a caller compares it with the others.
type plan struct {
	ID, Name, Description string
	// Price is the headline: money with its ISO code ("29.00 USD"),
	// "Free", or "Prepaid credits"; never a bare number.
	Price string
	Per   string // "per month", "per token"; "" with Free and credits
	Terms []string
	Trial string
}

type endpoint struct {
	ID, Methods, Path, AsyncPath string
	// Charge says what a call counts: its cost on per-request plans, and
	// on plans that measure their units only what is held up front.
	Charge               string
	Streaming, WebSocket bool
}

// options are what the pages need beyond the catalog.
type options struct {
	gatewayPrefix string
	catalogURL    string
	imageOrigins  []string
	// sells reports whether a product is paid through Stripe (the
	// platform app's payments block); nil without one.
	sells func(serviceID, productID string) bool
}

func newShop(c *catalog.Catalog, o options) *shop {
	sh := &shop{services: map[string]*servicePage{}}
	for _, s := range c.Services() {
		if !s.Public {
			continue
		}
		page := servicePage{card: newCard(s, o)}
		var perRequest, measured bool
		if s.CoverImageURL != "" && imageAllowed(s.CoverImageURL, o.imageOrigins) {
			page.Cover = s.CoverImageURL
		}
		for _, p := range s.Products {
			if !s.Listed(p.ID) {
				continue
			}
			l, _ := s.Listing(p.ID)
			pl := planOf(p, l)
			if p.MeasurementType == billing.PerRequest {
				perRequest = true
			} else {
				measured = true
			}
			page.Plans = append(page.Plans, pl)
			if pl.Price == "Free" {
				page.FromFree = true
			}
			if s.SelfServiceOffer(p.ID) != catalog.NotOffered {
				page.SelfService = true
				if o.sells != nil && o.sells(s.ID, p.ID) {
					page.PaysOnline = true
				}
			}
		}
		page.card.Plans = len(page.Plans)
		for _, e := range s.Endpoints {
			page.Endpoints = append(page.Endpoints, endpointOf(s, e, o.gatewayPrefix, perRequest || !measured, measured))
		}
		if o.catalogURL != "" {
			base := strings.TrimRight(o.catalogURL, "/") + "/services/" + url.PathEscape(s.ID)
			page.Reference, page.OpenAPI = base+"/docs", base+"/openapi.json"
		}
		sh.cards = append(sh.cards, page.card)
		sh.services[s.ID] = &page
		for _, t := range s.Tags {
			if !slices.Contains(sh.tags, t) {
				sh.tags = append(sh.tags, t)
			}
		}
	}
	slices.Sort(sh.tags)
	return sh
}

func newCard(s *catalog.Service, o options) *card {
	c := &card{ID: s.ID, Name: s.Name(), Description: s.Description, Tags: s.Tags}
	if s.LogoURL != "" && imageAllowed(s.LogoURL, o.imageOrigins) {
		c.Logo = s.LogoURL
	}
	for _, r := range c.Name {
		c.Initial = strings.ToUpper(string(r))
		break
	}
	words := []string{s.ID, s.Name(), s.Description}
	words = append(words, s.Tags...)
	for _, f := range s.FeaturesInOrder() {
		c.Features = append(c.Features, feature{Label: f.Label, Tooltip: f.InfoTooltip})
		words = append(words, f.Label, f.InfoTooltip)
	}
	c.haystack = strings.ToLower(strings.Join(words, "\n"))
	return c
}

// filter is the cards matching a search (words, all of which must occur
// in the service's name, id, description, tags or features, case
// folded) and a tag ("" for any).
func (sh *shop) filter(q, tag string) []*card {
	words := strings.Fields(strings.ToLower(q))
	var out []*card
	for _, c := range sh.cards {
		if tag != "" && !slices.Contains(c.Tags, tag) {
			continue
		}
		ok := true
		for _, w := range words {
			if !strings.Contains(c.haystack, w) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, c)
		}
	}
	return out
}

// imageAllowed reports whether the page may show an image URL under its
// Content-Security-Policy: a path on this site, or a URL on one of the
// configured image origins. The gateway never fetches it; the browser
// does, and only from where the operator said.
func imageAllowed(raw string, origins []string) bool {
	if strings.HasPrefix(raw, "/") && !strings.HasPrefix(raw, "//") {
		return true
	}
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	return slices.Contains(origins, u.Scheme+"://"+u.Host)
}

// planOf states a product's terms in words, every money amount with its
// currency (catalog.Money), so no price reads as a bare number.
func planOf(p *billing.Product, l *catalog.ProductListing) plan {
	pl := plan{ID: p.ID, Name: l.Name(), Description: l.Description}
	period := cmp.Or(strings.ToLower(p.Period), "month")
	unit := cmp.Or(p.UnitLabel, "unit")
	periodMoney, hasPeriodPrice := l.PeriodPriceMoney()
	// A period price of 0 is no fee: the plan is free, as the catalog
	// offers it (CostsMoney) and the portal shows it.
	hasPeriodPrice = hasPeriodPrice && periodMoney.Amount > 0
	unitMoney, hasUnitPrice := l.UnitPriceMoney(p)
	prepaid := p.BillingModel == billing.Prepaid && p.Price > 0
	switch {
	case hasPeriodPrice:
		pl.Price, pl.Per = periodMoney.String(), "per "+period
	case hasUnitPrice && p.BillingModel != billing.Subscription:
		pl.Price, pl.Per = unitMoney.String(), "per "+unit
	case prepaid:
		pl.Price = "Prepaid credits"
	default:
		pl.Price = "Free"
	}
	if p.Quota != nil {
		pl.Terms = append(pl.Terms, quotaTerms(p, unit, period, unitMoney, hasUnitPrice)...)
	}
	if hasPeriodPrice && hasUnitPrice && p.BillingModel != billing.Subscription {
		pl.Terms = append(pl.Terms, "Plus "+unitMoney.String()+" per "+unit)
	}
	if prepaid {
		pl.Terms = append(pl.Terms, "Each "+unit+" takes "+p.Price.String()+" "+plural("credit", p.Price)+" from your prepaid balance")
	}
	switch {
	case p.SpendingCap != nil && p.BillingModel == billing.Prepaid:
		// A prepaid product spends credits, and its cap counts them.
		pl.Terms = append(pl.Terms, "Spending capped at "+p.SpendingCap.String()+" "+plural("credit", *p.SpendingCap)+" per "+period)
	case p.SpendingCap != nil && l.Currency != "":
		pl.Terms = append(pl.Terms, "Spending capped at "+catalog.Money{Amount: *p.SpendingCap, Currency: l.Currency}.String()+" per "+period)
	}
	if rl := p.RateLimit; rl != nil {
		window := "second"
		if secs := int(rl.Window().Seconds()); secs != 1 {
			window = strconv.Itoa(secs) + " seconds"
		}
		pl.Terms = append(pl.Terms, "Up to "+strconv.Itoa(rl.Requests)+" "+plural("request", billing.Whole(int64(rl.Requests)))+" per "+window+
			", bursts of "+strconv.Itoa(rl.Capacity()))
	}
	if l.TrialDays > 0 {
		pl.Trial = catalog.TrialWords(l.TrialDays, p)
	}
	return pl
}

// quotaTerms states a quota as billing applies it (billing.Decide): a
// SUBSCRIPTION prices only the units past its quota, so the quota is
// included in the plan; every other model prices every unit, inside the
// quota too, so a priced quota includes nothing and past it (overage
// allowed) calls cost the same.
func quotaTerms(p *billing.Product, unit, period string, unitMoney catalog.Money, hasUnitPrice bool) []string {
	q := p.Quota.Grouped() + " " + plural(unit, *p.Quota)
	var terms []string
	if p.BillingModel == billing.Subscription || p.Price == 0 {
		terms = append(terms, q+" included per "+period)
	} else {
		terms = append(terms, "Quota of "+q+" per "+period+", each one charged")
	}
	switch {
	case !p.OverageAllowed():
		terms = append(terms, "Calls past the quota are refused until the next "+period)
	case p.BillingModel != billing.Subscription && p.Price > 0:
		terms = append(terms, "Calls past the quota go on at the same price")
	case hasUnitPrice:
		terms = append(terms, "Past the quota: "+unitMoney.String()+" per "+unit)
	}
	return terms
}

func plural(unit string, n billing.Units) string {
	if n == billing.Whole(1) || strings.HasSuffix(unit, "s") {
		return unit
	}
	return unit + "s"
}

// endpointOf is an endpoint as a caller calls it. perRequest and
// measured say whether the service's listed plans count a call by the
// endpoint's cost (PER_REQUEST) or by what the call uses (the other
// measurements, where the cost is only held up front).
func endpointOf(s *catalog.Service, e *catalog.Endpoint, prefix string, perRequest, measured bool) endpoint {
	v := endpoint{
		ID: e.ID, Methods: strings.Join(publiccatalog.Methods(e), " "), Charge: callCharge(e.UnitCost(), perRequest, measured),
		Streaming: e.Streaming, WebSocket: e.AllowUpgrade,
	}
	invoke := publiccatalog.InvokePath(prefix, s.ID, e.ID)
	if !e.AsyncOnly {
		v.Path = invoke
	}
	if e.Async {
		v.AsyncPath = invoke + "/async"
	}
	return v
}

// callCharge says what one call of an endpoint of the given cost counts.
func callCharge(cost billing.Units, perRequest, measured bool) string {
	n := cost.String() + " " + plural("unit", cost)
	switch {
	case !measured:
		return n + " per call"
	case !perRequest:
		return "Charged by what each call uses (" + n + " held while it runs)"
	}
	return n + " per call on per-request plans; other plans charge what each call uses"
}
