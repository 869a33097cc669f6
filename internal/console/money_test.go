package console

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// moneyNow is the clock of the money tests: mid-month, so the month's
// figures never straddle a month's end.
var moneyNow = time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)

// moneyCatalog sells in two currencies and in credits, and has two
// products whose listing names no currency (a private service may):
// eu/pay (0.0125 EUR a request), jp/pay (3 JPY), kw/pay (0.125 KWD,
// 3 decimals), pre/credits (0.5 credits), odd/a and odd/b (2 each, no
// currency; eu/pay capped at capEUR). withOld adds old/gone (1 a request), which the console's
// catalog no longer has.
func moneyCatalog(t *testing.T, withOld bool, capEUR billing.Units) *catalog.Catalog {
	t.Helper()
	svc := func(id string, p *billing.Product, ls ...*catalog.ProductListing) *catalog.Service {
		return &catalog.Service{ID: id, Backend: "http://127.0.0.1:9", Secrets: []string{testSecret},
			Endpoints: []*catalog.Endpoint{{ID: "get", Path: "/get"}}, Products: []*billing.Product{p}, ProductListings: ls}
	}
	post := func(id string, price billing.Units) *billing.Product {
		return &billing.Product{ID: id, BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, UnitLabel: "request", Price: price}
	}
	odd := svc("odd", post("a", billing.Whole(2)))
	odd.Products = append(odd.Products, post("b", billing.Whole(2)))
	eu := post("pay", billing.Whole(1)/80)
	eu.SpendingCap = &capEUR
	services := []*catalog.Service{
		svc("eu", eu, &catalog.ProductListing{Product: "pay", Currency: "EUR"}),
		svc("jp", post("pay", billing.Whole(3)), &catalog.ProductListing{Product: "pay", Currency: "JPY"}),
		svc("kw", post("pay", billing.Whole(1)/8), &catalog.ProductListing{Product: "pay", Currency: "KWD"}),
		svc("pre", &billing.Product{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, UnitLabel: "request", Price: billing.Whole(1) / 2}),
		odd,
	}
	if withOld {
		services = append(services, svc("old", post("gone", billing.Whole(1))))
	}
	cat, err := catalog.Compile(services, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

// moneyEnv is a console over a bbolt store where ann spent in euros,
// yen, dinars, credits and a product without a currency this month, and
// ben in the other product without one and in a product since removed.
func moneyEnv(t *testing.T) (*env, store.Store) {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clock := func() time.Time { return moneyNow }
	used := ops.NewKeyUse()
	before := engine.New(engine.Runtime{Catalog: moneyCatalog(t, true, billing.Whole(100)), Data: st, KeyUsed: used.Touch, Calls: new(engine.Calls), Clock: clock})
	seed := ops.New(before, used.Get)
	bg := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range [][3]string{{"ann", "eu", "pay"}, {"ann", "jp", "pay"}, {"ann", "kw", "pay"}, {"ann", "pre", "credits"}, {"ann", "odd", "a"},
		{"ben", "odd", "b"}, {"ben", "old", "gone"}} {
		_, err := seed.PutSubscription(bg, "console:operator", s[0], s[1], s[2], "ACTIVE")
		must(err)
	}
	_, err = seed.AddCredits(bg, "console:operator", "ann", "pre", billing.Whole(20))
	must(err)
	call := func(user, service, product string, units int64) {
		t.Helper()
		svc, _ := before.Catalog.Service(service)
		p, _ := svc.Product(product)
		res, err := st.Reserve(bg, store.Account{UserID: user, ServiceID: service, Product: *p}, billing.Whole(1), moneyNow)
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("hold for %s on %s: %v %+v", user, service, err, res.Decision)
		}
		_, err = st.Settle(bg, res, billing.Whole(units), store.LedgerEntry{Time: moneyNow, UserID: user,
			ServiceID: service, EndpointID: "get", ProductID: product, Source: store.SourceGateway})
		must(err)
	}
	call("ann", "eu", "pay", 100)     // 1.25 EUR
	call("ann", "eu", "pay", 20)      // 0.25 EUR: 1.50 EUR, past the cap of 1.20
	call("ann", "jp", "pay", 7)       // 21 JPY
	call("ann", "kw", "pay", 9)       // 1.125 KWD
	call("ann", "pre", "credits", 10) // 5 credits
	call("ann", "odd", "a", 4)        // 8, no currency
	call("ben", "odd", "b", 3)        // 6, no currency
	call("ben", "old", "gone", 5)     // 5, product since removed
	_, err = st.CreateAlert(bg, store.Alert{UserID: "ann", ServiceID: "eu", ProductID: "pay", PeriodStart: moneyNow.Add(-time.Hour),
		Threshold: "spending_cap 100%", Value: billing.Whole(3) / 2, Limit: billing.Whole(6) / 5, Created: moneyNow, Status: "DELIVERED"})
	must(err)
	// An alert that recorded its currency when it fired, on a product
	// since removed.
	_, err = st.CreateAlert(bg, store.Alert{UserID: "ben", ServiceID: "old", ProductID: "gone", PeriodStart: moneyNow.Add(-time.Hour),
		Threshold: "spending_cap 90%", Value: billing.Whole(5), Limit: billing.Whole(9) / 2, Currency: "USD", Created: moneyNow, Status: "DELIVERED"})
	must(err)
	// A quota alert of the removed product, with the unit it recorded.
	_, err = st.CreateAlert(bg, store.Alert{UserID: "ben", ServiceID: "old", ProductID: "gone", PeriodStart: moneyNow.Add(-time.Hour),
		Threshold: "quota 80%", Value: billing.Whole(8), Limit: billing.Whole(8), Unit: "page", Created: moneyNow, Status: "DELIVERED"})
	must(err)
	// The console reads it with the cap lowered to 1.20 EUR (ann at
	// 125%) and old/gone removed.
	rt := engine.New(engine.Runtime{Catalog: moneyCatalog(t, false, billing.Whole(6)/5), Data: st, KeyUsed: used.Touch, Calls: new(engine.Calls), Clock: clock})
	return &env{rt: rt, ops: ops.New(rt, used.Get)}, st
}

// pageText is a page's text: tags dropped, entities decoded, spaces
// folded.
func pageText(body string) string {
	s := regexp.MustCompile(`(?s)<[^>]*>`).ReplaceAllString(body, " ")
	return strings.Join(strings.Fields(html.UnescapeString(s)), " ")
}

func getPage(t *testing.T, h *Handler, path string) string {
	t.Helper()
	w := serve(h, httptest.NewRequest("GET", path, nil), "operator")
	if w.Code != 200 {
		t.Fatalf("GET %s: %d %s", path, w.Code, w.Body)
	}
	return pageText(w.Body.String())
}

// The money kinds the tests expect, as the pages write them.
const (
	oddA = "8 of odd/a (its listing names no currency)"
	oddB = "6 of odd/b (its listing names no currency)"
	gone = "5 of removed product old/gone (credits or currency unknown)"
)

// TestConsoleMoneyKeptApart: every page that sums costs keeps credits
// apart from money and one currency apart from another, writes money with
// its currency and the currency's minor digits (1.50 EUR, 21 JPY, 1.125
// KWD), and never adds two products whose currency is unknown, to each
// other or to anything. The old console wrote "1.5 EUR" and one "money"
// figure for the unknown ones ("19 money").
func TestConsoleMoneyKeptApart(t *testing.T) {
	e, _ := moneyEnv(t)
	h := direct(t, e, false)
	month := "cost 1.50 EUR, 21 JPY, 1.125 KWD, 5 credits, " + oddA + ", " + oddB + ", " + gone
	for _, tc := range []struct {
		path string
		want []string
	}{
		{"/console/", []string{
			"entries in November 2026: 153 request, 5 units of removed product old/gone; " + month,
			"ann 6 150 request 1.50 EUR, 21 JPY, 1.125 KWD, 5 credits, " + oddA,
			"ben 2 3 request, 5 units of removed product old/gone " + oddB + ", " + gone,
		}},
		{"/console/usage?from=2026-11-01", []string{
			"8 entries, 153 request, 5 units of removed product old/gone , " + month + " .",
			"cost in EUR per day : 1.50 EUR in all", "cost in JPY per day : 21 JPY in all", "cost in KWD per day : 1.125 KWD in all",
			"cost in credits per day : 5 credits in all",
			"eu get pay gateway 20 0.25 EUR", "jp get pay gateway 7 21 JPY", "kw get pay gateway 9 1.125 KWD",
			"pre get credits gateway 10 5 credits", "old get gone gateway 5 " + gone,
		}},
		{"/console/users", []string{
			"ann active 1.50 EUR, 21 JPY, 1.125 KWD, 5 credits, " + oddA,
			"ben active " + oddB + ", " + gone,
		}},
		{"/console/users/ann", []string{
			"spending cap: 1.50 of 1.20 EUR (125%)", "1.50 EUR", "21 JPY", "1.125 KWD", "5 credits", oddA,
		}},
		{"/console/services", []string{"0.0125 EUR", "3 JPY", "0.125 KWD", "0.5 credits", "2 of odd/a (its listing names no currency)"}},
		{"/console/alerts", []string{"spending_cap 100% 1.50 EUR 1.20 EUR", "spending_cap 90% 5.00 USD 4.50 USD", "quota 80% 8 page 8 page"}},
	} {
		got := getPage(t, h, tc.path)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: no %q in\n%s", tc.path, w, got)
			}
		}
		// No total across kinds: 1.5+21+1.125+5+8+6+5 in any grouping
		// would show a figure the page must not have.
		if m := regexp.MustCompile(`\d money`).FindString(got); m != "" {
			t.Errorf("%s: %q names no currency", tc.path, m)
		}
		for _, bad := range []string{"14 of", "19 ", "1.5 EUR", "47.625", "cost 29", "26.5"} {
			if strings.Contains(got, bad) {
				t.Errorf("%s: %q on the page:\n%s", tc.path, bad, got)
			}
		}
	}
}

