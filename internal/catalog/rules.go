package catalog

import (
	"crypto/subtle"
	"fmt"
	"net/url"
	"strings"

	"github.com/platformgw/gateway/internal/wire"
)

// The catalog's rules, one judge each. Compile applies them to every
// service however it was configured (JSON or Caddyfile); the Caddyfile
// parser (internal/platform/caddyfile.go) calls the same functions as it reads, only
// to point at the offending line. docs/configuration.md states them.

// CheckID checks the id of a service, endpoint or product (kind names
// which): ValidID.
func CheckID(kind, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("%s id '%s': letters, digits, '.', '_', '~' and '-' only, at most 128, no '..'", kind, id)
	}
	return nil
}

// CheckBackend checks a service's backend: an http or https URL with a
// host and an optional path, no query, fragment or credentials.
func CheckBackend(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("backend '%s' must be an http or https URL with a host and no query, fragment or credentials", ShownURL(s))
	}
	return u, nil
}

// ShownURL is a configured URL as an error message may repeat it: its
// scheme and host, the rest elided ("https://hooks.example.com/…"). A
// config error is logged, and a URL may carry a secret in its credentials
// (https://user:password@…), its path (a Slack webhook's token) or its
// query (?token=…); a value that does not parse as scheme://host is not
// repeated at all, since a mistyped URL hides a secret just as well.
func ShownURL(s string) string {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "(value not repeated)"
	case u.Scheme != "" && u.Host != "":
		shown := u.Scheme + "://" + u.Host
		if s != shown && s != shown+"/" {
			shown += "/…"
		}
		return shown
	case u.Scheme != "":
		return u.Scheme + ":…"
	default:
		return "(no scheme; value not repeated)"
	}
}

// CheckLink checks a link the pages show: a path on this site ("/portal/")
// or an http or https URL; mailto: too where mail is allowed.
func CheckLink(s string, mail bool) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
	case u.Scheme == "" && u.Host == "" && strings.HasPrefix(s, "/") && !strings.HasPrefix(s, "//"):
		return nil
	case (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil:
		return nil
	case mail && u.Scheme == "mailto" && u.Opaque != "":
		return nil
	}
	if mail {
		return fmt.Errorf("'%s' is not a path starting with /, an http(s) URL or a mailto: address", ShownURL(s))
	}
	return fmt.Errorf("'%s' is not a path starting with / or an http(s) URL", ShownURL(s))
}

// CheckSecrets checks a service's secrets as configured (before
// placeholders are replaced): one, or two during a rotation, and not the
// same twice. Each must also be at least 16 bytes once replaced (Compile).
func CheckSecrets(secrets []string) error {
	switch {
	case len(secrets) == 0 || len(secrets) > 2:
		return fmt.Errorf("needs one secret, or two during a rotation")
	case len(secrets) == 2 && subtle.ConstantTimeCompare([]byte(secrets[0]), []byte(secrets[1])) == 1:
		// Not repeated: a config error is logged, and a secret never is.
		return fmt.Errorf("the same secret is given twice; the second secret is the previous one during a rotation")
	}
	return nil
}

// minSecretLen is the shortest secret accepted, in bytes.
const minSecretLen = 16

// CheckOwner checks an owner's user id: wire.ValidUserID, the rule every
// user id is held to.
func CheckOwner(id string) error {
	if !wire.ValidUserID(id) {
		return fmt.Errorf("owner '%s': a user id is %s", id, wire.UserIDRule)
	}
	return nil
}

// CheckMethod checks an endpoint's method, in any letter case, and returns
// it upper case.
func CheckMethod(m string) (string, error) {
	switch up := strings.ToUpper(m); up {
	case "GET", "POST", "PUT", "DELETE":
		return up, nil
	}
	return "", fmt.Errorf("method '%s' is not one of GET, POST, PUT, DELETE", m)
}

// CheckPath checks an endpoint's backend path: it starts with / and holds
// no query or fragment.
func CheckPath(p string) error {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?#") {
		return fmt.Errorf("path '%s' must start with / and hold no query or fragment", p)
	}
	return nil
}
