package catalog

import (
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

func units(s string) *billing.Units {
	u, err := billing.ParseUnits(s)
	if err != nil {
		panic(err)
	}
	return &u
}

// listedService is a public service with a subscription and a usage
// product, both priced in euros.
func listedService() *Service {
	s := service()
	s.Public = true
	s.DisplayName = "Weather"
	s.LogoURL = "https://cdn.example.com/weather.png"
	s.CoverImageURL = "/img/cover.jpg"
	s.Tags = []string{"weather", "geo"}
	s.Features = []*Feature{
		{ID: "fast", Label: "Fast", DisplayOrder: 2},
		{ID: "global", Label: "Global", DisplayOrder: 1, InfoTooltip: "Every country"},
		{ID: "cheap", Label: "Cheap", DisplayOrder: 2},
	}
	s.Products = append(s.Products, &billing.Product{ID: "metered", BillingModel: billing.UsagePostpaid,
		MeasurementType: billing.PerRequest, Price: *units("0.0025")})
	s.ProductListings = []*ProductListing{
		{Product: "basic", DisplayName: "Basic", Currency: "EUR", PeriodPrice: units("29"), TrialDays: 14, SelfService: true},
		{Product: "metered", Currency: "EUR"},
	}
	return s
}

func TestCompileListing(t *testing.T) {
	c, err := Compile([]*Service{listedService()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Service("weather")
	var order []string
	for _, f := range s.FeaturesInOrder() {
		order = append(order, f.ID)
	}
	if got := strings.Join(order, " "); got != "global fast cheap" {
		t.Errorf("features in order %q: by display order, ties as configured", got)
	}
	l, ok := s.Listing("basic")
	if !ok || l.Name() != "Basic" || !s.Listed("basic") {
		t.Fatalf("listing of basic: %+v", l)
	}
	if m, ok := l.PeriodPriceMoney(); !ok || m.String() != "29.00 EUR" {
		t.Errorf("period price %v", m)
	}
	metered, _ := s.Product("metered")
	ml, _ := s.Listing("metered")
	if m, ok := ml.UnitPriceMoney(metered); !ok || m.String() != "0.0025 EUR" {
		t.Errorf("unit price %v: exact, never rounded to cents", m)
	}
	basic, _ := s.Product("basic")
	if _, ok := l.UnitPriceMoney(basic); ok {
		t.Error("a subscription that blocks at its quota bills no unit price")
	}
	if basic.Currency != "EUR" || metered.Currency != "EUR" {
		t.Errorf("products' currency %q, %q: the console and portal name money by it", basic.Currency, metered.Currency)
	}
}

func TestCompileListingRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Service)
		want   string
	}{
		{"unknown currency", func(s *Service) { s.ProductListings[0].Currency = "EUX" }, "currency 'EUX' is not an ISO 4217 code"},
		{"lower-case currency", func(s *Service) { s.ProductListings[0].Currency = "eur" }, "currency 'eur'"},
		{"withdrawn currency", func(s *Service) { s.ProductListings[0].Currency = "DEM" }, "currency 'DEM'"},
		{"no currency at all", func(s *Service) { s.ProductListings[0].Currency = "XXX" }, "currency 'XXX'"},
		{"a metal", func(s *Service) { s.ProductListings[0].Currency = "XAU" }, "currency 'XAU'"},
		{"no currency", func(s *Service) { s.ProductListings[0].Currency = "" }, "period_price 29 has no currency"},
		{"usage price without currency", func(s *Service) { s.ProductListings[1].Currency = "" }, "product metered: price 0.0025 is money"},
		{"self service and private", func(s *Service) { s.ProductListings[0].Private = true }, "self_service and private together"},
		{"self service, service not public", func(s *Service) { s.Public = false }, "self_service on a service that is not public"},
		{"long trial", func(s *Service) { s.ProductListings[0].TrialDays = 400 }, "trial of 400 days"},
		{"listing of no product", func(s *Service) { s.ProductListings[1].Product = "gold" }, `listing for product "gold"`},
		{"listing twice", func(s *Service) { s.ProductListings[1].Product = "basic" }, "listing for product basic given twice"},
		{"feature twice", func(s *Service) { s.Features[1].ID = "fast" }, "feature fast declared twice"},
		{"feature without label", func(s *Service) { s.Features[0].Label = "" }, "feature fast has no label"},
		{"logo not a URL", func(s *Service) { s.LogoURL = "javascript:alert(1)" }, "logo_url 'javascript:…'"},
		{"cover from another scheme-relative host", func(s *Service) { s.CoverImageURL = "//evil.example/x.png" }, "cover_image_url"},
		{"bad tag", func(s *Service) { s.Tags = []string{"Weather"} }, "tag 'Weather'"},
		{"tag twice", func(s *Service) { s.Tags = []string{"geo", "geo"} }, "tag geo given twice"},
		{"control character", func(s *Service) { s.DisplayName = "a\x00b" }, "display_name holds a control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := listedService()
			tc.change(s)
			_, err := Compile([]*Service{s}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Compile: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestPrivateServiceNeedsNoCurrency(t *testing.T) {
	// A usage price on a service nobody sees publicly is what every
	// catalog had before listings: it still loads.
	s := listedService()
	s.Public = false
	s.ProductListings = nil
	if _, err := Compile([]*Service{s}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestFormatAmount(t *testing.T) {
	for _, tc := range []struct{ amount, currency, want string }{
		{"29", "USD", "29.00"},
		{"29.5", "EUR", "29.50"},
		{"0.0025", "USD", "0.0025"},
		{"500", "JPY", "500"},
		{"1.5", "JPY", "1.5"},
		{"1.2", "KWD", "1.200"},
		{"0", "USD", "0.00"},
	} {
		if got := FormatAmount(*units(tc.amount), tc.currency); got != tc.want {
			t.Errorf("FormatAmount(%s %s) = %s, want %s", tc.amount, tc.currency, got, tc.want)
		}
	}
}

func TestMinorUnits(t *testing.T) {
	for _, tc := range []struct {
		amount, currency string
		want             int64
		ok               bool
	}{
		{"29", "USD", 2900, true},
		{"29.99", "EUR", 2999, true},
		{"500", "JPY", 500, true},
		{"1.234", "KWD", 1234, true},
		{"0.0025", "USD", 0, false},
		{"1.5", "JPY", 0, false},
	} {
		got, ok := Money{Amount: *units(tc.amount), Currency: tc.currency}.MinorUnits()
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s %s: %d %v, want %d %v", tc.amount, tc.currency, got, ok, tc.want, tc.ok)
		}
	}
}
