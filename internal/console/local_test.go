package console

import (
	"path/filepath"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// local is the console's world without Caddy: the catalog of start's
// Caddyfile (service weather, endpoint hello, products basic and
// credits), a real bbolt store in t.TempDir(), the runtime around them and
// the operations over it, as the platform app builds them. The tests that
// use it drive the handler directly (direct, serve) with httptest; those
// that need a gateway call, Caddy's routing or basic_auth use start.
func local(t *testing.T) *env {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	quota := billing.Whole(100)
	svc := &catalog.Service{
		ID: "weather", Backend: "http://127.0.0.1:9", Secrets: []string{testSecret},
		Endpoints: []*catalog.Endpoint{{ID: "hello", Methods: []string{"GET", "POST"}, Path: "/hello"}},
		Products: []*billing.Product{
			{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request",
				Quota: &quota, Period: "month", Overage: "block"},
			{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, UnitLabel: "request",
				Price: billing.Whole(1) / 2},
		},
	}
	cat, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	used := ops.NewKeyUse()
	rt := engine.New(engine.Runtime{Catalog: cat, Data: st, KeyUsed: used.Touch, Calls: new(engine.Calls)})
	return &env{rt: rt, ops: ops.New(rt, used.Get)}
}
