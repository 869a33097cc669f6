package platform

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/platformgw/gateway/internal/alerts"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
)

// The catalog's part of the platform block: `service` with its endpoints
// and products. Each value is judged by the catalog's own rules
// (internal/catalog/rules.go) or billing's; the parser only adds the line.

// parseService reads `service <id> { … }`.
func parseService(d *caddyfile.Dispenser) (*catalog.Service, error) {
	at := d.Token()
	id, err := idArg(d, "service")
	if err != nil {
		return nil, err
	}
	s := &catalog.Service{ID: id}
	seen := settings{block: fmt.Sprintf("service '%s'", id)}
	endpoints := make(map[string]int)
	products := make(map[string]int)
	productAt := make(map[string]caddyfile.Token)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name != "owners" && name != "endpoint" && name != "product" && name != "tags" && name != "feature" {
			if err := seen.once(d); err != nil {
				return nil, err
			}
		}
		if ok, err := parseServiceListing(d, s, name); ok {
			if err != nil {
				return nil, err
			}
			continue
		}
		switch name {
		case "backend":
			if s.Backend, err = oneArg(d); err == nil {
				_, cerr := catalog.CheckBackend(s.Backend)
				err = checked(d, cerr)
			}
		case "secret":
			if s.Secrets, err = lineArgs(d, 1, 2); err == nil {
				err = checked(d, catalog.CheckSecrets(s.Secrets))
			}
		case "sync_response":
			s.SyncResponse, err = enumArg(d, strings.ToLower, syncResponses)
		case "owners":
			var owners []string
			if owners, err = lineArgs(d, 1, -1); err == nil {
				for _, o := range owners {
					if err = checked(d, catalog.CheckOwner(o)); err != nil {
						break
					}
				}
				s.Owners = append(s.Owners, owners...)
			}
		case "endpoint":
			var e *catalog.Endpoint
			at := d.Token()
			if e, err = parseEndpoint(d, id); err != nil {
				break
			}
			if first, dup := endpoints[e.ID]; dup {
				err = errAt(at, "endpoint '%s' declared twice in service '%s' (first on line %d)", e.ID, id, first)
				break
			}
			endpoints[e.ID] = at.Line
			s.Endpoints = append(s.Endpoints, e)
		case "product":
			var p *billing.Product
			var listing *catalog.ProductListing
			var thresholds []alerts.Threshold
			at := d.Token()
			if p, listing, thresholds, err = parseProduct(d, id); err != nil {
				break
			}
			if first, dup := products[p.ID]; dup {
				err = errAt(at, "product '%s' declared twice in service '%s' (first on line %d)", p.ID, id, first)
				break
			}
			products[p.ID] = at.Line
			productAt[p.ID] = at
			s.Products = append(s.Products, p)
			if listing != nil {
				s.ProductListings = append(s.ProductListings, listing)
			}
			if len(thresholds) > 0 {
				s.Alerts = append(s.Alerts, &catalog.ProductAlerts{Product: p.ID, Thresholds: thresholds})
			}
		default:
			err = seen.unknown(d)
		}
		if err != nil {
			return nil, err
		}
	}
	switch {
	case s.Backend == "":
		return nil, errAt(at, "service '%s' has no backend", id)
	case len(s.Secrets) == 0:
		return nil, errAt(at, "service '%s' has no secret", id)
	case len(s.Endpoints) == 0:
		return nil, errAt(at, "service '%s' has no endpoint", id)
	}
	return s, checkListings(s, productAt)
}

// checkListings judges each product's listing against its product and
// the service's visibility, once the whole service block is read (public
// may come after the products), at the product's line.
func checkListings(s *catalog.Service, productAt map[string]caddyfile.Token) error {
	listings := make(map[string]*catalog.ProductListing, len(s.ProductListings))
	for _, l := range s.ProductListings {
		listings[l.Product] = l
	}
	for _, p := range s.Products {
		l := listings[p.ID]
		if l == nil {
			l = &catalog.ProductListing{Product: p.ID}
		}
		if err := catalog.CheckListing(l, p, s.Public); err != nil {
			return errAt(productAt[p.ID], "product '%s' of service '%s': %v", p.ID, s.ID, err)
		}
	}
	return nil
}

