package storefront

import (
	"slices"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
)

// TestPlanOf: each billing model's terms in words, every amount of money
// with its ISO code and the currency's minor digits.
func TestPlanOf(t *testing.T) {
	quota := billing.Whole(1000)
	one := billing.Whole(1)
	spend := billing.Whole(25)
	cases := []struct {
		name    string
		product billing.Product
		listing catalog.ProductListing
		price   string
		per     string
		terms   []string
		trial   string
	}{
		{"free tier", billing.Product{BillingModel: billing.Subscription, UnitLabel: "request", Quota: &quota, Overage: "block"},
			catalog.ProductListing{}, "Free", "",
			[]string{"1,000 requests included per month", "Calls past the quota are refused until the next month"}, ""},
		{"monthly fee with overage", billing.Product{BillingModel: billing.Subscription, UnitLabel: "request", Quota: &quota, Overage: "allow", Price: *units("0.01"), Period: "YEAR"},
			catalog.ProductListing{Currency: "EUR", PeriodPrice: units("9.5"), TrialDays: 30}, "9.50 EUR", "per year",
			[]string{"1,000 requests included per year", "Past the quota: 0.01 EUR per request"}, "30-day free trial: nothing is charged, and calls past the quota are refused until it ends"},
		{"pay as you go in yen", billing.Product{BillingModel: billing.UsagePostpaid, UnitLabel: "token", Price: *units("3"), SpendingCap: &spend},
			catalog.ProductListing{Currency: "JPY"}, "3 JPY", "per token",
			[]string{"Spending capped at 25 JPY per month"}, ""},
		{"fee plus usage", billing.Product{BillingModel: billing.UsageInstant, Price: *units("0.0025")},
			catalog.ProductListing{Currency: "USD", PeriodPrice: units("5")}, "5.00 USD", "per month",
			[]string{"Plus 0.0025 USD per unit"}, ""},
		{"prepaid", billing.Product{BillingModel: billing.Prepaid, UnitLabel: "second", Price: *units("0.5")},
			catalog.ProductListing{}, "Prepaid credits", "",
			[]string{"Each second takes 0.5 credits from your prepaid balance"}, ""},
		{"one request a second", billing.Product{BillingModel: billing.Subscription, UnitLabel: "report", Quota: &one, Overage: "block",
			RateLimit: &billing.RateLimit{Requests: 1}},
			catalog.ProductListing{}, "Free", "",
			[]string{"1 report included per month", "Calls past the quota are refused until the next month", "Up to 1 request per second, bursts of 1"}, ""},
		{"prepaid, one credit a call", billing.Product{BillingModel: billing.Prepaid, UnitLabel: "lookup", Price: one, SpendingCap: &one},
			catalog.ProductListing{}, "Prepaid credits", "",
			[]string{"Each lookup takes 1 credit from your prepaid balance", "Spending capped at 1 credit per month"}, ""},
		{"quota of one", billing.Product{BillingModel: billing.Subscription, UnitLabel: "report", Quota: &one, Overage: "block", Period: "DAY",
			RateLimit: &billing.RateLimit{Requests: 5, WindowSeconds: 60, Burst: 2}},
			catalog.ProductListing{}, "Free", "",
			[]string{"1 report included per day", "Calls past the quota are refused until the next day", "Up to 5 requests per 60 seconds, bursts of 2"}, ""},
	}
	for _, c := range cases {
		c.product.ID, c.listing.Product = "p", "p"
		got := planOf(&c.product, &c.listing)
		if got.Price != c.price || got.Per != c.per || got.Trial != c.trial || !slices.Equal(got.Terms, c.terms) {
			t.Errorf("%s: got %q %q %q %q\nwant %q %q %q %q", c.name, got.Price, got.Per, got.Terms, got.Trial, c.price, c.per, c.terms, c.trial)
		}
	}
}

// TestImageAllowed: only site paths and the configured origins, compared
// as whole origins.
func TestImageAllowed(t *testing.T) {
	origins := []string{"https://cdn.example.com"}
	for u, want := range map[string]bool{
		"/img/a.png":                         true,
		"https://cdn.example.com/a.png":      true,
		"https://cdn.example.com:8443/a.png": false,
		"http://cdn.example.com/a.png":       false,
		"https://cdn.example.com.evil/a.png": false,
		"//cdn.example.com/a.png":            false,
		"https://other.example.com/a.png":    false,
	} {
		if got := imageAllowed(u, origins); got != want {
			t.Errorf("%s: %v, want %v", u, got, want)
		}
	}
}
