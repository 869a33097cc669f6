package platform

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/openapidoc"
)

// The listing options of a service and of a product block: how the
// catalog is shown (internal/catalog/listing.go). Values are judged by
// the catalog's rules as they are read; the rules across options (a
// currency wherever a price is, self_service only where callers can see
// the product) are judged once the service block is read, at the
// product's line.

// parseServiceListing reads one listing option of a service block; false
// when name is not one.
func parseServiceListing(d *caddyfile.Dispenser, s *catalog.Service, name string) (bool, error) {
	var err error
	switch name {
	case "public":
		s.Public, err = flagArg(d)
	case "display_name":
		if s.DisplayName, err = oneArg(d); err == nil {
			err = checked(d, catalog.CheckText(name, s.DisplayName, catalog.MaxDisplayName, false))
		}
	case "description":
		if s.Description, err = oneArg(d); err == nil {
			err = checked(d, catalog.CheckText(name, s.Description, catalog.MaxDescription, true))
		}
	case "logo_url":
		if s.LogoURL, err = oneArg(d); err == nil {
			err = checked(d, catalog.CheckImageURL(name, s.LogoURL))
		}
	case "cover_image_url":
		if s.CoverImageURL, err = oneArg(d); err == nil {
			err = checked(d, catalog.CheckImageURL(name, s.CoverImageURL))
		}
	case "tags":
		err = parseTags(d, s)
	case "feature":
		err = parseFeature(d, s)
	case "openapi":
		if s.OpenAPI, err = oneArg(d); err == nil {
			// Read now for an error on this line; the app reads it again
			// at load, which is where a JSON config is checked.
			_, lerr := openapidoc.LoadFile(s.OpenAPI)
			err = checked(d, lerr)
		}
	default:
		return false, nil
	}
	return true, err
}

// parseTags reads `tags <tag>...`; tags may repeat and add up.
func parseTags(d *caddyfile.Dispenser, s *catalog.Service) error {
	tags, err := lineArgs(d, 1, -1)
	if err != nil {
		return err
	}
	for _, t := range tags {
		if err := checked(d, catalog.CheckTag(t)); err != nil {
			return err
		}
		for _, had := range s.Tags {
			if had == t {
				return d.Errf("tag '%s' given twice in service '%s'", t, s.ID)
			}
		}
		s.Tags = append(s.Tags, t)
	}
	if len(s.Tags) > catalog.MaxTags {
		return d.Errf("service '%s' has %d tags, more than %d", s.ID, len(s.Tags), catalog.MaxTags)
	}
	return nil
}

// parseFeature reads `feature <id> <label> [<tooltip>]`: the bullets are
// shown in the order they are written.
func parseFeature(d *caddyfile.Dispenser, s *catalog.Service) error {
	args, err := lineArgs(d, 2, 3)
	if err != nil {
		return err
	}
	f := &catalog.Feature{ID: args[0], Label: args[1], DisplayOrder: len(s.Features) + 1}
	if len(args) == 3 {
		f.InfoTooltip = args[2]
	}
	if err := checked(d, catalog.CheckFeature(f)); err != nil {
		return err
	}
	for _, had := range s.Features {
		if had.ID == f.ID {
			return d.Errf("feature '%s' declared twice in service '%s'", f.ID, s.ID)
		}
	}
	s.Features = append(s.Features, f)
	return nil
}

// parseProductListing reads one listing option of a product block into l;
// false when name is not one.
func parseProductListing(d *caddyfile.Dispenser, l *catalog.ProductListing, name string) (bool, error) {
	var err error
	switch name {
	case "display_name":
		if l.DisplayName, err = oneArg(d); err == nil {
			err = checked(d, catalog.CheckText(name, l.DisplayName, catalog.MaxDisplayName, false))
		}
	case "description":
		if l.Description, err = oneArg(d); err == nil {
			err = checked(d, catalog.CheckText(name, l.Description, catalog.MaxDescription, true))
		}
	case "currency":
		if l.Currency, err = oneArg(d); err == nil {
			err = checked(d, catalog.CheckCurrency(l.Currency))
		}
	case "period_price":
		var price billing.Units
		price, err = decimalArg(d)
		l.PeriodPrice = &price
	case "trial":
		l.TrialDays, err = trialArg(d)
	case "self_service":
		l.SelfService, err = flagArg(d)
	case "private":
		l.Private, err = flagArg(d)
	default:
		return false, nil
	}
	return true, err
}

// trialArg reads `trial <days>d` (or any Caddy duration of whole days).
func trialArg(d *caddyfile.Dispenser) (int, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	const day = 24 * time.Hour
	if err != nil || dur <= 0 || dur%day != 0 || dur/day > catalog.MaxTrialDays {
		return 0, d.Errf("trial '%s' must be whole days, 1d to %sd (e.g. 14d)", v, strconv.Itoa(catalog.MaxTrialDays))
	}
	return int(dur / day), nil
}
