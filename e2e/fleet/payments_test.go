package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

const fleetWhsec = "whsec_fleet_0123456789abcdef0123456789abcdef"

// TestFleetWebhookOnce: two gateway processes on one PostgreSQL store
// take payments; Stripe's event delivered to both at once (a retry that
// two nodes behind a balancer both take) is applied once: one audit
// entry, the subscription ACTIVE on both nodes, calls served by both;
// a later failure past the grace is seen by both.
func TestFleetWebhookOnce(t *testing.T) {
	mock := stripetest.Start(t)
	dsn := fleetDB(t)
	f := newFleet(t, dsn, 2, func(f *fleet) {
		f.payments = fmt.Sprintf("\t\tpayments stripe {\n\t\t\tsecret_key sk_test_fleet\n\t\t\twebhook_secret %s\n\t\t\tapi_base %s\n\t\t\tprice %s paid price_paid\n\t\t}",
			fleetWhsec, mock.URL, fleetService)
	})

	// The user's Stripe customer, as the portal's Checkout leaves it.
	ctx := context.Background()
	st, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "test-seed", MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(payments.CustomerRecord{UserID: "u-fleet-pay", CustomerID: "cus_fleet", CreatedAt: time.Now().UTC()})
	for kind, id := range map[string]string{payments.KindCustomer: "u-fleet-pay", payments.KindCustomerUser: "cus_fleet"} {
		if _, err := st.InsertPaymentRecord(ctx, kind, id, rec, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	var k struct {
		Key string `json:"key"`
	}
	e2etest.AdminJSON(t, "POST", f.nodes[0].admin+"/platform/keys", map[string]any{"userId": "u-fleet-pay"}, 201, &k)

	created := time.Now().Add(-time.Minute).Truncate(time.Second)
	ev := stripetest.Event("evt_fleet_1", "customer.subscription.created", created, map[string]any{
		"id": "sub_fleet", "object": "subscription", "customer": "cus_fleet", "status": "active",
		"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_f", "object": "subscription_item",
			"price": map[string]any{"id": "price_paid", "object": "price"}, "current_period_end": created.Add(720 * time.Hour).Unix()}}}})
	var wg sync.WaitGroup
	statuses := make([]int, len(f.nodes))
	for i, nd := range f.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _ = stripetest.Deliver(t, nd.base+"/stripe/webhook", ev, fleetWhsec, time.Now())
		}()
	}
	wg.Wait()
	for i, s := range statuses {
		if s == 500 { // the other node held the subscription past the wait: Stripe sends it again
			if s2, body := stripetest.Deliver(t, f.nodes[i].base+"/stripe/webhook", ev, fleetWhsec, time.Now()); s2 != 200 {
				t.Fatalf("%s, again: %d %s", f.nodes[i].name, s2, body)
			}
		} else if s != 200 {
			t.Fatalf("%s: %d", f.nodes[i].name, s)
		}
	}
	entries, _, err := st.ListAudit(ctx, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Action == payments.AuditSubscriptionStripe && e.UserID == "u-fleet-pay" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the event delivered to both nodes was applied %d times, want once", n)
	}
	for _, nd := range f.nodes {
		var sub store.Subscription
		e2etest.AdminJSON(t, "GET", nd.admin+"/platform/subscriptions/u-fleet-pay/"+fleetService, nil, 200, &sub)
		if sub.Status != "ACTIVE" || sub.ProductID != "paid" {
			t.Errorf("%s: %+v", nd.name, sub)
		}
		if r := invoke(nd.base, k.Key); r.status != 200 {
			t.Errorf("%s: call %d %s %v", nd.name, r.status, r.code, r.err)
		}
	}
	// Unpaid, delivered to node b: both nodes refuse the calls.
	stripetest.Deliver(t, f.nodes[1].base+"/stripe/webhook", stripetest.Event("evt_fleet_2", "customer.subscription.updated", created.Add(time.Second),
		map[string]any{"id": "sub_fleet", "object": "subscription", "customer": "cus_fleet", "status": "unpaid",
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_f", "object": "subscription_item",
				"price": map[string]any{"id": "price_paid", "object": "price"}}}}}), fleetWhsec, time.Now())
	waitFor(t, 5*time.Second, func() bool {
		for _, nd := range f.nodes {
			if r := invoke(nd.base, k.Key); r.status != 403 || !strings.Contains(r.code, "subscription_inactive") {
				return false
			}
		}
		return true
	})
}
