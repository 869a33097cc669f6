package stripewebhook_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
)

// knownCustomer records cust as user's Stripe customer the way
// payments.CustomerFor does (both ways), for a second user of a test:
// stripe-mock answers every customer creation with the same id.
func (g *gw) knownCustomer(user, cust string) string {
	g.t.Helper()
	pay := g.app.DataStore().(store.Payments)
	b, _ := json.Marshal(payments.CustomerRecord{UserID: user, CustomerID: cust, CreatedAt: time.Now().UTC()})
	for kind, id := range map[string]string{payments.KindCustomerUser: cust, payments.KindCustomer: user} {
		if _, err := pay.InsertPaymentRecord(context.Background(), kind, id, b, time.Now()); err != nil {
			g.t.Fatal(err)
		}
	}
	return cust
}

// TestEndedStripeSubscriptionLeavesALaterPlan: a Stripe subscription
// that ended never replaces the plan the caller took after it (an
// operator's, the portal's free or prepaid one), whichever way its state
// comes back: the final invoice paid after the cancellation (Stripe bills
// metered usage then) reads the subscription from Stripe, and so does a
// resync. Before the fix both wrote "pro EXPIRED" over the caller's
// "team ACTIVE", locking out a paying caller. The gateway subscription
// the Stripe subscription set itself still ends as before, also after
// the sweep tidied it to its end's status.
func TestEndedStripeSubscriptionLeavesALaterPlan(t *testing.T) {
	g := startGateway(t, "1h")
	ctx := context.Background()
	cust := g.customer("u-late")
	now := time.Now().Truncate(time.Second)
	g.deliver(stripetest.Event("evt_l1", "customer.subscription.created", now.Add(-3*time.Hour),
		subObj("sub_late", cust, "active", "price_pro", false, now.Add(720*time.Hour))), 200)
	g.deliver(stripetest.Event("evt_l2", "customer.subscription.deleted", now.Add(-2*time.Hour),
		subObj("sub_late", cust, "canceled", "price_pro", false, now.Add(-2*time.Hour))), 200)
	if s, _ := g.sub("u-late"); s.ProductID != "pro" || s.Status != "EXPIRED" {
		t.Fatalf("after deleted: %+v, want pro EXPIRED", s)
	}
	// The operator gives the caller a plan Stripe does not bill.
	putTeam := func() {
		t.Helper()
		if _, err := g.app.Ops().PutSubscription(ctx, "admin", "u-late", "svc", "team", "ACTIVE"); err != nil {
			t.Fatal(err)
		}
	}
	wantTeam := func(when string) {
		t.Helper()
		if s, _ := g.sub("u-late"); s.ProductID != "team" || s.Status != "ACTIVE" || !s.EndsAt.IsZero() {
			t.Errorf("%s: %s %s (ends %v), want team ACTIVE: an ended Stripe subscription replaced a later plan", when, s.ProductID, s.Status, s.EndsAt)
		}
	}
	putTeam()

	// Its final invoice, paid an hour later: recorded, the plan kept.
	g.mock.Answer("/v1/subscriptions/sub_late", map[string]any{"id": "sub_late", "customer": cust, "status": "canceled",
		"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil})
	inv := map[string]any{"id": "in_final", "object": "invoice", "customer": cust, "status": "paid",
		"amount_due": 120, "amount_paid": 120, "currency": "usd",
		"parent": map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_late"}}}
	g.deliver(stripetest.Event("evt_l3", "invoice.paid", now.Add(-time.Hour), inv), 200)
	wantTeam("the final invoice of the ended subscription")
	if _, ok := g.record(payments.KindInvoice, "in_final"); !ok {
		t.Error("the final invoice was not recorded")
	}
	// The same state delivered again as an event of its own.
	g.deliver(stripetest.Event("evt_l4", "customer.subscription.updated", now.Add(-30*time.Minute),
		subObj("sub_late", cust, "canceled", "price_pro", false, now.Add(-2*time.Hour))), 200)
	wantTeam("a later event of the ended subscription")

	// A resync reads it from Stripe again: the plan is kept.
	g.mock.Answer("/v1/subscriptions", map[string]any{"data": []any{subObj("sub_late", cust, "canceled", "price_pro", false, now.Add(-2*time.Hour))},
		"has_more": false})
	if status, body := adminPost(t, "/platform/stripe/resync"); status != 200 {
		t.Fatalf("resync: %d %s", status, body)
	}
	wantTeam("resync")
	g.mock.Answer("/v1/subscriptions", nil)

	// What the Stripe subscription set itself still ends: past due
	// beyond its grace, tidied to SUSPENDED by the sweep, then deleted.
	cust2 := g.knownCustomer("u-own", "cus_own")
	g.deliver(stripetest.Event("evt_o1", "customer.subscription.created", now.Add(-5*time.Hour),
		subObj("sub_own", cust2, "active", "price_pro", false, now.Add(720*time.Hour))), 200)
	g.deliver(stripetest.Event("evt_o2", "customer.subscription.updated", now.Add(-4*time.Hour),
		subObj("sub_own", cust2, "past_due", "price_pro", false, now.Add(720*time.Hour))), 200)
	if _, err := g.app.Ops().SweepSubscriptions(ctx, now); err != nil {
		t.Fatal(err)
	}
	if s, _ := g.sub("u-own"); s.ProductID != "pro" || s.Status != "SUSPENDED" {
		t.Fatalf("past due beyond the grace, swept: %+v, want pro SUSPENDED", s)
	}
	g.deliver(stripetest.Event("evt_o3", "customer.subscription.deleted", now.Add(-time.Minute),
		subObj("sub_own", cust2, "canceled", "price_pro", false, now.Add(-time.Minute))), 200)
	if s, _ := g.sub("u-own"); s.ProductID != "pro" || s.Status != "EXPIRED" {
		t.Errorf("its own subscription deleted: %+v, want pro EXPIRED", s)
	}

	// A link written before the gateway kept what it applied knows only
	// the subscription: it ends the plan of its product, not another.
	for _, c := range []struct{ user, cust, product, want string }{
		{"u-old1", "cus_old1", "pro", "EXPIRED"}, {"u-old2", "cus_old2", "team", "ACTIVE"}} {
		g.knownCustomer(c.user, c.cust)
		sub := "sub_" + c.user
		if _, err := g.app.DataStore().PutSubscription(ctx, store.Subscription{UserID: c.user, ServiceID: "svc", ProductID: c.product,
			Status: "ACTIVE", UpdatedAt: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
		link, _ := json.Marshal(map[string]any{"subscriptionId": sub, "updatedAt": now})
		if err := g.app.DataStore().(store.Payments).PutPaymentRecord(ctx, payments.KindSubscriptionOf, "svc/"+c.user, link, time.Now()); err != nil {
			t.Fatal(err)
		}
		g.deliver(stripetest.Event("evt_"+c.user, "customer.subscription.deleted", now,
			subObj(sub, c.cust, "canceled", "price_pro", false, now)), 200)
		if s, _ := g.sub(c.user); s.ProductID != c.product || s.Status != c.want {
			t.Errorf("%s (an old link, plan %s): %s %s, want %s %s", c.user, c.product, s.ProductID, s.Status, c.product, c.want)
		}
	}
}
