package billing

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Billing models of a product, as sent in X-<Brand>-Billing-Model.
const (
	Subscription  = "SUBSCRIPTION"
	Prepaid       = "PREPAID"
	UsagePostpaid = "USAGE_POSTPAID"
	UsageInstant  = "USAGE_INSTANT"
)

// Measurement types of a product, as sent in X-<Brand>-Measurement-Type.
const (
	PerRequest  = "PER_REQUEST"
	PerToken    = "PER_TOKEN"
	PerByte     = "PER_BYTE"
	PerTimeUnit = "PER_TIME_UNIT"
)

// The values a product's enumerations take, in the order messages list
// them: Validate accepts these and no others, and the Caddyfile parser
// offers them. Each call returns a fresh slice.

// BillingModels are the billing models.
func BillingModels() []string { return []string{Subscription, Prepaid, UsagePostpaid, UsageInstant} }

// MeasurementTypes are the measurement types.
func MeasurementTypes() []string { return []string{PerRequest, PerToken, PerByte, PerTimeUnit} }

// Periods are the billing periods, in lower case (Product.Period is read
// case-insensitively; empty means month).
func Periods() []string { return []string{"day", "week", "month", "year"} }

// Overages are the overage policies, in lower case (Product.Overage is
// read case-insensitively; empty means block).
func Overages() []string { return []string{"block", "allow"} }

// Product is a plan a user subscribes to: how usage is measured, what is
// included and what it costs. Quantities are exact decimals.
type Product struct {
	ID string `json:"id"`
	// BillingModel is SUBSCRIPTION, PREPAID, USAGE_POSTPAID or USAGE_INSTANT.
	BillingModel string `json:"billing_model"`
	// MeasurementType is PER_REQUEST, PER_TOKEN, PER_BYTE or PER_TIME_UNIT.
	MeasurementType string `json:"measurement_type"`
	// UnitLabel names one unit for humans: request, token, byte, second.
	UnitLabel string `json:"unit_label,omitempty"`
	// Quota is the number of units included per period; nil means no quota.
	Quota *Units `json:"quota,omitempty"`
	// Period is day, week, month (default) or year.
	Period string `json:"period,omitempty"`
	// CalendarPeriods aligns periods to calendar boundaries (the 1st of the
	// month) instead of the subscription's start.
	CalendarPeriods bool `json:"calendar_periods,omitempty"`
	// Overage is "block" (default: 429 once the quota is used) or "allow"
	// (further units are billed at Price, up to SpendingCap).
	Overage string `json:"overage,omitempty"`
	// Price is the cost of one unit in credits (PREPAID) or money (usage
	// and overage billing).
	Price Units `json:"price,omitempty"`
	// SpendingCap limits the priced spend of one period; nil means none.
	SpendingCap *Units `json:"spending_cap,omitempty"`
	// RateLimit limits requests per key; nil means none.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
	// Currency is the ISO 4217 code Price and SpendingCap are in when they
	// are money (every billing model but PREPAID, whose are credits):
	// the product's catalog listing's currency, set when the catalog is
	// compiled; empty when the listing names none. Not configuration.
	Currency string `json:"-"`
}

// RateLimit is a token bucket: Requests per Window on average, with Burst
// requests allowed at once.
type RateLimit struct {
	Requests int `json:"requests"`
	// Window in seconds; 1 when zero.
	WindowSeconds int `json:"window_seconds,omitempty"`
	// Burst defaults to Requests.
	Burst int `json:"burst,omitempty"`
}

// Window is the time the bucket takes to grant Requests: WindowSeconds,
// one second when it is not set. The limiter and the RateLimit headers
// both read it here, so the bucket enforced and the one described agree.
func (rl RateLimit) Window() time.Duration {
	return time.Duration(max(rl.WindowSeconds, 1)) * time.Second
}

// Capacity is how many requests the bucket grants at once: Burst, Requests
// when it is not set.
func (rl RateLimit) Capacity() int {
	if rl.Burst <= 0 {
		return rl.Requests
	}
	return rl.Burst
}

// UnitName is the name of one unit of a product with this unit label and
// measurement type: the label, or the unit its measurement counts
// ("request", "token", "byte", "second"; "unit" for an unknown type).
func UnitName(label, measurement string) string {
	if label != "" {
		return label
	}
	switch measurement {
	case PerRequest:
		return "request"
	case PerToken:
		return "token"
	case PerByte:
		return "byte"
	case PerTimeUnit:
		return "second"
	}
	return "unit"
}

