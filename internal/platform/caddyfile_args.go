package platform

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
)

// The readers of one subdirective's arguments, shared by every block of
// the platform's Caddyfile: each refuses a wrong count, a stray block and
// a malformed value with the line it is on.

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
	case max >= 0 && len(args) > max && holdsSecret(name):
		// The value may be (part of) a secret: a config error is logged.
		return nil, d.Errf("%s: too many arguments (want %s); the values are not repeated here", name, argCount(min, max))
	case max >= 0 && len(args) > max:
		return nil, d.Errf("%s: too many arguments (want %s), unexpected '%s'", name, argCount(min, max), args[max])
	}
	if d.NextBlock(d.Nesting()) {
		return nil, d.Errf("%s takes no block, found '%s' in one", name, d.Val())
	}
	return args, nil
}

// holdsSecret reports whether a setting's value is a secret (a service's
// or an alert webhook's secret, Stripe's keys, the store's DSN with its
// password), which no error message repeats.
func holdsSecret(name string) bool {
	return strings.Contains(name, "secret") || name == "dsn"
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
		return d.Errf("%s '%s' must be an http or https URL with a host and no query, fragment or credentials", name, catalog.ShownURL(s))
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
