package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestReportPastBlockedQuotaPricesNothing: a SUBSCRIPTION product whose
// overage is blocked charges no price: the gateway warns at load that its
// `price` "is never charged", the public catalog lists no overage price
// for it, and its calls past the quota are refused, never billed. A usage
// report is recorded past the quota all the same (its usage happened),
// and it must be recorded as what the product says it costs: nothing. It
// was priced as overage (5 units reported on a quota of 2 at 0.5 were
// recorded at a cost of 1.5, and added to the period's spend), money the
// listing never named and no invoice would carry.
func TestReportPastBlockedQuotaPricesNothing(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	catalog := strings.Replace(usageCatalog(be.URL, be.URL), "product tokens {", `product blocked {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 2
				overage block
				price 0.5
			}
			product tokens {`, 1)
	g := startGateway(t, t.TempDir(), catalog)
	g.subscribe("u-blocked", "svc", "blocked", "ACTIVE")
	resp, out := usagePost(t, usageSigned{URL: usageReportURL, Secret: usageSecret,
		Body: usageReportBody("u-blocked", "svc", "5", time.Now().Unix())})
	if resp.StatusCode != 200 || !strings.Contains(string(out), `"isOverLimit":true`) {
		t.Fatalf("report: %d %s", resp.StatusCode, out)
	}
	es := g.ledger("u-blocked")
	if len(es) != 1 || es[0].Units != billing.Whole(5) {
		t.Fatalf("ledger %+v", es)
	}
	if es[0].Cost != 0 {
		t.Errorf("the report past the blocked quota was recorded at a cost of %s (overage %s), want 0: the product's price is never charged", es[0].Cost, es[0].Overage)
	}
	p, _ := usageProduct(g, "u-blocked", "svc")
	st, err := g.store().State(context.Background(), store.Account{UserID: "u-blocked", ServiceID: "svc", Product: p}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.Spend != 0 || st.Used != billing.Whole(5) {
		t.Errorf("period: used %s, spend %s; want 5 and 0", st.Used, st.Spend)
	}
}