// parseEndpoint reads `endpoint <id> [{ … }]`.
func parseEndpoint(d *caddyfile.Dispenser, service string) (*catalog.Endpoint, error) {
	id, err := idArg(d, "endpoint")
	if err != nil {
		return nil, err
	}
	e := &catalog.Endpoint{ID: id}
	seen := settings{block: fmt.Sprintf("endpoint '%s' of service '%s'", id, service)}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.once(d); err != nil {
			return nil, err
		}
		switch d.Val() {
		case "methods":
			var methods []string
			if methods, err = lineArgs(d, 1, -1); err != nil {
				break
			}
			for _, m := range methods {
				if m, err = catalog.CheckMethod(m); err != nil {
					return nil, checked(d, err)
				}
				if !slices.Contains(e.Methods, m) {
					e.Methods = append(e.Methods, m)
				}
			}
		case "path":
			if e.Path, err = oneArg(d); err == nil {
				err = checked(d, catalog.CheckPath(e.Path))
			}
		case "cost":
			var cost billing.Units
			cost, err = decimalArg(d)
			e.Cost = &cost
		case "async":
			// `async` allows /invoke/async beside /invoke; `async only`
			// allows nothing else.
			var args []string
			if args, err = lineArgs(d, 0, 1); err == nil {
				e.Async = true
				if len(args) == 1 {
					if args[0] != "only" {
						err = d.Errf("async: unexpected '%s' (want nothing or 'only')", args[0])
					}
					e.AsyncOnly = true
				}
			}
		case "streaming":
			e.Streaming, err = flagArg(d)
		case "allow_upgrade":
			e.AllowUpgrade, err = flagArg(d)
		case "sync_response":
			e.SyncResponse, err = enumArg(d, strings.ToLower, syncResponses)
		default:
			err = seen.unknown(d)
		}
		if err != nil {
			return nil, err
		}
	}
	return e, nil
}

var (
	billingModels    = billing.BillingModels()
	measurementTypes = billing.MeasurementTypes()
	periods          = billing.Periods()
	overages         = billing.Overages()
	syncResponses    = []string{catalog.SyncRaw, catalog.SyncWrapped}
)

// parseProduct reads `product <id> { … }` and checks it, and its alert
// thresholds, as the catalog will.
func parseProduct(d *caddyfile.Dispenser, service string) (*billing.Product, *catalog.ProductListing, []alerts.Threshold, error) {
	p, listing, lines, err := parseProductBlock(d, service)
	if err != nil {
		return nil, nil, nil, err
	}
	var all []alerts.Threshold
	first := make(map[string]int)
	for _, l := range lines {
		for _, t := range l.thresholds {
			if err := t.Validate(*p); err != nil {
				return nil, nil, nil, errAt(l.at, "product '%s' of service '%s': %v", p.ID, service, err)
			}
			if line, dup := first[t.String()]; dup {
				return nil, nil, nil, errAt(l.at, "alert %s given twice in product '%s' of service '%s' (first on line %d)", t, p.ID, service, line)
			}
			first[t.String()] = l.at.Line
			all = append(all, t)
		}
	}
	return p, listing, all, nil
}

// alertLine is one `alert` line of a product block, kept with its token
// so that a threshold the finished product refuses is reported on its line.
type alertLine struct {
	at         caddyfile.Token
	thresholds []alerts.Threshold
}