// TestKindFor: a prepaid product's cost is in credits, a priced one's in
// its listing's currency, and one whose currency is not known is of its
// own kind, named by the product: never a bare number, never credits
// added to money, never two unknown currencies summed.
func TestKindFor(t *testing.T) {
	for _, tc := range []struct {
		p    *billing.Product
		want string
	}{
		{&billing.Product{BillingModel: billing.Prepaid, Currency: "EUR"}, "credits"},
		{&billing.Product{BillingModel: billing.UsagePostpaid, Currency: "EUR"}, "EUR"},
		{&billing.Product{BillingModel: billing.UsagePostpaid}, "of s/p (its listing names no currency)"},
		{nil, "of removed product s/p (credits or currency unknown)"},
	} {
		if got := kindFor("s", "p", tc.p); got != tc.want {
			t.Errorf("kindFor(%+v) = %q, want %q", tc.p, got, tc.want)
		}
	}
	for _, tc := range []struct {
		v    billing.Units
		kind string
		want string
	}{
		{billing.Whole(29), "USD", "29.00 USD"},
		{billing.Whole(500), "JPY", "500 JPY"},
		{billing.Whole(1) / 8, "KWD", "0.125 KWD"},
		{billing.Whole(1) / 400, "USD", "0.0025 USD"},
		{billing.Whole(-5), "credits", "-5 credits"},
	} {
		if got := formatCost(tc.v, tc.kind); got != tc.want {
			t.Errorf("formatCost(%v, %s) = %q, want %q", tc.v, tc.kind, got, tc.want)
		}
	}
}

