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

// scheduleFixture is a bolt store with a service of three plans, basic <
// pro < gold, and user u on pro with a change to basic scheduled for an
// hour from now.
func scheduleFixture(t *testing.T) (*Ops, store.Store, time.Time) {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	q1, q2, q3 := billing.Whole(10), billing.Whole(100), billing.Whole(1000)
	svc := &catalog.Service{ID: "weather", Backend: "http://127.0.0.1:9", Secrets: []string{"0123456789abcdef0123456789abcdef"},
		Endpoints: []*catalog.Endpoint{{ID: "hello"}},
		Products: []*billing.Product{
			{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &q1, Overage: "block"},
			{ID: "pro", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &q2, Overage: "block"},
			{ID: "gold", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &q3, Overage: "block"},
		}}
	cat, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := New(engine.New(engine.Runtime{Catalog: cat, Data: st}), nil)
	ctx := context.Background()
	if _, err := o.PutSubscription(ctx, "portal:u", "u", "weather", "pro", "ACTIVE"); err != nil {
		t.Fatal(err)
	}
	from := time.Now().UTC().Add(time.Hour).Truncate(time.Second)
	if err := o.ScheduleChange(ctx, "portal:u", "u", "weather", "pro", "basic", from); err != nil {
		t.Fatal(err)
	}
	return o, st, from
}

// TestScheduledChangeYieldsToStripePurchase: a caller on a free plan
// schedules a downgrade for the period's end, then buys a plan through
// Stripe Checkout (internal/payments sets the subscription and audits
// subscription.stripe). The downgrade was applied at the old period's
// end all the same: the paying caller was moved to the cheaper plan's
// limits while Stripe went on charging for the dear one.
func TestScheduledChangeYieldsToStripePurchase(t *testing.T) {
	o, st, from := scheduleFixture(t)
	ctx := context.Background()
	// What payments.setGatewaySubscription does.
	if _, err := st.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "weather", ProductID: "gold", Status: "ACTIVE", UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	o.RecordAudit(ctx, store.AuditEntry{Actor: "stripe", Action: AuditSubscriptionStripe, UserID: "u", ServiceID: "weather", Detail: "Stripe subscription sub_1 is active"})

	if ch, ok, err := o.PendingChange(ctx, "u", "weather"); err != nil || ok {
		t.Fatalf("PendingChange after the Stripe purchase = %+v, %v, %v; want none", ch, ok, err)
	}
	res, err := o.SweepSubscriptions(ctx, from.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := st.GetSubscription(ctx, "u", "weather")
	if err != nil {
		t.Fatal(err)
	}
	if sub.ProductID != "gold" || res.Applied != 0 {
		t.Fatalf("after the sweep the Stripe-paid subscription is on %s (applied %d), want gold", sub.ProductID, res.Applied)
	}
}

// TestScheduledChangeVoidOnceProductMoved: the subscription moved to
// another product by a change whose audit entry the scan does not see (a
// failed audit write, or one past the newest auditScan entries): the
// change records the product it was scheduled from and is not applied
// over another one. An unmoved subscription still gets its change, and
// an entry written before the "(was …)" part still applies.
func TestScheduledChangeVoidOnceProductMoved(t *testing.T) {
	o, st, from := scheduleFixture(t)
	ctx := context.Background()
	ch, ok, err := o.PendingChange(ctx, "u", "weather")
	if err != nil || !ok || ch.ProductID != "basic" || ch.Was != "pro" || !ch.From.Equal(from) {
		t.Fatalf("PendingChange = %+v, %v, %v; want basic from pro at %s", ch, ok, err, from)
	}
	// Moved with no audit entry at all.
	if _, err := st.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "weather", ProductID: "gold", Status: "ACTIVE", UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if _, err := o.ApplyDueChange(ctx, "u", "weather", from.Add(time.Minute)); !IsNoScheduledChange(err) {
		t.Fatalf("ApplyDueChange over another product: %v, want nothing due", err)
	}
	if sub, _ := st.GetSubscription(ctx, "u", "weather"); sub.ProductID != "gold" {
		t.Fatalf("subscription on %s, want gold", sub.ProductID)
	}

	// Back on pro: the change applies.
	if _, err := st.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "weather", ProductID: "pro", Status: "ACTIVE", UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if ch, err := o.ApplyDueChange(ctx, "u", "weather", from.Add(time.Minute)); err != nil || ch.ProductID != "basic" {
		t.Fatalf("ApplyDueChange = %+v, %v; want basic", ch, err)
	}
	if sub, _ := st.GetSubscription(ctx, "u", "weather"); sub.ProductID != "basic" {
		t.Fatalf("subscription on %s, want basic", sub.ProductID)
	}

	// An entry in the older format, without the product it was
	// scheduled from.
	o.RecordAudit(ctx, store.AuditEntry{Actor: "portal:u", Action: AuditChangeScheduled, UserID: "u", ServiceID: "weather",
		Detail: "product pro from " + from.Format(time.RFC3339)})
	if ch, err := o.ApplyDueChange(ctx, "u", "weather", from.Add(time.Minute)); err != nil || ch.ProductID != "pro" || ch.Was != "" {
		t.Fatalf("ApplyDueChange of an old entry = %+v, %v; want pro", ch, err)
	}
}

// TestStripePurchaseAnswersAccessRequest: a caller's pending request for
// a plan is settled by a subscription set from Stripe, as by an
// operator's put, so the console no longer offers to grant it over the
// plan the caller bought.
func TestStripePurchaseAnswersAccessRequest(t *testing.T) {
	o, _, _ := scheduleFixture(t)
	ctx := context.Background()
	if err := o.RequestAccess(ctx, "portal:u", "u", "weather", "gold"); err != nil {
		t.Fatal(err)
	}
	if reqs, err := o.PendingAccessRequests(ctx, "u"); err != nil || len(reqs) != 1 {
		t.Fatalf("requests = %+v, %v; want one", reqs, err)
	}
	o.RecordAudit(ctx, store.AuditEntry{Actor: "stripe", Action: AuditSubscriptionStripe, UserID: "u", ServiceID: "weather", Detail: "Stripe subscription sub_1 is active"})
	if reqs, err := o.PendingAccessRequests(ctx, "u"); err != nil || len(reqs) != 0 {
		t.Fatalf("requests after the Stripe purchase = %+v, %v; want none", reqs, err)
	}
}
