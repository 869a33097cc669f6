package portal

import (
	"fmt"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// Plain words for the catalog's and the store's enumerations: a caller
// reads "pay as you go, 0.50 per 1,000 tokens" and "Cancelling at period
// end", never USAGE_POSTPAID or CANCELLING. Every page of the portal says
// them through these functions, so one enum has one wording.

// currencyOf is the ISO 4217 code a product's money amounts are in: its
// catalog listing's currency. A product whose listing names none (a
// service not public, configured before listings existed) has its
// amounts of money named by unnamedCurrency; a prepaid balance is counted
// in credits, apart from money.
func currencyOf(p *billing.Product) string {
	if p == nil {
		return ""
	}
	return p.Currency
}

// unnamedCurrency stands for the currency when the catalog names none.
const unnamedCurrency = "in your plan's currency"

// moneyText is an amount of money with its currency, with at least the
// currency's minor digits as every other page writes it
// (catalog.FormatAmount): "12.50 EUR", "0.0025 EUR", "500 JPY",
// "1.250 BHD"; two without a currency.
func moneyText(u billing.Units, currency string) string {
	if currency == "" {
		return decimal(u, 2) + " " + unnamedCurrency
	}
	return decimal(u, catalog.MinorDigits(currency)) + " " + currency
}

// creditsText is a prepaid balance or price in credits ("12.5 credits").
func creditsText(u billing.Units) string {
	s := decimal(u, 0)
	if u == billing.Whole(1) {
		return s + " credit"
	}
	return s + " credits"
}

// priceText is an amount priced under p: credits for a prepaid product,
// money otherwise; for a plan no longer offered (nil), whose amounts may
// have been either, it says it cannot tell.
func priceText(p *billing.Product, u billing.Units) string {
	if p == nil {
		return decimal(u, 0) + " of a plan no longer offered (credits or money)"
	}
	if p.BillingModel == billing.Prepaid {
		return creditsText(u)
	}
	return moneyText(u, currencyOf(p))
}

// costText is what a call or job cost, priced under p (priceText):
// "None" when it cost nothing under a plan whose amounts have no
// currency to name (a free plan), or a plan no longer offered; a zero in
// a named currency or in credits keeps its unit.
func costText(p *billing.Product, u billing.Units) string {
	if u == 0 && (p == nil || p.BillingModel != billing.Prepaid && currencyOf(p) == "") {
		return "None"
	}
	return priceText(p, u)
}

// decimal writes u with thousands separators and at least minFrac
// decimals ("10,000", "0.50").
func decimal(u billing.Units, minFrac int) string {
	s := u.String()
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	whole, frac, _ := strings.Cut(s, ".")
	for len(frac) < minFrac {
		frac += "0"
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if frac != "" {
		b.WriteByte('.')
		b.WriteString(frac)
	}
	return b.String()
}

// unitNoun is the name of the unit a product measures, plural unless n
// is exactly one: "request", "tokens".
func unitNoun(p *billing.Product, n billing.Units) string {
	label := ""
	measurement := ""
	if p != nil {
		label, measurement = p.UnitLabel, p.MeasurementType
	}
	return unitName(label, measurement, n)
}

// unitName is unitNoun from a unit label and a measurement type, as a
// ledger summary carries them.
func unitName(label, measurement string, n billing.Units) string {
	label = billing.UnitName(label, measurement)
	if n == billing.Whole(1) || strings.HasSuffix(label, "s") {
		return label
	}
	return label + "s"
}

// quantityText is an amount of units with its noun ("10,000 requests").
func quantityText(p *billing.Product, n billing.Units) string {
	return decimal(n, 0) + " " + unitNoun(p, n)
}

// priceBlock is how many units a price is quoted for: one request, but
// 1,000 tokens and 1,000,000 bytes, whose single price is too small to
// read.
func priceBlock(p *billing.Product) int64 {
	switch p.MeasurementType {
	case billing.PerToken:
		return 1_000
	case billing.PerByte:
		return 1_000_000
	}
	return 1
}

// perText is "per request" or "per 1,000 tokens".
func perText(p *billing.Product) string {
	n := priceBlock(p)
	if n == 1 {
		return "per " + unitNoun(p, billing.Whole(1))
	}
	return "per " + decimal(billing.Whole(n), 0) + " " + unitNoun(p, billing.Whole(n))
}

// periodAdjective is "monthly" for a month's period.
func periodAdjective(period string) string {
	switch strings.ToLower(period) {
	case "day":
		return "daily"
	case "week":
		return "weekly"
	case "year":
		return "yearly"
	}
	return "monthly"
}

// pricingWords says how a product is priced, in a caller's words:
// "pay as you go, 0.50 EUR per 1,000 tokens", "prepaid credits, 1 credit
// per request", "monthly quota of 10,000 requests".
func pricingWords(p *billing.Product) string {
	if p == nil {
		return "no longer offered"
	}
	price := ""
	if p.Price > 0 {
		price = priceText(p, billing.Mul(billing.Whole(priceBlock(p)), p.Price)) + " " + perText(p)
	}
	quota := ""
	if p.Quota != nil {
		quota = periodAdjective(p.Period) + " quota of " + quantityText(p, *p.Quota)
	}
	var parts []string
	switch p.BillingModel {
	case billing.Subscription:
		switch {
		case quota == "":
			parts = append(parts, periodAdjective(p.Period)+" subscription, no quota")
		case p.OverageAllowed() && price != "":
			parts = append(parts, quota, "then "+price)
		case p.OverageAllowed():
			parts = append(parts, quota, "more allowed at no charge")
		default:
			parts = append(parts, quota)
		}
	case billing.Prepaid:
		parts = append(parts, "prepaid credits")
		if price != "" {
			parts = append(parts, price)
		}
		if quota != "" {
			parts = append(parts, quota)
		}
	default: // USAGE_POSTPAID, USAGE_INSTANT
		if price != "" {
			parts = append(parts, "pay as you go", price)
		} else {
			parts = append(parts, "pay as you go, "+perText(p))
		}
		if p.BillingModel == billing.UsageInstant {
			parts[0] = "pay as you go, charged at each call"
		}
		if quota != "" {
			parts = append(parts, quota)
		}
	}
	if p.SpendingCap != nil {
		parts = append(parts, "spending cap of "+priceText(p, *p.SpendingCap)+" a "+periodNoun(p.Period))
	}
	return strings.Join(parts, ", ")
}

func periodNoun(period string) string {
	switch strings.ToLower(period) {
	case "day", "week", "year":
		return strings.ToLower(period)
	}
	return "month"
}

// rateWords is a rate limit as a caller reads it: "10/min".
func rateWords(rl *billing.RateLimit) string {
	if rl == nil || rl.Requests <= 0 {
		return ""
	}
	switch w := rl.Window(); w {
	case time.Second:
		return fmt.Sprintf("%d/s", rl.Requests)
	case time.Minute:
		return fmt.Sprintf("%d/min", rl.Requests)
	case time.Hour:
		return fmt.Sprintf("%d/hour", rl.Requests)
	case 24 * time.Hour:
		return fmt.Sprintf("%d/day", rl.Requests)
	default:
		return fmt.Sprintf("%d per %s", rl.Requests, w)
	}
}

// subscriptionWords is a subscription's status in words.
func subscriptionWords(status string) string {
	switch subscription.Status(strings.ToUpper(status)) {
	case subscription.Active:
		return "Active"
	case subscription.Trial:
		return "Trial"
	case subscription.Cancelling, subscription.CancellingPending:
		return "Cancelling at period end"
	case subscription.Expired:
		return "Expired"
	case subscription.Cancelled:
		return "Cancelled"
	case subscription.Suspended:
		return "Suspended"
	}
	return status
}

// endingWords is a status in words with its end when it has one and
// still grants access: "Trial — ends 2026-12-26", "Cancelling — ends …".
// After the end the status is the EndStatus, in its own words.
func endingWords(status string, endsAt time.Time) string {
	st := subscription.Status(strings.ToUpper(status))
	if endsAt.IsZero() || !st.GrantsAccess() {
		return subscriptionWords(status)
	}
	words := subscriptionWords(status)
	if st == subscription.Cancelling || st == subscription.CancellingPending {
		words = "Cancelling"
	}
	return words + " — ends " + endsAt.UTC().Format(time.DateOnly)
}

// invoiceWords is a Stripe invoice's status in words; failed is an open
// invoice whose payment did not go through, said apart (the page marks
// it).
func invoiceWords(status string, failed bool) string {
	switch status {
	case "paid":
		return "Paid"
	case "open":
		if failed {
			return "Payment failed"
		}
		return "Awaiting payment"
	case "draft":
		return "Being prepared, not yet due"
	case "void":
		return "Cancelled, nothing to pay"
	case "uncollectible":
		return "Unpaid, written off"
	}
	return keyWords(status)
}

// storedCreditsText is creditsText of a count of credits a payment
// record holds as a decimal string; one it cannot read is shown as it is.
func storedCreditsText(s string) string {
	u, err := billing.ParseStoredUnits(s)
	if err != nil {
		return s + " credits"
	}
	return creditsText(u)
}

// jobWords is a job's status in words.
func jobWords(status string) string {
	switch status {
	case store.JobPending:
		return "Waiting"
	case store.JobRunning:
		return "Running"
	case store.JobCompleted:
		return "Done"
	case store.JobFailed:
		return "Failed"
	}
	return status
}

// keyWords is a key's status in words.
func keyWords(status string) string {
	if status == "" {
		return ""
	}
	return strings.ToUpper(status[:1]) + status[1:]
}

// untilWords is when a limit reached stops refusing calls, or a
// subscription ends: the day and, as a period ends at the time of day its
// subscription began, the minute, rounded up so the time named is never
// early ("26 Dec 2026 17:46 UTC").
func untilWords(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	if r := t.UTC().Truncate(time.Minute); r.Before(t) {
		t = r.Add(time.Minute)
	}
	return t.UTC().Format("2 Jan 2006 15:04 UTC")
}

// timeWords is a moment as the portal writes every time, in the words
// of dateWords and untilWords: "26 Dec 2026 17:46 UTC" (to the minute,
// not rounded up: a key used at 17:46:59 was last used at 17:46).
func timeWords(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2 Jan 2006 15:04 UTC")
}

// dateWords is a day as people write it: "26 Dec 2026".
func dateWords(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2 Jan 2006")
}
