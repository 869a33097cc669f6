package platform

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/dustin/go-humanize"

	"github.com/platformgw/gateway/internal/alerts"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store/settlelog"
	"github.com/platformgw/gateway/internal/wire"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("platform", parsePlatform)
}

// parsePlatform turns the `platform` global option into the platform app's
// JSON. The syntax is documented on UnmarshalCaddyfile.
func parsePlatform(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		// httpcaddyfile would keep only the last block, silently dropping
		// the services of the first one.
		d.Next()
		return nil, d.Err("'platform' given twice in the global options; put everything in one block")
	}
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "platform", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from the `platform` global option.
// Syntax:
//
//	platform {
//		header_brand         <word>              # X-<word>-* headers; Platform
//		store                <path>              # bbolt file
//		durability           sync|write          # sync
//		flush_interval       <duration>          # 5ms (write durability)
//		public_url           <http(s)://host[:port][/path]>
//		prefixes {
//			gateway <prefix>...                  # /api /gateway/api/v1
//			usage   <prefix>...                  # /api/usage /usage/api/v1
//			core    <prefix>...                  # /api/v1 /core/api/v1
//		}
//		timestamp_tolerance  <duration>          # 5m
//		job_ttl              <duration>          # 24h
//		ledger_retention     <duration>          # keep; raw ledger rows older go (rollups stay)
//		rollup_retention     <duration>          # keep; hourly rollups older go
//		result_max_bytes     <size>              # 16KiB
//		max_body_bytes       <size>              # 10MiB
//		usage_max_body_bytes <size>              # 1MiB
//		jwt {                                    # end users' JWTs on the billing estimate
//			hs256_secret <secret>                # 32 bytes or more
//			public_key   <PEM file>...           # RS256 / ES256 keys; may repeat
//			jwks_file    <JWKS file>
//			issuer       <iss>
//			audience     <aud>
//			user_claim   <claim>                 # sub
//			leeway       <duration>              # 30s
//		}
//		service <id> {
//			backend <http(s)://host[:port][/path]>
//			secret  <secret> [<previous secret>]
//			owners  <user id>...
//			sync_response raw|wrapped                # raw
//			endpoint <id> [{
//				methods <GET|POST|PUT|DELETE>...
//				path    <path>
//				cost    <decimal>
//				async [only]
//				streaming
//				allow_upgrade
//				sync_response raw|wrapped        # the service's
//			}]
//			product <id> {
//				billing      SUBSCRIPTION|PREPAID|USAGE_POSTPAID|USAGE_INSTANT
//				measurement  PER_REQUEST|PER_TOKEN|PER_BYTE|PER_TIME_UNIT
//				unit         <label>
//				quota        <decimal> [per day|week|month|year]
//				calendar_periods
//				overage      block|allow
//				price        <decimal>
//				spending_cap <decimal>
//				rate_limit   <n>/<s|m|h|d|duration> [burst <n>]
//				alert quota         <percent>...      # e.g. 80% 100%
//				alert spending_cap  <percent>...      # e.g. 90%
//				alert credits_below <credits>...      # PREPAID; e.g. 10
//			}
//		}
//		alerts {                                 # usage alert webhooks (docs/alerts.md)
//			webhook       <http(s) URL>
//			secret        <secret>                 # signs the webhooks; 16 bytes or more
//			sign_with     secret|service           # secret; service: the alert's service secret
//			interval      <duration>               # 1s: how often changed usage is evaluated
//			timeout       <duration>               # 10s per attempt
//			retry_initial <duration>               # 30s, doubling per failure
//			retry_max     <duration>               # 1h
//			give_up_after <duration>               # 24h
//		}
//	}
//
// `alert` may repeat in a product block (the thresholds add up).
// `service`, `endpoint` and `product` may repeat with distinct ids, and
// `owners` may repeat (the lists add up); every other subdirective is
// allowed once per block. A prefix group left out of `prefixes` keeps its
// defaults. Sizes are humanize byte sizes as in Caddy's request_body
// max_size (16KiB, 10MB, or a plain number of bytes); durations are Caddy
// durations (90s, 5m, 1d). Secrets are kept as written so that {env.X} and
// {file.X} placeholders are resolved, and their length checked, when the
// app is provisioned.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // option name
	if d.NextArg() {
		return d.Errf("'platform' takes no arguments, got '%s'; settings go in its block", d.Val())
	}
	seen := settings{block: "platform"}
	services := make(map[string]int)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name != "service" {
			if err := seen.once(d); err != nil {
				return err
			}
		}
		var err error
		switch name {
		case "header_brand":
			a.HeaderBrand, err = oneArg(d)
			if err == nil {
				err = checked(d, wire.CheckBrand(a.HeaderBrand))
			}
		case "store":
			a.Store, a.StorePostgres, err = parseStore(d) // storepg.go
		case "durability":
			a.Durability, err = oneArg(d)
			if err == nil {
				if _, perr := settlelog.ParseMode(a.Durability); perr != nil {
					err = d.Errf("durability '%s': sync (a settlement is acknowledged once on stable storage) or write (once written)", a.Durability)
				}
			}
		case "flush_interval":
			a.FlushInterval, err = durationArg(d)
		case "public_url":
			a.PublicURL, err = oneArg(d)
			if err == nil {
				err = checkBaseURL(d, name, a.PublicURL)
			}
		case "prefixes":
			a.Prefixes, err = parsePrefixes(d)
		case "timestamp_tolerance":
			a.TimestampTolerance, err = durationArg(d)
		case "job_ttl":
			a.JobTTL, err = durationArg(d)
		case "ledger_retention":
			a.LedgerRetention, err = durationArg(d)
		case "rollup_retention":
			a.RollupRetention, err = durationArg(d)
		case "result_max_bytes":
			var n int64
			n, err = sizeArg(d, math.MaxInt)
			a.ResultMaxBytes = int(n)
		case "max_body_bytes":
			a.MaxBodyBytes, err = sizeArg(d, math.MaxInt64)
		case "usage_max_body_bytes":
			a.UsageMaxBodyBytes, err = sizeArg(d, math.MaxInt64)
		case "jwt":
			a.JWT, err = parseJWT(d)
		case "alerts":
			a.Alerts, err = parseAlerts(d)
		case "service":
			var s *catalog.Service
			at := d.Token()
			if s, err = parseService(d); err != nil {
				break
			}
			if first, dup := services[s.ID]; dup {
				err = errAt(at, "service '%s' declared twice (first on line %d)", s.ID, first)
				break
			}
			services[s.ID] = at.Line
			a.Services = append(a.Services, s)
		default:
			err = seen.unknown(d)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// parseJWT reads the `jwt { … }` block; it needs at least one key.
func parseJWT(d *caddyfile.Dispenser) (*JWTConfig, error) {
	at := d.Token()
	if d.NextArg() {
		return nil, d.Errf("'jwt' takes no arguments, got '%s'; settings go in its block", d.Val())
	}
	c := &JWTConfig{}
	seen := settings{block: "jwt"}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name != "public_key" {
			if err := seen.once(d); err != nil {
				return nil, err
			}
		}
		var err error
		switch name {
		case "hs256_secret":
			c.HS256Secret, err = oneArg(d)
		case "public_key":
			var files []string
			if files, err = lineArgs(d, 1, -1); err == nil {
				c.PublicKeyFiles = append(c.PublicKeyFiles, files...)
			}
		case "jwks_file":
			c.JWKSFile, err = oneArg(d)
		case "issuer":
			c.Issuer, err = oneArg(d)
		case "audience":
			c.Audience, err = oneArg(d)
		case "user_claim":
			c.UserClaim, err = oneArg(d)
		case "leeway":
			c.Leeway, err = durationArg(d)
			if err == nil && (c.Leeway < 0 || time.Duration(c.Leeway) > 5*time.Minute) {
				err = d.Errf("leeway %s: between 0 and 5m", time.Duration(c.Leeway))
			}
		default:
			err = seen.unknown(d)
		}
		if err != nil {
			return nil, err
		}
	}
	if c.HS256Secret == "" && len(c.PublicKeyFiles) == 0 && c.JWKSFile == "" {
		return nil, errAt(at, "jwt needs a key: hs256_secret, public_key or jwks_file")
	}
	return c, nil
}

