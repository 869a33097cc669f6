package sdk

import (
	"net/http"
	"net/textproto"

	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/wire"
)

// newHeaderNames are the header names of a brand ("" is DefaultBrand), as
// the gateway spells them (wire.NewHeaders).
func newHeaderNames(brand string) wire.Headers {
	if brand == "" {
		brand = DefaultBrand
	}
	return wire.NewHeaders(brand)
}

// checkBrand refuses a brand the gateway would refuse as its header_brand
// (wire.CheckBrand, the one rule); "" is the default brand.
func checkBrand(brand string) error {
	if brand == "" {
		return nil
	}
	return wire.CheckBrand(brand)
}

// SetUnits states the units a sync call consumed in the X-<Brand>-Units
// response header (brand "" is Platform). The gateway reads and removes it
// and meters those units instead of the endpoint's cost: this is how a
// PER_TOKEN backend behind the gateway bills the tokens it used. Set it
// before writing the status.
func SetUnits(h http.Header, brand string, units Units) {
	h.Set(textproto.CanonicalMIMEHeaderKey(newHeaderNames(brand).Units), units.String())
}

// signBody is the signature of a backend's request to the usage service:
// Base64(HMAC-SHA256(secret, body + timestamp)).
func signBody(secret, body []byte, timestamp string) string {
	return signing.Sign(secret, body, []byte(timestamp))
}