// UnitName is the name of one unit p measures (the package's UnitName).
func (p Product) UnitName() string { return UnitName(p.UnitLabel, p.MeasurementType) }

// OverageAllowed reports whether units past the quota are billed rather
// than refused.
func (p Product) OverageAllowed() bool { return strings.EqualFold(p.Overage, "allow") }

// CostUnit is what p's costs, spend and spending cap are counted in:
// "credits" for PREPAID, else the listing's currency ("" when it names
// none). The admin API labels costs and spend with it (ops.CostUnit);
// a store keeping a period's spend per cost unit keys it by this.
func (p Product) CostUnit() string {
	if p.BillingModel == Prepaid {
		return "credits"
	}
	return p.Currency
}

// Validate checks the product's enumerations and quantities.
func (p Product) Validate() error {
	if p.ID == "" {
		return fmt.Errorf("product without id")
	}
	if !slices.Contains(BillingModels(), p.BillingModel) {
		return fmt.Errorf("product %s: unknown billing model %q", p.ID, p.BillingModel)
	}
	if !slices.Contains(MeasurementTypes(), p.MeasurementType) {
		return fmt.Errorf("product %s: unknown measurement type %q", p.ID, p.MeasurementType)
	}
	if p.Period != "" && !slices.Contains(Periods(), strings.ToLower(p.Period)) {
		return fmt.Errorf("product %s: unknown period %q (day, week, month or year)", p.ID, p.Period)
	}
	if p.Overage != "" && !slices.Contains(Overages(), strings.ToLower(p.Overage)) {
		return fmt.Errorf("product %s: overage must be block or allow, not %q", p.ID, p.Overage)
	}
	if p.Price < 0 || p.Quota != nil && *p.Quota < 0 || p.SpendingCap != nil && *p.SpendingCap < 0 {
		return fmt.Errorf("product %s: negative quantity", p.ID)
	}
	if p.RateLimit != nil && (p.RateLimit.Requests <= 0 || p.RateLimit.WindowSeconds < 0 || p.RateLimit.Burst < 0) {
		return fmt.Errorf("product %s: rate limit needs a positive request count", p.ID)
	}
	if p.RateLimit != nil && p.RateLimit.WindowSeconds > math.MaxInt32 {
		// As the Caddyfile's: Window must not overflow time.Duration.
		return fmt.Errorf("product %s: rate limit window of %d seconds is longer than %d", p.ID, p.RateLimit.WindowSeconds, math.MaxInt32)
	}
	if err := CheckUnitLabel(p.UnitLabel); err != nil {
		return fmt.Errorf("product %s: %w", p.ID, err)
	}
	return nil
}

// Warnings says what in a valid product can never be charged, each in
// words an operator can act on: a price or spending cap the billing model
// never reaches, overage allowed for nothing. The gateway logs them when a
// config is loaded (they may be meant: a soft quota, a free plan); the
// config still loads.
func (p Product) Warnings() []string {
	var w []string
	subscription := p.BillingModel == Subscription
	allow := p.OverageAllowed()
	switch {
	case subscription && p.Quota != nil && allow && p.Price == 0:
		w = append(w, "overage allow without a price: calls past the quota are served free (set price to charge them, or overage block to refuse them)")
	case subscription && p.Price > 0 && p.Quota == nil:
		w = append(w, "price is never charged: a SUBSCRIPTION product charges only the overage past its quota, and it has no quota")
	case subscription && p.Price > 0 && !allow:
		w = append(w, "price is never charged: a SUBSCRIPTION product charges only the overage past its quota, and its overage is blocked")
	}
	if p.SpendingCap != nil && (p.Price == 0 || subscription && (p.Quota == nil || !allow)) {
		w = append(w, "spending_cap can never be reached: nothing this product serves is priced")
	}
	return w
}

// CheckUnitLabel checks a product's unit label: printable UTF-8 text
// without a space at either end. It is sent in a header
// (X-<Brand>-Unit-Label) and signed in the v3 context, and a receiver
// drops the spaces around a header value, so a label with one would never
// verify at the backend.
func CheckUnitLabel(label string) error {
	if !utf8.ValidString(label) {
		return fmt.Errorf("unit '%s' must be UTF-8 text", label)
	}
	if strings.TrimSpace(label) != label {
		return fmt.Errorf("unit '%s' must not begin or end with a space (it is sent in a header, where surrounding spaces are dropped, and signed as it is)", label)
	}
	for _, c := range label {
		if !unicode.IsPrint(c) {
			return fmt.Errorf("unit '%s' must be printable text (it is sent in a header)", label)
		}
	}
	return nil
}
