package catalog

import (
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

// offerService is a public service with one product of each kind a caller
// meets on the plans page.
func offerService(public bool) *Service {
	s := service()
	s.Public = public
	small, big := billing.Whole(100), billing.Whole(1000)
	sub := func(id string, q *billing.Units) *billing.Product {
		return &billing.Product{ID: id, BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: q}
	}
	s.Products = []*billing.Product{
		sub("free", &small), sub("bigfree", &big), sub("unlimited", nil), sub("trial", &big), sub("pro", &big), sub("assigned", &small),
		sub("hidden", &small),
		{ID: "metered", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: *units("0.01")},
		{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: *units("1")},
	}
	s.ProductListings = []*ProductListing{
		{Product: "free", SelfService: public},
		{Product: "bigfree", SelfService: public},
		{Product: "unlimited", SelfService: public},
		{Product: "trial", SelfService: public, TrialDays: 14, Currency: "EUR", PeriodPrice: units("29")},
		{Product: "pro", SelfService: public, Currency: "EUR", PeriodPrice: units("29")},
		{Product: "assigned"},
		{Product: "hidden", Private: true},
		{Product: "metered", SelfService: public, Currency: "EUR"},
		{Product: "credits", SelfService: public},
	}
	return s
}

func TestSelfServiceOffer(t *testing.T) {
	c, err := Compile([]*Service{offerService(true)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Service("weather")
	for product, want := range map[string]Offer{
		"free": OfferFree, "bigfree": OfferFree, "unlimited": OfferFree,
		"trial": OfferTrial, "pro": OfferPaid, "metered": OfferPaid, "credits": OfferPaid,
		"assigned": NotOffered, "hidden": NotOffered, "gone": NotOffered,
	} {
		if got := s.SelfServiceOffer(product); got != want {
			t.Errorf("%s: offer %d, want %d", product, got, want)
		}
	}
	c, err = Compile([]*Service{offerService(false)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, _ = c.Service("weather")
	if got := s.SelfServiceOffer("free"); got != NotOffered {
		t.Errorf("a service that is not public offers %d", got)
	}
}

func TestPricier(t *testing.T) {
	c, err := Compile([]*Service{offerService(true)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Service("weather")
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"bigfree", "free", true},    // a larger quota
		{"free", "bigfree", false},   // a smaller one
		{"unlimited", "free", true},  // no quota is the most
		{"free", "unlimited", false}, //
		{"pro", "unlimited", true},   // a period price beats any quota
		{"metered", "free", true},    // a unit price
		{"free", "free", false},      // no change
		{"free", "gone", false},      // no such product
	} {
		if got := s.Pricier(tc.a, tc.b); got != tc.want {
			t.Errorf("Pricier(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
