// Package alerts holds the rules of usage alerts: the thresholds a product
// may set (a share of its quota, a share of its spending cap, a prepaid
// balance falling below an amount), which of them a subscription's state
// has reached, the webhook body that tells the operator, its signature and
// the retry schedule of its delivery.
//
// The package is pure (no I/O, no clock, no Caddy): the platform app runs
// the evaluation loop and the deliveries, the store keeps the records.
package alerts

import (
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/platformgw/gateway/internal/billing"
)

// The metrics a threshold watches.
const (
	// MetricQuota fires when the settled units of a period reach a share
	// of the product's quota.
	MetricQuota = "quota"
	// MetricSpendingCap fires when the settled spend of a period reaches
	// a share of the product's spending cap.
	MetricSpendingCap = "spending_cap"
	// MetricCreditsBelow fires when a prepaid balance falls below an
	// amount of credits.
	MetricCreditsBelow = "credits_below"
)

// Metrics lists the metrics in the order the docs give them.
var Metrics = []string{MetricQuota, MetricCreditsBelow, MetricSpendingCap}

// MaxPercent bounds a percentage threshold: past 100% of a quota is
// meaningful with `overage allow`, ten times the quota is plenty.
var MaxPercent = billing.Whole(1000)

// Threshold is one alert level of a product.
type Threshold struct {
	// Metric is quota, spending_cap or credits_below.
	Metric string `json:"metric"`
	// Percent of the quota or of the spending cap (quota and
	// spending_cap): above 0, at most 1000.
	Percent billing.Units `json:"percent,omitempty"`
	// Credits is the balance below which credits_below fires.
	Credits billing.Units `json:"credits,omitempty"`
}

// String is the threshold as the Caddyfile writes it ("quota 80%",
// "credits_below 10"); it names the threshold in alert records, so the
// same threshold always has the same name.
func (t Threshold) String() string {
	if t.Metric == MetricCreditsBelow {
		return t.Metric + " " + t.Credits.String()
	}
	return t.Metric + " " + t.Percent.String() + "%"
}

// Validate checks the threshold against the product it belongs to: a share
// of a quota needs a quota, of a cap a cap, and a credit balance a PREPAID
// product.
func (t Threshold) Validate(p billing.Product) error {
	switch t.Metric {
	case MetricQuota, MetricSpendingCap:
		if t.Percent <= 0 || t.Percent > MaxPercent {
			return fmt.Errorf("alert %s: the percentage must be above 0%% and at most %s%%", t.Metric, MaxPercent)
		}
		if t.Credits != 0 {
			return fmt.Errorf("alert %s takes a percentage, not credits", t.Metric)
		}
		if t.Metric == MetricQuota && (p.Quota == nil || *p.Quota <= 0) {
			return fmt.Errorf("alert %s: product %s has no quota", t, p.ID)
		}
		if t.Metric == MetricSpendingCap && (p.SpendingCap == nil || *p.SpendingCap <= 0) {
			return fmt.Errorf("alert %s: product %s has no spending cap", t, p.ID)
		}
	case MetricCreditsBelow:
		if t.Credits <= 0 {
			return fmt.Errorf("alert %s: the credits must be above 0", t.Metric)
		}
		if t.Percent != 0 {
			return fmt.Errorf("alert %s takes an amount of credits, not a percentage", t.Metric)
		}
		if p.BillingModel != billing.Prepaid {
			return fmt.Errorf("alert %s: product %s is %s, and only PREPAID products have credits", t, p.ID, p.BillingModel)
		}
	default:
		return fmt.Errorf("alert metric %q is not one of %s", t.Metric, strings.Join(Metrics, ", "))
	}
	return nil
}

// ValidateAll checks every threshold of a product and refuses one given
// twice (it would fire twice for one crossing).
func ValidateAll(p billing.Product, ts []Threshold) error {
	seen := make(map[string]bool, len(ts))
	for _, t := range ts {
		if err := t.Validate(p); err != nil {
			return err
		}
		name := t.String()
		if seen[name] {
			return fmt.Errorf("alert %s given twice for product %s", name, p.ID)
		}
		seen[name] = true
	}
	return nil
}

