package engine

import (
	"net/textproto"
	"strings"
)

// Prefixes are the path prefixes of each group of routes. Several prefixes
// per group may be served at once (the default and the ECS layout).
type Prefixes struct {
	Gateway []string `json:"gateway,omitempty"`
	Usage   []string `json:"usage,omitempty"`
	Core    []string `json:"core,omitempty"`
}

// DefaultPrefixes serves the default and the ECS layouts side by side.
func DefaultPrefixes() Prefixes {
	return Prefixes{
		Gateway: []string{"/api", "/gateway/api/v1"},
		Usage:   []string{"/api/usage", "/usage/api/v1"},
		Core:    []string{"/api/v1", "/core/api/v1"},
	}
}

// Headers are the branded header names, computed once per config.
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

// NewHeaders builds the header names for a brand, spelled as in the
// specification (X-Platform-User-ID).
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
