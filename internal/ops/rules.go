package ops

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/wire"
)

// The rules of what operators and callers send, with the error each
// breach is answered with: the admin API, the console and the portal
// judge alike because they judge here.

// Page sizes of the listings.
const (
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

// Limits of the operator-supplied values of a key.
const (
	maxRoleLen  = 64
	maxRoles    = 32
	maxLabelLen = 256
)

// ValidUserID reports whether s can be a user id (wire.ValidUserID, the
// one rule for user ids: the admin API, the console, the usage routes and
// the catalog's owners all use it).
func ValidUserID(s string) bool { return wire.ValidUserID(s) }

// CheckUserID refuses a user id in field that is not one.
func CheckUserID(field, s string) error {
	if !ValidUserID(s) {
		return apierror.Invalid(field, field+" must be "+wire.UserIDRule)
	}
	return nil
}

// checkRoles validates roles: visible ASCII without ',' (they are sent
// comma-joined in a header and in the signed context, where a comma inside
// a role would split it). Duplicates are dropped, order is kept.
func checkRoles(roles []string) ([]string, error) {
	if len(roles) > maxRoles {
		return nil, apierror.Invalid("roles", fmt.Sprintf("at most %d roles", maxRoles))
	}
	out := make([]string, 0, len(roles))
	for _, role := range roles {
		if role == "" || len(role) > maxRoleLen {
			return nil, apierror.Invalid("roles", fmt.Sprintf("a role is 1 to %d characters", maxRoleLen))
		}
		for i := 0; i < len(role); i++ {
			if c := role[i]; c <= ' ' || c > '~' || c == ',' {
				return nil, apierror.Invalid("roles", fmt.Sprintf("role %q: visible ASCII characters other than ',' only", role))
			}
		}
		if !slices.Contains(out, role) {
			out = append(out, role)
		}
	}
	return out, nil
}

func checkLabel(s string) error {
	if len(s) > maxLabelLen || !utf8.ValidString(s) {
		return apierror.Invalid("label", fmt.Sprintf("label must be UTF-8 text of at most %d bytes", maxLabelLen))
	}
	for _, c := range s {
		if unicode.IsControl(c) {
			return apierror.Invalid("label", "label must not hold control characters")
		}
	}
	return nil
}

// SubscriptionIDs validates the {userId}/{serviceId} of a subscription
// (the admin API's path parameters).
func SubscriptionIDs(args []string) (userID, serviceID string, err error) {
	userID, serviceID = args[0], args[1]
	if err := CheckUserID("userId", userID); err != nil {
		return "", "", err
	}
	if !catalog.ValidID(serviceID) {
		return "", "", apierror.Invalid("serviceId", "serviceId is not a valid id")
	}
	return userID, serviceID, nil
}

// KeyNotFound answers a key id no key has.
func KeyNotFound(id string) error {
	return apierror.New(apierror.NotFound, "no service key "+apierror.QuoteID(id))
}

// SubscriptionNotFound answers a user with no subscription to a service.
func SubscriptionNotFound(userID, serviceID string) error {
	return apierror.New(apierror.NotFound, "user "+apierror.QuoteID(userID)+" has no subscription to service "+serviceID)
}

// BadCursor is the answer to a listing's cursor the store did not hand
// out, nil for any other error.
func BadCursor(err error) error {
	if errors.Is(err, store.ErrBadCursor) {
		return apierror.Invalid("cursor", "cursor is not one this listing returned; start again without it")
	}
	return nil
}

// ParseTimeBound reads an RFC 3339 time or a date. A date as the upper
// bound means the end of that day, so from=2026-01-01&to=2026-01-31 is all
// of January.
func ParseTimeBound(s string, upper bool) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, err
	}
	if upper {
		d = d.AddDate(0, 0, 1)
	}
	return d, nil
}