// TestHugeSumsNeverWrap: the console's sums of hourly rollups saturate as
// the rollups themselves do: four hours whose cost is 3·10^12 JPY each
// (reports of 10^12 requests at 3 JPY) are shown as the most an amount
// holds, never wrapped round to a negative amount.
func TestHugeSumsNeverWrap(t *testing.T) {
	e, st := moneyEnv(t)
	bg := context.Background()
	if _, err := e.ops.PutSubscription(bg, "test", "zed", "jp", "pay", "ACTIVE"); err != nil {
		t.Fatal(err)
	}
	svc, _ := e.rt.Catalog.Service("jp")
	p, _ := svc.Product("pay")
	month := time.Date(moneyNow.Year(), moneyNow.Month(), 1, 0, 0, 0, 0, time.UTC)
	for h := range 4 {
		_, err := st.Record(bg, store.Account{UserID: "zed", ServiceID: "jp", Product: *p},
			store.LedgerEntry{Time: month.Add(time.Duration(h) * time.Hour), UserID: "zed", ServiceID: "jp", EndpointID: "get", ProductID: "pay",
				Source: store.SourceReport, Units: billing.MaxUnits},
			func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil })
		if err != nil {
			t.Fatal(err)
		}
	}
	h := direct(t, e, false)
	for _, path := range []string{"/console/", "/console/users", "/console/revenue", "/console/usage?user=zed&from=" + month.Format(time.DateOnly)} {
		got := getPage(t, h, path)
		if neg := regexp.MustCompile(`(?:^|\s)-[0-9][0-9,.]* (?:JPY|request)`).FindAllString(got, -1); len(neg) > 0 {
			t.Errorf("%s: a negative sum: %q", path, neg)
		}
	}
}

// TestPriceOfAFreeProduct: a product that charges no money (weather/basic,
// a quota and no price, its listing naming no currency) has no price on
// the services page ("—", as its absent cap) and nothing spent on its
// subscriber's page, rather than "0 of weather/basic (its listing names
// no currency)": nothing is owed in any currency. A priced product whose
// listing names none keeps the words (TestMoneyKindsNeverSummed).
func TestPriceOfAFreeProduct(t *testing.T) {
	w := newWorld(t)
	get := func(path string) string {
		resp, err := http.Get(w.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		return string(b)
	}
	services := get("/services")
	row := regexp.MustCompile(`<tr><td data-label="Product">basic</td>.*?</tr>`).FindString(services)
	if !strings.Contains(row, `<td data-label="Price" class="num">—</td>`) {
		t.Errorf("the free product's row: %s", row)
	}
	for _, path := range []string{"/services", "/users/carol", "/users", "/usage?user=carol"} {
		if page := get(path); strings.Contains(page, "0 of weather/basic") {
			t.Errorf("%s names a currency-less zero: %s", path, regexp.MustCompile(`.{80}0 of weather/basic.{40}`).FindString(page))
		}
	}
}
