package ops

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// TestPeriodStateIsSummaryWithoutCutCount: PeriodState reads what
// Summarize does, but for the count of calls cut at a limit, for each
// kind of product (a quota, prepaid credits, a cap, one no longer in the
// catalog).
func TestPeriodStateIsSummaryWithoutCutCount(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	quota, spendCap := billing.Whole(10), billing.Whole(3)
	svc := &catalog.Service{ID: "weather", Backend: "http://127.0.0.1:9", Secrets: []string{"0123456789abcdef0123456789abcdef"},
		Endpoints: []*catalog.Endpoint{{ID: "hello"}},
		Products: []*billing.Product{
			{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &quota, Overage: "block"},
			{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1)},
			{ID: "capped", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1), SpendingCap: &spendCap},
		}}
	cat, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := New(engine.New(engine.Runtime{Catalog: cat, Data: st}), nil)
	ctx := context.Background()
	now := time.Now().UTC()
	for _, product := range []string{"basic", "credits", "capped"} {
		user := "u-" + product
		if _, err := o.PutSubscription(ctx, "test", user, "weather", product, "ACTIVE"); err != nil {
			t.Fatal(err)
		}
		sub, err := st.GetSubscription(ctx, user, "weather")
		if err != nil {
			t.Fatal(err)
		}
		p, _ := svc.Product(product)
		res, err := st.Reserve(ctx, store.Account{UserID: user, ServiceID: "weather", Product: *p}, billing.Whole(1), time.Now())
		if err == nil && res.Decision.Allowed {
			if _, err := st.Settle(ctx, res, billing.Whole(1), store.LedgerEntry{UserID: user, ServiceID: "weather", EndpointID: "hello", ProductID: product, Source: store.SourceGateway}); err != nil {
				t.Fatal(err)
			}
		}
		at := time.Now().UTC()
		want, err := o.Summarize(ctx, sub, at)
		if err != nil {
			t.Fatal(err)
		}
		want.CallsCutAtLimit = 0
		got, err := o.PeriodState(ctx, sub, at)
		if err != nil {
			t.Fatal(err)
		}
		if g, w := describe(got), describe(want); g != w {
			t.Errorf("%s: PeriodState %s, Summarize %s", product, g, w)
		}
	}
	gone := store.Subscription{UserID: "u-x", ServiceID: "weather", ProductID: "retired", Status: "ACTIVE"}
	if ps, _ := o.PeriodState(ctx, gone, now); !ps.ProductMissing {
		t.Error("a product no longer in the catalog is not marked missing")
	}
}

func describe(ps PeriodSummary) string {
	u := func(p *billing.Units) string {
		if p == nil {
			return "-"
		}
		return p.String()
	}
	return ps.ServiceID + "/" + ps.ProductID + " " + ps.BillingModel + " " + ps.PeriodStart.String() + "–" + ps.PeriodEnd.String() +
		" used " + ps.UnitsUsed.String() + " held " + ps.UnitsHeld.String() + " quota " + u(ps.Quota) + " left " + u(ps.UnitsRemaining) +
		" over " + u(ps.OverageUnits) + " credits " + ps.Credits.String() + " spend " + ps.Spend.String() + " cap " + u(ps.SpendingCap) + " capleft " + u(ps.SpendRemaining)
}
