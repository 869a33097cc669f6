package wire

import (
	"net/textproto"
	"strings"
)

// Headers are the branded header names of the wire contract
// (docs/wire-contract.md), as the gateway spells them: the gateway computes
// them once per config, the SDK once per Client or Verifier.
type Headers struct {
	Prefix             string // "x-platform-", lower case, for stripping
	Signature          string
	Timestamp          string
	SigningVersion     string
	UserID             string
	ServiceProductID   string
	Roles              string
	SubscriptionStatus string
	BillingModel       string
	MeasurementType    string
	UnitLabel          string
	RequestID          string
	Units              string
}

// NewHeaders builds the header names for a brand (CheckBrand), spelled as
// in the specification (X-Platform-User-ID).
func NewHeaders(brand string) Headers {
	x := "X-" + brand + "-"
	return Headers{
		Prefix:             strings.ToLower(x),
		Signature:          x + "Signature",
		Timestamp:          x + "Timestamp",
		SigningVersion:     x + "Signing-Version",
		UserID:             x + "User-ID",
		ServiceProductID:   x + "Service-Product-ID",
		Roles:              x + "Roles",
		SubscriptionStatus: x + "Subscription-Status",
		BillingModel:       x + "Billing-Model",
		MeasurementType:    x + "Measurement-Type",
		UnitLabel:          x + "Unit-Label",
		RequestID:          x + "Request-ID",
		Units:              textproto.CanonicalMIMEHeaderKey(x + "Units"),
	}
}