// parseProductBlock reads the product block: the product, its listing
// (nil when the block sets no listing option) and its alert lines.
func parseProductBlock(d *caddyfile.Dispenser, service string) (*billing.Product, *catalog.ProductListing, []alertLine, error) {
	at := d.Token()
	id, err := idArg(d, "product")
	if err != nil {
		return nil, nil, nil, err
	}
	p := &billing.Product{ID: id}
	listing := &catalog.ProductListing{Product: id}
	listed := false
	var lines []alertLine
	seen := settings{block: fmt.Sprintf("product '%s' of service '%s'", id, service)}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if d.Val() != "alert" {
			if err := seen.once(d); err != nil {
				return nil, nil, nil, err
			}
		}
		if ok, err := parseProductListing(d, listing, d.Val()); ok {
			if err != nil {
				return nil, nil, nil, err
			}
			listed = true
			continue
		}
		switch d.Val() {
		case "alert":
			tok := d.Token()
			var args []string
			if args, err = lineArgs(d, 2, -1); err != nil {
				break
			}
			var ts []alerts.Threshold
			if ts, err = alerts.Parse(args[0], args[1:]); err != nil {
				err = errAt(tok, "%v", err)
				break
			}
			lines = append(lines, alertLine{at: tok, thresholds: ts})
		case "billing":
			p.BillingModel, err = enumArg(d, strings.ToUpper, billingModels)
		case "measurement":
			p.MeasurementType, err = enumArg(d, strings.ToUpper, measurementTypes)
		case "unit":
			if p.UnitLabel, err = oneArg(d); err == nil {
				err = checked(d, billing.CheckUnitLabel(p.UnitLabel))
			}
		case "quota":
			err = parseQuota(d, p)
		case "calendar_periods":
			p.CalendarPeriods, err = flagArg(d)
		case "overage":
			p.Overage, err = enumArg(d, strings.ToLower, overages)
		case "price":
			p.Price, err = decimalArg(d)
		case "spending_cap":
			var limit billing.Units
			limit, err = decimalArg(d)
			p.SpendingCap = &limit
		case "rate_limit":
			p.RateLimit, err = parseRateLimitArgs(d)
		default:
			err = seen.unknown(d)
		}
		if err != nil {
			return nil, nil, nil, err
		}
	}
	switch {
	case p.BillingModel == "":
		return nil, nil, nil, errAt(at, "product '%s' of service '%s' has no billing model (billing %s)", id, service, strings.Join(billingModels, "|"))
	case p.MeasurementType == "":
		return nil, nil, nil, errAt(at, "product '%s' of service '%s' has no measurement type (measurement %s)", id, service, strings.Join(measurementTypes, "|"))
	}
	if err := p.Validate(); err != nil {
		return nil, nil, nil, errAt(at, "service '%s': %v", service, err)
	}
	if !listed {
		listing = nil
	}
	return p, listing, lines, nil
}

// parseQuota reads `quota <decimal> [per <period>]`.
func parseQuota(d *caddyfile.Dispenser, p *billing.Product) error {
	args, err := lineArgs(d, 1, 3)
	if err != nil {
		return err
	}
	quota, err := billing.ParseUnits(args[0])
	if err != nil {
		return d.Errf("quota '%s': %v", args[0], err)
	}
	p.Quota = &quota
	switch {
	case len(args) == 1:
	case len(args) == 3 && args[1] == "per":
		period := strings.ToLower(args[2])
		if !slices.Contains(periods, period) {
			return d.Errf("quota period '%s' is not one of %s", args[2], strings.Join(periods, ", "))
		}
		p.Period = period
	default:
		return d.Errf("quota takes <decimal> [per day|week|month|year], got '%s'", strings.Join(args, " "))
	}
	return nil
}

// parseRateLimitArgs reads `rate_limit <n>/<window> [burst <n>]`.
func parseRateLimitArgs(d *caddyfile.Dispenser) (*billing.RateLimit, error) {
	args, err := lineArgs(d, 1, 3)
	if err != nil {
		return nil, err
	}
	rl, err := parseRate(args[0])
	if err != nil {
		return nil, d.Errf("rate_limit '%s': %v", args[0], err)
	}
	switch {
	case len(args) == 1:
	case len(args) == 3 && args[1] == "burst":
		burst, err := strconv.Atoi(args[2])
		if err != nil || burst <= 0 {
			return nil, d.Errf("rate_limit burst '%s' must be a positive whole number", args[2])
		}
		rl.Burst = burst
	default:
		return nil, d.Errf("rate_limit takes <n>/<window> [burst <n>], got '%s'", strings.Join(args, " "))
	}
	return rl, nil
}

// parseRate parses a request rate: "10/s", "600/m", "1000/h", "5000/d", or
// a count over any Caddy duration that is a whole number of seconds,
// "100/10s".
func parseRate(s string) (*billing.RateLimit, error) {
	count, window, ok := strings.Cut(s, "/")
	orig := window
	if !ok {
		return nil, fmt.Errorf("want <requests>/<window> such as 10/s or 100/10s")
	}
	requests, err := strconv.Atoi(count)
	if err != nil || requests <= 0 {
		return nil, fmt.Errorf("request count '%s' must be a positive whole number", count)
	}
	if window != "" && !unicode.IsDigit(rune(window[0])) && window[0] != '.' {
		window = "1" + window // "s" is one second
	}
	dur, err := caddy.ParseDuration(window)
	if err != nil {
		return nil, fmt.Errorf("window '%s' is not a duration (s, m, h, d or e.g. 10s)", orig)
	}
	if dur < time.Second || dur%time.Second != 0 || dur/time.Second > math.MaxInt32 {
		return nil, fmt.Errorf("window '%s' must be a whole number of seconds, at least 1s", orig)
	}
	return &billing.RateLimit{Requests: requests, WindowSeconds: int(dur / time.Second)}, nil
}
