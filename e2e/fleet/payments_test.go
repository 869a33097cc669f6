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

// paymentsFleet is two gateway processes on one PostgreSQL database of
// their own, taking payments from a stripe-mock, and a store handle of
// the test's on the same database (closed when the test ends) to seed
// and read payment records.
func paymentsFleet(t *testing.T) (*fleet, *stripetest.Mock, *pgstore.Store) {
	t.Helper()
	mock := stripetest.Start(t)
	dsn := fleetDB(t)
	f := newFleet(t, dsn, 2, func(f *fleet) {
		f.payments = fmt.Sprintf("\t\tpayments stripe {\n\t\t\tsecret_key sk_test_fleet\n\t\t\twebhook_secret %s\n\t\t\tapi_base %s\n\t\t\tprice %s paid price_paid\n\t\t}",
			fleetWhsec, mock.URL, fleetService)
	})
	st, err := pgstore.Open(context.Background(), pgstore.Options{DSN: dsn, NodeID: "test-seed", MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return f, mock, st
}

// seedCustomer stores user's Stripe customer cus, as the portal's
// Checkout leaves it (both directions of the mapping).
func seedCustomer(t *testing.T, st *pgstore.Store, user, cus string) {
	t.Helper()
	rec, _ := json.Marshal(payments.CustomerRecord{UserID: user, CustomerID: cus, CreatedAt: time.Now().UTC()})
	for kind, id := range map[string]string{payments.KindCustomer: user, payments.KindCustomerUser: cus} {
		if _, err := st.InsertPaymentRecord(context.Background(), kind, id, rec, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFleetWebhookOnce: two gateway processes on one PostgreSQL store
// take payments; Stripe's event delivered to both at once (a retry that
// two nodes behind a balancer both take) is applied once: one audit
// entry, the subscription ACTIVE on both nodes, calls served by both;
// a later failure past the grace is seen by both.
func TestFleetWebhookOnce(t *testing.T) {
	f, _, st := paymentsFleet(t)
	ctx := context.Background()
	// The user's Stripe customer, as the portal's Checkout leaves it.
	seedCustomer(t, st, "u-fleet-pay", "cus_fleet")
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

// TestFleetInvoiceAndRefundAtOnce: an invoice's invoice.paid delivered to
// node a and its charge's charge.refunded to node b at the same moment
// (Stripe sends events in no set order, and a balancer spreads them)
// keep both on one PostgreSQL store: the invoice paid, its refund on it,
// whichever node writes first. The old gateway dropped the refund of
// every invoice whose refund came first (docs/payments.md, "Refunds").
func TestFleetInvoiceAndRefundAtOnce(t *testing.T) {
	f, mock, st := paymentsFleet(t)
	ctx := context.Background()
	seedCustomer(t, st, "u-fleet-inv", "cus_fleet_inv")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	const n = 16
	for i := range n {
		id := fmt.Sprintf("in_fleet%d", i)
		// The invoice names its product by its price: the subscription's
		// own events have not come.
		inv := map[string]any{"id": id, "object": "invoice", "customer": "cus_fleet_inv", "status": "paid",
			"amount_due": 2900, "amount_paid": 2900, "amount_remaining": 0, "currency": "usd",
			"status_transitions": map[string]any{"paid_at": t0.Unix()},
			"parent":             map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_fleet_inv"}},
			"lines": map[string]any{"object": "list", "has_more": false, "data": []any{map[string]any{"id": "il_" + id, "object": "line_item",
				"amount": 2900, "currency": "usd", "pricing": map[string]any{"type": "price_details", "price_details": map[string]any{"price": "price_paid", "product": "prod_paid"}}}}}}
		mock.Answer("/v1/invoices/"+id, inv)
		// A charge of an API version before 2025-03-31 names its invoice.
		ch := map[string]any{"id": "ch_" + id, "object": "charge", "amount": 2900, "currency": "usd", "payment_intent": "pi_" + id,
			"invoice": id, "refunds": map[string]any{"object": "list", "has_more": false, "data": []any{map[string]any{
				"id": "re_" + id, "object": "refund", "amount": 700, "status": "succeeded", "charge": "ch_" + id, "created": t0.Unix()}}}}
		evs := [][]byte{
			stripetest.Event("evt_fi"+id, "invoice.paid", t0.Add(time.Second), inv),
			stripetest.Event("evt_fr"+id, "charge.refunded", t0.Add(2*time.Second), ch),
		}
		var wg sync.WaitGroup
		for k, nd := range f.nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if status, body := stripetest.Deliver(t, nd.base+"/stripe/webhook", evs[k], fleetWhsec, time.Now()); status != 200 {
					t.Errorf("%s, %s: %d %s", nd.name, id, status, body)
				}
			}()
		}
		wg.Wait()
		b, err := st.GetPaymentRecord(ctx, payments.KindInvoice, id)
		var r payments.InvoiceRecord
		if err != nil || json.Unmarshal(b, &r) != nil || r.Status != "paid" || r.AmountPaid != 2900 || r.Refunded != 700 {
			t.Errorf("invoice %s after its invoice.paid (node a) and refund (node b) at once: %s %v, want paid 2900, refunded 700", id, b, err)
		}
	}
}

// TestFleetInvoiceMoneyBackAtOnce: two changes of one invoice record
// already kept, a refund of its charge (charge.refunded) delivered to one
// node and a lost dispute of it (charge.dispute.closed) to the other at
// the same moment, both stay on the record, whichever node writes first.
// The old gateway read the record on each node and put it back with its
// own change, so the second write dropped the first's: a refund or a
// dispute missing from the Revenue page (docs/payments.md, "Refunds").
func TestFleetInvoiceMoneyBackAtOnce(t *testing.T) {
	f, _, st := paymentsFleet(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	const n = 60
	lost := 0
	for i := range n {
		id := fmt.Sprintf("in_mb%d", i)
		// The invoice's record, as its invoice.paid left it.
		rec, _ := json.Marshal(payments.InvoiceRecord{ID: id, UserID: "u-fleet-mb", ServiceID: fleetService, ProductID: "paid",
			CustomerID: "cus_fleet_mb", SubscriptionID: "sub_fleet_mb", Status: "paid", AmountDue: 2900, AmountPaid: 2900,
			Currency: "USD", PaidAt: t0, UpdatedAt: t0})
		if _, err := st.InsertPaymentRecord(ctx, payments.KindInvoice, id, rec, t0); err != nil {
			t.Fatal(err)
		}
		// A charge and a dispute of an API version before 2025-03-31
		// name their invoice.
		ch := map[string]any{"id": "ch_" + id, "object": "charge", "amount": 2900, "currency": "usd", "payment_intent": "pi_" + id,
			"invoice": id, "refunds": map[string]any{"object": "list", "has_more": false, "data": []any{map[string]any{
				"id": "re_" + id, "object": "refund", "amount": 700, "status": "succeeded", "charge": "ch_" + id, "created": t0.Unix()}}}}
		dp := map[string]any{"id": "dp_" + id, "object": "dispute", "amount": 900, "currency": "usd", "status": "lost",
			"payment_intent": "pi_" + id, "charge": map[string]any{"id": "ch_" + id, "object": "charge", "invoice": id}}
		evs := [][]byte{
			stripetest.Event("evt_mbr"+id, "charge.refunded", t0.Add(time.Second), ch),
			stripetest.Event("evt_mbd"+id, "charge.dispute.closed", t0.Add(2*time.Second), dp),
		}
		if i%2 == 1 {
			evs[0], evs[1] = evs[1], evs[0]
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for k, nd := range f.nodes {
			wg.Go(func() {
				<-start
				if status, body := stripetest.Deliver(t, nd.base+"/stripe/webhook", evs[k], fleetWhsec, time.Now()); status != 200 {
					t.Errorf("%s, %s: %d %s", nd.name, id, status, body)
				}
			})
		}
		close(start)
		wg.Wait()
		b, err := st.GetPaymentRecord(ctx, payments.KindInvoice, id)
		var r payments.InvoiceRecord
		if err != nil || json.Unmarshal(b, &r) != nil || r.Status != "paid" || r.AmountPaid != 2900 || r.Refunded != 700 || r.Disputed != 900 {
			lost++
			t.Errorf("invoice %s after its refund and its lost dispute on two nodes at once: %s %v, want paid 2900, refunded 700, disputed 900", id, b, err)
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d invoices lost a change", lost, n)
	}
}

// TestFleetSubscriptionUpdateAndDeletionAtOnce: a Stripe subscription's
// older customer.subscription.updated (active) delivered to node a and
// its newer customer.subscription.deleted to node b in the same instant,
// for many subscriptions at once, leaves every gateway subscription
// EXPIRED and every record on the deletion: the newest event wins
// whichever node writes last. A cancelled subscription left ACTIVE
// gives calls away, and no later event of it comes to correct it
// (docs/payments.md, "Out of order"). The interleavings a node stalled
// past its lease makes are certain in internal/payments
// (TestSubscriptionEventsOnTwoNodesEndNewest).
func TestFleetSubscriptionUpdateAndDeletionAtOnce(t *testing.T) {
	f, _, st := paymentsFleet(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	const n = 30
	subEvent := func(i int, typ, status string, created time.Time) []byte {
		return stripetest.Event(fmt.Sprintf("evt_sr_%s_%d", typ, i), typ, created, map[string]any{
			"id": fmt.Sprintf("sub_sr%d", i), "object": "subscription", "customer": fmt.Sprintf("cus_sr%d", i), "status": status,
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": fmt.Sprintf("si_sr%d", i), "object": "subscription_item",
				"price": map[string]any{"id": "price_paid", "object": "price"}, "current_period_end": created.Add(720 * time.Hour).Unix()}}}})
	}
	// deliver sends ev to node, again while it answers 500 (the other
	// node held the subscription past the wait: Stripe sends it again).
	deliver := func(nd int, ev []byte) {
		for try := 0; ; try++ {
			status, body := stripetest.Deliver(t, f.nodes[nd].base+"/stripe/webhook", ev, fleetWhsec, time.Now())
			if status == 200 {
				return
			}
			if status != 500 || try == 5 {
				t.Errorf("%s: %d %s", f.nodes[nd].name, status, body)
				return
			}
		}
	}
	for i := range n {
		seedCustomer(t, st, fmt.Sprintf("u-sr%d", i), fmt.Sprintf("cus_sr%d", i))
		deliver(i%2, subEvent(i, "customer.subscription.created", "active", t0))
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			deliver(0, subEvent(i, "customer.subscription.updated", "active", t0.Add(time.Second)))
		})
		wg.Go(func() {
			<-start
			deliver(1, subEvent(i, "customer.subscription.deleted", "canceled", t0.Add(2*time.Second)))
		})
	}
	close(start)
	wg.Wait()
	wrong := 0
	for i := range n {
		user := fmt.Sprintf("u-sr%d", i)
		sub, err := st.GetSubscription(ctx, user, fleetService)
		b, rerr := st.GetPaymentRecord(ctx, payments.KindSubscription, fmt.Sprintf("sub_sr%d", i))
		var rec payments.SubscriptionRecord
		if err != nil || sub.Status != "EXPIRED" || rerr != nil || json.Unmarshal(b, &rec) != nil ||
			rec.StripeStatus != "canceled" || !rec.EventCreated.Equal(t0.Add(2*time.Second)) {
			wrong++
			t.Errorf("%s after the update (node a) and the deletion (node b) at once: %+v %v; record %s %v; want EXPIRED, the deletion's",
				user, sub, err, b, rerr)
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d subscriptions did not end on the newest event", wrong, n)
	}
}
