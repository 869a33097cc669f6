package sdk

import (
	"net/http"
	"net/textproto"

	"github.com/platformgw/gateway/signing"
	"github.com/platformgw/gateway/wire"
)

// headerNames are the branded header names, as the gateway spells them.
type headerNames struct {
	signature, timestamp, signingVersion         string
	userID, serviceProductID, roles              string
	subscriptionStatus, billingModel             string
	measurementType, unitLabel, requestID, units string
}

func newHeaderNames(brand string) headerNames {
	if brand == "" {
		brand = DefaultBrand
	}
	x := "X-" + brand + "-"
	return headerNames{
		signature:          x + "Signature",
		timestamp:          x + "Timestamp",
		signingVersion:     x + "Signing-Version",
		userID:             x + "User-ID",
		serviceProductID:   x + "Service-Product-ID",
		roles:              x + "Roles",
		subscriptionStatus: x + "Subscription-Status",
		billingModel:       x + "Billing-Model",
		measurementType:    x + "Measurement-Type",
		unitLabel:          x + "Unit-Label",
		requestID:          x + "Request-ID",
		units:              x + "Units",
	}
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
	h.Set(textproto.CanonicalMIMEHeaderKey(newHeaderNames(brand).units), units.String())
}

// signBody is the signature of a backend's request to the usage service:
// Base64(HMAC-SHA256(secret, body + timestamp)).
func signBody(secret, body []byte, timestamp string) string {
	return signing.Sign(secret, body, []byte(timestamp))
}