// parseAlerts reads the `alerts { … }` block of usage alert webhooks.
func parseAlerts(d *caddyfile.Dispenser) (*AlertsConfig, error) {
	at := d.Token()
	if d.NextArg() {
		return nil, d.Errf("'alerts' takes no arguments, got '%s'; settings go in its block", d.Val())
	}
	c := new(AlertsConfig)
	seen := settings{block: "alerts"}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.once(d); err != nil {
			return nil, err
		}
		var err error
		switch name := d.Val(); name {
		case "webhook":
			if c.Webhook, err = oneArg(d); err == nil {
				err = checkWebhookURL(d, c.Webhook)
			}
		case "secret":
			c.Secret, err = oneArg(d)
		case "sign_with":
			c.SignWith, err = enumArg(d, strings.ToLower, signWiths)
		case "interval":
			c.Interval, err = durationArg(d)
		case "timeout":
			c.Timeout, err = durationArg(d)
		case "retry_initial":
			c.RetryInitial, err = durationArg(d)
		case "retry_max":
			c.RetryMax, err = durationArg(d)
		case "give_up_after":
			c.GiveUpAfter, err = durationArg(d)
		default:
			err = seen.unknown(d)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := c.check(); err != nil {
		return nil, errAt(at, "alerts: %v", err)
	}
	return c, nil
}

// checkWebhookURL accepts an http or https URL with a host; a query is
// allowed (receivers often take a token there), credentials are not.
func checkWebhookURL(d *caddyfile.Dispenser, s string) error {
	if err := validWebhookURL(s); err != nil {
		return d.Errf("webhook '%s': %v", s, err)
	}
	return nil
}

// settings tracks the subdirectives of one block, so that a repeated
// setting is refused instead of silently overriding the first.
type settings struct {
	block string         // "platform", "service 'weather'", … for messages
	lines map[string]int // subdirective → line of its first use
}

func (s *settings) once(d *caddyfile.Dispenser) error {
	if first, dup := s.lines[d.Val()]; dup {
		return d.Errf("duplicate subdirective '%s' in %s (first on line %d)", d.Val(), s.block, first)
	}
	if s.lines == nil {
		s.lines = make(map[string]int)
	}
	s.lines[d.Val()] = d.Line()
	return nil
}

func (s *settings) unknown(d *caddyfile.Dispenser) error {
	return d.Errf("unrecognized subdirective '%s' in %s", d.Val(), s.block)
}

// parsePrefixes reads a `prefixes` block. Groups left out keep their
// defaults: an operator moving the gateway routes should not lose the
// usage routes every backend reports to.
func parsePrefixes(d *caddyfile.Dispenser) (*Prefixes, error) {
	at := d.Token()
	if d.NextArg() {
		return nil, d.Errf("prefixes takes a block, not arguments like '%s'", d.Val())
	}
	p := DefaultPrefixes()
	seen := settings{block: "prefixes"}
	groups := 0
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		groups++
		if err := seen.once(d); err != nil {
			return nil, err
		}
		var group *[]string
		switch d.Val() {
		case "gateway":
			group = &p.Gateway
		case "usage":
			group = &p.Usage
		case "core":
			group = &p.Core
		default:
			return nil, seen.unknown(d)
		}
		name := d.Val()
		list, err := lineArgs(d, 1, -1)
		if err != nil {
			return nil, err
		}
		for i, prefix := range list {
			if !strings.HasPrefix(prefix, "/") || strings.HasSuffix(prefix, "/") && prefix != "/" || strings.ContainsAny(prefix, "?#") {
				return nil, d.Errf("%s prefix '%s' must start with / and not end with /", name, prefix)
			}
			if slices.Contains(list[:i], prefix) {
				return nil, d.Errf("%s prefix '%s' listed twice", name, prefix)
			}
		}
		*group = list
	}
	if groups == 0 {
		return nil, d.Err("prefixes needs a block with gateway, usage or core prefixes")
	}
	// Routes are told apart by their prefix, so one prefix cannot serve two
	// groups (nested prefixes such as /api and /api/usage are fine).
	owner := make(map[string]string)
	for _, g := range []struct {
		name string
		list []string
	}{{"gateway", p.Gateway}, {"usage", p.Usage}, {"core", p.Core}} {
		for _, prefix := range g.list {
			if other, dup := owner[prefix]; dup {
				return nil, errAt(at, "prefix '%s' is both a %s and a %s prefix", prefix, other, g.name)
			}
			owner[prefix] = g.name
		}
	}
	return &p, nil
}

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
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name != "owners" && name != "endpoint" && name != "product" {
			if err := seen.once(d); err != nil {
				return nil, err
			}
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
			var thresholds []alerts.Threshold
			at := d.Token()
			if p, thresholds, err = parseProduct(d, id); err != nil {
				break
			}
			if first, dup := products[p.ID]; dup {
				err = errAt(at, "product '%s' declared twice in service '%s' (first on line %d)", p.ID, id, first)
				break
			}
			products[p.ID] = at.Line
			s.Products = append(s.Products, p)
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
	return s, nil
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
func parseProduct(d *caddyfile.Dispenser, service string) (*billing.Product, []alerts.Threshold, error) {
	p, lines, err := parseProductBlock(d, service)
	if err != nil {
		return nil, nil, err
	}
	var all []alerts.Threshold
	first := make(map[string]int)
	for _, l := range lines {
		for _, t := range l.thresholds {
			if err := t.Validate(*p); err != nil {
				return nil, nil, errAt(l.at, "product '%s' of service '%s': %v", p.ID, service, err)
			}
			if line, dup := first[t.String()]; dup {
				return nil, nil, errAt(l.at, "alert %s given twice in product '%s' of service '%s' (first on line %d)", t, p.ID, service, line)
			}
			first[t.String()] = l.at.Line
			all = append(all, t)
		}
	}
	return p, all, nil
}

// alertLine is one `alert` line of a product block, kept with its token
// so that a threshold the finished product refuses is reported on its line.
type alertLine struct {
	at         caddyfile.Token
	thresholds []alerts.Threshold
}

func parseProductBlock(d *caddyfile.Dispenser, service string) (*billing.Product, []alertLine, error) {
	at := d.Token()
	id, err := idArg(d, "product")
	if err != nil {
		return nil, nil, err
	}
	p := &billing.Product{ID: id}
	var lines []alertLine
	seen := settings{block: fmt.Sprintf("product '%s' of service '%s'", id, service)}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if d.Val() != "alert" {
			if err := seen.once(d); err != nil {
				return nil, nil, err
			}
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
			return nil, nil, err
		}
	}
	switch {
	case p.BillingModel == "":
		return nil, nil, errAt(at, "product '%s' of service '%s' has no billing model (billing %s)", id, service, strings.Join(billingModels, "|"))
	case p.MeasurementType == "":
		return nil, nil, errAt(at, "product '%s' of service '%s' has no measurement type (measurement %s)", id, service, strings.Join(measurementTypes, "|"))
	}
	if err := p.Validate(); err != nil {
		return nil, nil, errAt(at, "service '%s': %v", service, err)
	}
	return p, lines, nil
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

// lineArgs reads the rest of the line as the arguments of the current
// subdirective, between min and max of them (max < 0: no limit), and
// refuses a block after them: it would otherwise be read as settings of the
// enclosing block.
func lineArgs(d *caddyfile.Dispenser, min, max int) ([]string, error) {
	name := d.Val()
	args := d.RemainingArgs()
	switch {
	case len(args) < min:
		return nil, d.Errf("%s: missing argument (want %s)", name, argCount(min, max))
	case max >= 0 && len(args) > max:
		return nil, d.Errf("%s: too many arguments (want %s), unexpected '%s'", name, argCount(min, max), args[max])
	}
	if d.NextBlock(d.Nesting()) {
		return nil, d.Errf("%s takes no block, found '%s' in one", name, d.Val())
	}
	return args, nil
}

func argCount(min, max int) string {
	switch {
	case max < 0:
		return fmt.Sprintf("at least %d", min)
	case min == max:
		return fmt.Sprint(min)
	default:
		return fmt.Sprintf("%d to %d", min, max)
	}
}

func oneArg(d *caddyfile.Dispenser) (string, error) {
	args, err := lineArgs(d, 1, 1)
	if err != nil {
		return "", err
	}
	return args[0], nil
}

func flagArg(d *caddyfile.Dispenser) (bool, error) {
	_, err := lineArgs(d, 0, 0)
	return err == nil, err
}

// idArg reads the id of a service, endpoint or product, which is then
// followed by its block (if any).
func idArg(d *caddyfile.Dispenser, kind string) (string, error) {
	if !d.NextArg() {
		return "", d.Errf("%s: missing id", kind)
	}
	id := d.Val()
	if d.NextArg() {
		return "", d.Errf("%s '%s': unexpected '%s' after the id", kind, id, d.Val())
	}
	if err := catalog.CheckID(kind, id); err != nil {
		return "", checked(d, err)
	}
	return id, nil
}

func enumArg(d *caddyfile.Dispenser, norm func(string) string, values []string) (string, error) {
	name := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return "", err
	}
	if !slices.Contains(values, norm(v)) {
		return "", d.Errf("%s '%s' is not one of %s", name, v, strings.Join(values, ", "))
	}
	return norm(v), nil
}