// Parse reads the arguments of a Caddyfile `alert <metric> <level>...`
// line: percentages ("80%") for quota and spending_cap, amounts of credits
// ("10") for credits_below. The thresholds still need Validate against
// their product.
func Parse(metric string, levels []string) ([]Threshold, error) {
	if len(levels) == 0 {
		return nil, fmt.Errorf("alert %s: missing level", metric)
	}
	var out []Threshold
	for _, lv := range levels {
		t := Threshold{Metric: metric}
		switch metric {
		case MetricQuota, MetricSpendingCap:
			num, ok := strings.CutSuffix(lv, "%")
			if !ok {
				return nil, fmt.Errorf("alert %s '%s': a percentage such as 80%%", metric, lv)
			}
			u, err := billing.ParseUnits(num)
			if err != nil {
				return nil, fmt.Errorf("alert %s '%s': %v", metric, lv, err)
			}
			t.Percent = u
		case MetricCreditsBelow:
			u, err := billing.ParseUnits(lv)
			if err != nil {
				return nil, fmt.Errorf("alert %s '%s': an amount of credits such as 10: %v", metric, lv, err)
			}
			t.Credits = u
		default:
			return nil, fmt.Errorf("alert metric '%s' is not one of %s", metric, strings.Join(Metrics, ", "))
		}
		out = append(out, t)
	}
	return out, nil
}

// Reading is a threshold a subscription has reached: Value is what was
// measured (units used, spend, or credits left) and Limit the level it
// reached, both counted in Currency or Unit (Measure).
type Reading struct {
	Threshold Threshold
	Value     billing.Units
	Limit     billing.Units
	Currency  string
	Unit      string
}

// UnitCredits is the Unit of an amount of credits: a prepaid balance, or
// the spend of a PREPAID product, whose price is credits, not money.
const UnitCredits = "credits"

// Measure is what the figures of a threshold on metric of product p count,
// as the webhook says it: money in the ISO 4217 currency of p's catalog
// listing (a spending cap of a product that is not PREPAID), or a unit:
// credits (credits_below, and the spending cap of a PREPAID product), or
// the unit of p's quota (its unit label, else the one its measurement
// counts: request, token, byte, second). Both are empty for the spending
// cap of a product whose listing names no currency: money, in a currency
// the gateway was not told, which the console and the portal also show
// without a code.
func Measure(p billing.Product, metric string) (currency, unit string) {
	switch metric {
	case MetricCreditsBelow:
		return "", UnitCredits
	case MetricSpendingCap:
		if p.BillingModel == billing.Prepaid {
			return "", UnitCredits
		}
		return p.Currency, ""
	case MetricQuota:
		return "", p.UnitName()
	}
	return "", ""
}

// Reached returns the thresholds of ts that the state s of a subscription
// to product p has reached. Only settled amounts count: units held by calls
// in flight may still be released.
func Reached(p billing.Product, s billing.State, ts []Threshold) []Reading {
	var out []Reading
	for _, t := range ts {
		n := len(out)
		switch t.Metric {
		case MetricQuota:
			if p.Quota == nil || *p.Quota <= 0 {
				continue
			}
			if limit := share(*p.Quota, t.Percent); s.Used >= limit {
				out = append(out, Reading{Threshold: t, Value: s.Used, Limit: limit})
			}
		case MetricSpendingCap:
			if p.SpendingCap == nil || *p.SpendingCap <= 0 {
				continue
			}
			if limit := share(*p.SpendingCap, t.Percent); s.Spend >= limit {
				out = append(out, Reading{Threshold: t, Value: s.Spend, Limit: limit})
			}
		case MetricCreditsBelow:
			if p.BillingModel == billing.Prepaid && s.Credits < t.Credits {
				out = append(out, Reading{Threshold: t, Value: s.Credits, Limit: t.Credits})
			}
		}
		if len(out) > n {
			out[n].Currency, out[n].Unit = Measure(p, t.Metric)
		}
	}
	return out
}

// share is percent % of limit, rounded up to a millionth of a unit, so
// the level is never below the exact share: limit·percent / (100·Scale)
// in 128 bits. (percent/100 as units lost every digit of the percentage
// past its fourth decimal: 0.00005% of a quota was 0, reached at once.)
func share(limit, percent billing.Units) billing.Units {
	if limit <= 0 || percent <= 0 {
		return 0
	}
	const div = uint64(100 * billing.Scale)
	hi, lo := bits.Mul64(uint64(limit), uint64(percent))
	lo, carry := bits.Add64(lo, div-1, 0)
	hi += carry
	if hi >= div {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, div)
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return billing.Units(q)
}
