package console

import (
	"context"
	"html"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// planEnv is a console over one public service, "Shop API", selling a
// free plan and "Pro" at 29 USD a month (a period price, in the product's
// listing) with a quota of 10,000 requests.
func planEnv(t *testing.T) *env {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	small, big, price := billing.Whole(5), billing.Whole(10_000), billing.Whole(29)
	sub := func(id string, q *billing.Units) *billing.Product {
		return &billing.Product{ID: id, BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
			UnitLabel: "request", Quota: q, Overage: "block"}
	}
	svc := &catalog.Service{ID: "shop", DisplayName: "Shop API", Public: true, Backend: "http://127.0.0.1:9", Secrets: []string{testSecret},
		Endpoints: []*catalog.Endpoint{{ID: "hello", Path: "/hello"}},
		Products:  []*billing.Product{sub("free", &small), sub("pro", &big)},
		ProductListings: []*catalog.ProductListing{
			{Product: "free", DisplayName: "Free", SelfService: true},
			{Product: "pro", DisplayName: "Pro", SelfService: true, Currency: "USD", PeriodPrice: &price},
		}}
	cat, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	used := ops.NewKeyUse()
	rt := engine.New(engine.Runtime{Catalog: cat, Data: st, KeyUsed: used.Touch, Calls: new(engine.Calls)})
	return &env{rt: rt, ops: ops.New(rt, used.Get)}
}

// TestServicesPageShowsPlanPrices: the services page shows a plan sold at
// 29 USD a month at that price, with its currency, and each service and
// plan under the name callers see on the storefront; not "Price: —" for
// the one plan that costs money.
func TestServicesPageShowsPlanPrices(t *testing.T) {
	h := direct(t, planEnv(t), false)
	w := serve(h, httptest.NewRequest("GET", "/console/services", nil), testOperator)
	page := w.Body.String()
	if w.Code != 200 {
		t.Fatalf("services: %d\n%s", w.Code, page)
	}
	row := regexp.MustCompile(`(?s)<tr><td data-label="Product">pro\b.*?</tr>`).FindString(page)
	if row == "" {
		t.Fatalf("no row of pro:\n%s", page)
	}
	for _, want := range []string{"29.00 USD a month", "Pro"} {
		if !strings.Contains(row, want) {
			t.Errorf("the row of pro lacks %q: %s", want, row)
		}
	}
	if !strings.Contains(page, "Shop API") {
		t.Errorf("the page does not name the service Shop API:\n%s", page)
	}
}

// TestLimitBarInWords: a user's quota bar reads as a person writes it,
// "quota: 0 of 10,000 requests (0%)", not "0 of 10000 request (0%)"; a
// quota of one keeps its noun singular.
func TestLimitBarInWords(t *testing.T) {
	e := planEnv(t)
	if _, err := e.ops.PutSubscription(context.Background(), "test", "alice", "shop", "pro", ""); err != nil {
		t.Fatal(err)
	}
	h := direct(t, e, false)
	page := html.UnescapeString(serve(h, httptest.NewRequest("GET", "/console/users/alice", nil), testOperator).Body.String())
	if !strings.Contains(page, "quota: 0 of 10,000 requests (0%)") {
		t.Errorf("the user's page lacks the quota bar in words:\n%s", page)
	}
	if l := newLimit("quota", billing.Whole(1), billing.Whole(1), "request"); l.Num(l.Max)+" "+l.UnitText() != "1 request" {
		t.Errorf("a quota of one: %q", l.Num(l.Max)+" "+l.UnitText())
	}
}

// TestStripeBilledPlanChangeConfirmed: moving a user off a plan Stripe
// bills (Pro, 29.00 USD a month through Checkout) to another in the
// console asks first, saying that Stripe keeps charging for the old plan
// until it is changed in Stripe; nothing changes until confirmed. A plan
// Stripe does not bill changes at once, as before.
func TestStripeBilledPlanChangeConfirmed(t *testing.T) {
	e := planEnv(t)
	ctx := context.Background()
	if _, err := e.ops.PutSubscription(ctx, "test", "alice", "shop", "pro", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ops.PutSubscription(ctx, "test", "bob", "shop", "free", ""); err != nil {
		t.Fatal(err)
	}
	h := direct(t, e, false)
	h.payments = &payments.Config{Prices: []payments.Price{{Service: "shop", Product: "pro", Price: "price_pro_usd"}}}
	product := func(user string) string {
		sub, err := e.rt.Store().GetSubscription(ctx, user, "shop")
		if err != nil {
			t.Fatal(err)
		}
		return sub.ProductID
	}
	c, tok := session(t, h, "/console/users/alice", testOperator)
	form := url.Values{"csrf": {tok}, "form": {"sub-shop"}, "serviceId": {"shop"}, "productId": {"free"}, "status": {"ACTIVE"}}
	w := post(h, "/console/users/alice/subscription", form, c, testOperator)
	page := html.UnescapeString(w.Body.String())
	if product("alice") != "pro" {
		t.Fatal("the plan Stripe bills was changed without asking")
	}
	for _, want := range []string{`id="confirm-form"`, "Stripe", "29.00 USD a month", "keeps charging"} {
		if !strings.Contains(page, want) {
			t.Errorf("the confirmation lacks %q:\n%s", want, page)
		}
	}
	form.Set("confirm", "yes")
	if w := post(h, "/console/users/alice/subscription", form, c, testOperator); w.Code >= 400 || product("alice") != "free" {
		t.Errorf("confirmed: %d, product %s", w.Code, product("alice"))
	}

	c, tok = session(t, h, "/console/users/bob", testOperator)
	form = url.Values{"csrf": {tok}, "form": {"sub-shop"}, "serviceId": {"shop"}, "productId": {"pro"}, "status": {"ACTIVE"}}
	if w := post(h, "/console/users/bob/subscription", form, c, testOperator); strings.Contains(w.Body.String(), `id="confirm-form"`) || product("bob") != "pro" {
		t.Errorf("a change from a plan Stripe does not bill asked or failed: product %s\n%s", product("bob"), w.Body)
	}
}

// TestServicesPageUnitsPerCall: an endpoint with no cost of its own costs
// one unit a call, which the services page says ("1"), as the storefront
// does ("1 unit per call"), not "—", which reads as nothing; where no
// product counts calls (a service sold by the token), the unit is what a
// call holds while it runs ("1 held").
func TestServicesPageUnitsPerCall(t *testing.T) {
	h := direct(t, planEnv(t), false)
	page := serve(h, httptest.NewRequest("GET", "/console/services", nil), testOperator).Body.String()
	if !strings.Contains(page, `<td data-label="Units per call" class="num">1</td>`) {
		t.Errorf("the endpoint's units per call:\n%s", page)
	}
	tokens := serviceRow{Service: &catalog.Service{Products: []*billing.Product{{ID: "t", MeasurementType: billing.PerToken}}}}
	if got := tokens.CallUnits(&catalog.Endpoint{ID: "e"}); got != "1 held" {
		t.Errorf("a call of a service sold by the token: %q", got)
	}
}