func decimalArg(d *caddyfile.Dispenser) (billing.Units, error) {
	name := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	u, err := billing.ParseUnits(v)
	if err != nil {
		return 0, d.Errf("%s '%s': %v", name, v, err)
	}
	return u, nil
}

func durationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	name := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("%s '%s' is not a duration (e.g. 90s, 5m, 24h, 1d)", name, v)
	}
	if dur <= 0 {
		return 0, d.Errf("%s '%s' must be positive", name, v)
	}
	return caddy.Duration(dur), nil
}

// sizeArg reads a byte size the way Caddy's request_body max_size does.
func sizeArg(d *caddyfile.Dispenser, max uint64) (int64, error) {
	name := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(v)
	if err != nil {
		return 0, d.Errf("%s '%s' is not a size (e.g. 16KiB, 10MiB or a number of bytes)", name, v)
	}
	if n == 0 || n > max {
		return 0, d.Errf("%s '%s' must be between 1 byte and %s", name, v, humanize.IBytes(max))
	}
	return int64(n), nil
}

// checkBaseURL accepts what the app and the catalog accept as a base URL:
// http or https, a host, an optional path, nothing else.
func checkBaseURL(d *caddyfile.Dispenser, name, s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.User != nil {
		return d.Errf("%s '%s' must be an http or https URL with a host and no query, fragment or credentials", name, s)
	}
	return nil
}

// checked is err, the verdict of the rule's one judge (package catalog
// or wire), at the line being read; nil stays nil.
func checked(d *caddyfile.Dispenser, err error) error {
	if err == nil {
		return nil
	}
	return d.Errf("%v", err)
}

// errAt reports an error found after a block was read (a service with no
// backend, a product that does not validate, a duplicate id) at the token
// that opened the block rather than at its closing brace, in the same form
// as Dispenser.Errf, import chain included.
func errAt(tok caddyfile.Token, format string, args ...any) error {
	d := caddyfile.NewDispenser([]caddyfile.Token{tok})
	d.Next()
	return d.Errf(format, args...)
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*App)(nil)
