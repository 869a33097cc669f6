package platform

import (
	"math"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

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
//		allow_shared_ports                       # start although another process listens on our ports
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
//			public                                   # listed in the public catalog
//			display_name    <text>
//			description     <text>
//			logo_url        <http(s) URL or /path>
//			cover_image_url <http(s) URL or /path>
//			tags            <tag>...                 # may repeat
//			feature <id> <label> [<tooltip>]         # may repeat; shown in this order
//			openapi <file>                           # OpenAPI 3.0/3.1, JSON or YAML
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
//				display_name <text>
//				description  <text>
//				currency     <ISO 4217 code>          # of period_price and a money price
//				period_price <decimal>                # per period, in currency
//				trial        <days>d
//				self_service                          # callers may take it themselves
//				private                               # not in the public catalog
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
// `alert` may repeat in a product block (the thresholds add up), and
// `tags` and `feature` in a service block.
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
		case "group_commit":
			a.GroupCommit, err = oneArg(d)
			if err == nil && a.GroupCommit != "paced" && a.GroupCommit != "eager" {
				err = d.Errf("group_commit '%s': paced (settlements arriving while an fdatasync runs wait to share the next) or eager (each fdatasync starts when the one before ends)", a.GroupCommit)
			}
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
		case "allow_shared_ports":
			a.AllowSharedPorts, err = flagArg(d)
		case "jwt":
			a.JWT, err = parseJWT(d)
		case "alerts":
			a.Alerts, err = parseAlerts(d)
		case "payments":
			a.Payments, err = parsePayments(d)
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
			// 0 is allowed (no skew at all), unlike the durations
			// durationArg reads.
			var v string
			if v, err = oneArg(d); err == nil {
				dur, perr := caddy.ParseDuration(v)
				switch {
				case perr != nil:
					err = d.Errf("leeway '%s' is not a duration (e.g. 0, 30s, 2m)", v)
				case dur < 0 || dur > MaxJWTLeeway:
					err = d.Errf("leeway %s: between 0 and %s", dur, MaxJWTLeeway)
				default:
					l := caddy.Duration(dur)
					c.Leeway = &l
				}
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
		return d.Errf("webhook '%s': %v", catalog.ShownURL(s), err)
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

var _ caddyfile.Unmarshaler = (*App)(nil)
