package payments_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// otherNodeMidway is a real store on which another node's whole handling
// of an event runs inside this node's first read of one record: the
// other node applies its event between this node's read of the record
// and its writes. On a fleet that is two nodes applying two events of
// one Stripe subscription at once, the first past its lease (a stall
// longer than the lease's 30 s: a slow Stripe or PostgreSQL, a pause of
// the process) so the other took it; made certain here instead of left
// to timing.
type otherNodeMidway struct {
	payStore
	kind, id string
	other    func()

	once sync.Once
}

func (s *otherNodeMidway) GetPaymentRecord(ctx context.Context, kind, id string) ([]byte, error) {
	b, err := s.payStore.GetPaymentRecord(ctx, kind, id)
	if kind == s.kind && id == s.id {
		s.once.Do(s.other)
	}
	return b, err
}

// payStore is a store that keeps payment records (boltstore, pgstore).
type payStore interface {
	store.Store
	store.Payments
}

// subRaceNode serves the webhook of one node on st, its clock offset by
// skew (the other node of a race sees this one's lease expired).
func subRaceNode(t *testing.T, st store.Store, node string, skew time.Duration) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(raceService(t, st, "http://127.0.0.1:9", node, skew).ServeWebhook))
	t.Cleanup(srv.Close)
	return srv
}

// raceService is node's payments service on st, selling geo/pro for
// price_pro, with Stripe's API at api and its clock skew ahead.
func raceService(t *testing.T, st store.Store, api, node string, skew time.Duration) *payments.Service {
	t.Helper()
	cat := meterCatalog(t)
	cfg := payments.Config{Provider: "stripe", SecretKey: "sk_test_race", WebhookSecret: "whsec_race", APIBase: api,
		Prices: []payments.Price{{Service: "geo", Product: "pro", Price: "price_pro"}}}
	if err := cfg.Validate(cat); err != nil {
		t.Fatal(err)
	}
	svc, err := payments.New(cfg, payments.Deps{Store: func() store.Store { return st }, Catalog: cat, NodeID: node,
		Now: func() time.Time { return time.Now().Add(skew) }})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// subEvent is a customer.subscription.* event of sub_race (price_pro),
// created at created.
func subEvent(id, typ, status string, created time.Time) []byte {
	return stripetest.Event(id, typ, created, map[string]any{
		"id": "sub_race", "object": "subscription", "customer": "cus_race", "status": status,
		"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_race", "object": "subscription_item",
			"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": created.Add(720 * time.Hour).Unix()}}}})
}

// TestSubscriptionEventsOnTwoNodesEndNewest: node a applies one event of
// a Stripe subscription while node b applies another in the middle of
// it, at each point of a's handling where b's writes can land: after a
// read the subscription's record, after a read which Stripe subscription
// holds the gateway subscription (stripe_subscription_of). One event is
// an older customer.subscription.updated (active), the other the newer
// customer.subscription.deleted, either way round. Whatever the
// interleaving, the gateway subscription ends EXPIRED and the record
// holds the deletion. The old gateway put a's older state over b's
// (plain puts, last writer wins): the cancelled subscription stayed
// ACTIVE, and with no later event of it, for good.
func TestSubscriptionEventsOnTwoNodesEndNewest(t *testing.T) {
	for _, db := range []string{"bolt", "pg"} {
		for _, at := range []string{payments.KindSubscription, payments.KindSubscriptionOf} {
			for _, aDeletes := range []bool{false, true} {
				name := db + "/" + at + "/a_updates"
				if aDeletes {
					name = db + "/" + at + "/a_deletes"
				}
				t.Run(name, func(t *testing.T) {
					// Each node's own store handle (on PostgreSQL its own
					// connections), on one database.
					var stA, stB payStore
					if db == "bolt" {
						bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
						if err != nil {
							t.Fatal(err)
						}
						t.Cleanup(func() { _ = bolt.Close() })
						stA, stB = bolt, bolt
					} else {
						dsn := pgtest.DB(t)
						open := func(node string) payStore {
							st, err := pgstore.Open(context.Background(), pgstore.Options{DSN: dsn, NodeID: node})
							if err != nil {
								t.Fatal(err)
							}
							t.Cleanup(func() { _ = st.Close() })
							return st
						}
						stA, stB = open("node-a"), open("node-b")
					}
					subRace(t, stA, stB, at, aDeletes)
				})
			}
		}
	}
}

func subRace(t *testing.T, stA, bolt payStore, at string, aDeletes bool) {
	ctx := context.Background()
	b, _ := json.Marshal(payments.CustomerRecord{UserID: "u1", CustomerID: "cus_race", CreatedAt: time.Now().UTC()})
	for kind, id := range map[string]string{payments.KindCustomerUser: "cus_race", payments.KindCustomer: "u1"} {
		if _, err := bolt.InsertPaymentRecord(ctx, kind, id, b, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	deliver := func(url string, ev []byte) { deliverRace(t, url, ev) }
	updated := subEvent("evt_updated", "customer.subscription.updated", "active", t0.Add(time.Second))
	deleted := subEvent("evt_deleted", "customer.subscription.deleted", "canceled", t0.Add(2*time.Second))
	evA, evB := updated, deleted
	if aDeletes {
		evA, evB = deleted, updated
	}
	// Node b's clock is a minute on: node a stalled past its lease.
	nodeB := subRaceNode(t, bolt, "node-b", time.Minute)
	id := "sub_race"
	if at == payments.KindSubscriptionOf {
		id = "geo/u1"
	}
	st := &otherNodeMidway{payStore: stA, kind: at, id: id, other: func() {
		payments.OnAnotherNode(func() { deliver(nodeB.URL, evB) })
	}}
	nodeA := subRaceNode(t, st, "node-a", 0)
	deliver(subRaceNode(t, bolt, "node-c", 0).URL, subEvent("evt_created", "customer.subscription.created", "active", t0))
	deliver(nodeA.URL, evA)

	sub, err := bolt.GetSubscription(ctx, "u1", "geo")
	if err != nil || sub.Status != "EXPIRED" {
		t.Errorf("the gateway subscription after an older update and the deletion at once: %+v %v; want EXPIRED", sub, err)
	}
	rb, err := bolt.GetPaymentRecord(ctx, payments.KindSubscription, "sub_race")
	var rec payments.SubscriptionRecord
	if err != nil || json.Unmarshal(rb, &rec) != nil || rec.StripeStatus != "canceled" || !rec.EventCreated.Equal(t0.Add(2*time.Second)) {
		t.Errorf("the record: %s %v; want canceled, of the deletion's time", rb, err)
	}
}

// TestInvoiceReadBackBeforeADeletionEndsExpired: invoice.paid makes the
// gateway read the subscription from Stripe and apply it as read. Node a
// reads it active (the final invoice, paid just before the
// cancellation); the cancellation and its customer.subscription.deleted,
// applied by node b, come before node a writes. The gateway subscription
// ends EXPIRED: node a's read is older than the record it would write
// over, so it reads Stripe again. The old gateway read Stripe before
// applying anything and wrote the state read over the newer one (a read
// from Stripe passes the check of the events' order): the cancelled
// subscription stayed ACTIVE for good. One node was enough: its own
// deletion applied while the read-back waited for the subscription.
func TestInvoiceReadBackBeforeADeletionEndsExpired(t *testing.T) {
	bolt := raceCustomer(t)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	deliver := func(url string, ev []byte) { deliverRace(t, url, ev) }
	// Stripe: the subscription is active until node b's deletion, which
	// comes during node a's first read of it.
	var nodeB *httptest.Server
	var mu sync.Mutex
	reads, cancelled := 0, false
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/subscriptions/sub_race" {
			http.Error(w, `{"error":{"type":"invalid_request_error","message":"not here"}}`, 404)
			return
		}
		mu.Lock()
		reads++
		first, status := reads == 1, "active"
		if cancelled {
			status = "canceled"
		}
		mu.Unlock()
		if first {
			mu.Lock()
			cancelled = true
			mu.Unlock()
			payments.OnAnotherNode(func() {
				deliver(nodeB.URL, subEvent("evt_deleted", "customer.subscription.deleted", "canceled", t0.Add(2*time.Second)))
			})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "sub_race", "object": "subscription", "customer": "cus_race", "status": status,
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_race", "object": "subscription_item",
				"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": t0.Add(720 * time.Hour).Unix()}}}})
	}))
	defer api.Close()
	node := func(name string, skew time.Duration) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(raceService(t, bolt, api.URL, name, skew).ServeWebhook))
		t.Cleanup(srv.Close)
		return srv
	}
	nodeA := node("node-a", 0)
	nodeB = node("node-b", time.Minute) // node a stalled past its lease
	deliver(nodeA.URL, subEvent("evt_created", "customer.subscription.created", "active", t0))
	inv := map[string]any{"id": "in_final", "object": "invoice", "customer": "cus_race", "status": "paid",
		"amount_due": 2900, "amount_paid": 2900, "amount_remaining": 0, "currency": "usd",
		"status_transitions": map[string]any{"paid_at": t0.Add(time.Second).Unix()},
		"parent":             map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_race"}}}
	deliver(nodeA.URL, stripetest.Event("evt_paid", "invoice.paid", t0.Add(time.Second), inv))

	wantCancelled(t, bolt, "after its invoice's read-back (node a) and its deletion (node b) at once")
}

// TestResyncBeforeADeletionEndsExpired: `caddy platform stripe resync`
// lists a customer's subscriptions from Stripe, then applies each. A
// customer.subscription.deleted applied between the two (a webhook on
// any node) is newer than what the list said; the resync wrote the
// listed "active" over it, since a state read from Stripe skips the
// event-order check, and the cancelled subscription stayed ACTIVE.
func TestResyncBeforeADeletionEndsExpired(t *testing.T) {
	bolt := raceCustomer(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	var hook *httptest.Server
	deliver := func(ev []byte) {
		if status, body := stripetest.Deliver(t, hook.URL, ev, "whsec_race", time.Now()); status != 200 {
			t.Errorf("webhook: %d %s", status, body)
		}
	}
	var mu sync.Mutex
	cancelled := false
	sub := func(status string) map[string]any {
		return map[string]any{"id": "sub_race", "object": "subscription", "customer": "cus_race", "status": status,
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_race", "object": "subscription_item",
				"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": t0.Add(720 * time.Hour).Unix()}}}}
	}
	// Stripe: the list says active; the deletion is applied while the
	// list is on its way; read again, the subscription is cancelled.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		mu.Lock()
		status := "active"
		if cancelled {
			status = "canceled"
		}
		mu.Unlock()
		switch r.URL.Path {
		case "/v1/subscriptions":
			if status == "active" {
				mu.Lock()
				cancelled = true
				mu.Unlock()
				deliver(subEvent("evt_deleted", "customer.subscription.deleted", "canceled", time.Now().Truncate(time.Second)))
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "url": "/v1/subscriptions", "has_more": false,
				"data": []any{sub(status)}})
		case "/v1/subscriptions/sub_race":
			_ = json.NewEncoder(w).Encode(sub(status))
		case "/v1/invoices":
			_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "url": "/v1/invoices", "has_more": false, "data": []any{}})
		default:
			http.Error(w, `{"error":{"type":"invalid_request_error","message":"not here"}}`, 404)
		}
	}))
	defer api.Close()
	svc := raceService(t, bolt, api.URL, "node-a", 0)
	hook = httptest.NewServer(http.HandlerFunc(svc.ServeWebhook))
	defer hook.Close()
	deliver(subEvent("evt_created", "customer.subscription.created", "active", t0))

	if _, err := svc.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	wantCancelled(t, bolt, "after a resync whose list came before its deletion")
}

// raceCustomer is a bbolt store with the customer cus_race of user u1.
func raceCustomer(t *testing.T) *boltstore.Store {
	t.Helper()
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	b, _ := json.Marshal(payments.CustomerRecord{UserID: "u1", CustomerID: "cus_race", CreatedAt: time.Now().UTC()})
	for kind, id := range map[string]string{payments.KindCustomerUser: "cus_race", payments.KindCustomer: "u1"} {
		if _, err := bolt.InsertPaymentRecord(context.Background(), kind, id, b, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	return bolt
}

// wantCancelled checks that sub_race ended: the gateway subscription
// EXPIRED and its record canceled.
func wantCancelled(t *testing.T, st *boltstore.Store, when string) {
	t.Helper()
	ctx := context.Background()
	got, err := st.GetSubscription(ctx, "u1", "geo")
	if err != nil || got.Status != "EXPIRED" {
		t.Errorf("the gateway subscription %s: %+v %v; want EXPIRED", when, got, err)
	}
	rb, err := st.GetPaymentRecord(ctx, payments.KindSubscription, "sub_race")
	var rec payments.SubscriptionRecord
	if err != nil || json.Unmarshal(rb, &rec) != nil || rec.StripeStatus != "canceled" {
		t.Errorf("the record %s: %s %v; want canceled", when, rb, err)
	}
}

// TestRaceKeepsTheTrialsEnd: node a applies an older event of a Stripe
// subscription (the trial ended early: active) while node b applies the
// newer one (the trial given again, to a later trial_end) in the middle
// of it. Node a wrote ACTIVE over b's TRIAL, its swap of the record
// fails, and it puts the newer record's state back (reapplyRecord). That
// state must be b's: TRIAL ending past_due_grace after the trial's end.
// The record kept no trial_end, so the state put back was a TRIAL with
// no end at all: the caller kept the plan without paying until some
// later event of the subscription came.
func TestRaceKeepsTheTrialsEnd(t *testing.T) {
	bolt := raceCustomer(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	deliver := func(url string, ev []byte) { deliverRace(t, url, ev) }
	event := func(id, status string, created, trialEnd time.Time) []byte {
		sub := map[string]any{"id": "sub_race", "object": "subscription", "customer": "cus_race", "status": status,
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_race", "object": "subscription_item",
				"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": created.Add(720 * time.Hour).Unix()}}}}
		if !trialEnd.IsZero() {
			sub["trial_end"] = trialEnd.Unix()
		}
		return stripetest.Event(id, "customer.subscription.updated", created, sub)
	}
	trialEnd := t0.Add(14 * 24 * time.Hour)
	nodeB := subRaceNode(t, bolt, "node-b", time.Minute) // node a stalled past its lease
	st := &otherNodeMidway{payStore: bolt, kind: payments.KindSubscription, id: "sub_race", other: func() {
		payments.OnAnotherNode(func() { deliver(nodeB.URL, event("evt_trial_again", "trialing", t0.Add(2*time.Second), trialEnd)) })
	}}
	nodeA := subRaceNode(t, st, "node-a", 0)
	deliver(subRaceNode(t, bolt, "node-c", 0).URL, event("evt_first_trial", "trialing", t0, t0.Add(7*24*time.Hour)))
	deliver(nodeA.URL, event("evt_paid_early", "active", t0.Add(time.Second), time.Time{}))

	sub, err := bolt.GetSubscription(ctx, "u1", "geo")
	want := trialEnd.Add(payments.DefaultPastDueGrace)
	if err != nil || sub.Status != "TRIAL" || !sub.EndsAt.Equal(want) {
		t.Errorf("the gateway subscription after an older activation and a newer trial at once: %s %s ends %v (%v); want TRIAL ending %v",
			sub.ProductID, sub.Status, sub.EndsAt, err, want)
	}
}

// TestResyncThenALateDeletionEndsExpired: `caddy platform stripe resync`
// lists a customer's subscriptions, and the subscription is cancelled
// at Stripe after the list read it (active) but before the resync
// applied it; the customer.subscription.deleted comes to the webhook
// after the resync is done, as Stripe's deliveries do, seconds late.
// The resync stamped the listed state with the time it applied it, not
// the time of the list, so the record held a state "newer" than the
// deletion: the deletion was taken for an older event and changed
// nothing, and the cancelled subscription stayed ACTIVE for good.
func TestResyncThenALateDeletionEndsExpired(t *testing.T) {
	bolt := raceCustomer(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	var mu sync.Mutex
	var deletedAt time.Time // when Stripe cancelled it: after the list read it
	sub := func(status string) map[string]any {
		return map[string]any{"id": "sub_race", "object": "subscription", "customer": "cus_race", "status": status,
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_race", "object": "subscription_item",
				"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": t0.Add(720 * time.Hour).Unix()}}}}
	}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/subscriptions":
			// The list read the subscription active; it is cancelled
			// at once, and the list's answer takes a second to come.
			mu.Lock()
			deletedAt = time.Now().Truncate(time.Second)
			mu.Unlock()
			time.Sleep(time.Until(deletedAt.Add(1100 * time.Millisecond)))
			_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "url": "/v1/subscriptions", "has_more": false,
				"data": []any{sub("active")}})
		case "/v1/subscriptions/sub_race":
			_ = json.NewEncoder(w).Encode(sub("canceled"))
		case "/v1/invoices":
			_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "url": "/v1/invoices", "has_more": false, "data": []any{}})
		default:
			http.Error(w, `{"error":{"type":"invalid_request_error","message":"not here"}}`, 404)
		}
	}))
	defer api.Close()
	svc := raceService(t, bolt, api.URL, "node-a", 0)
	hook := httptest.NewServer(http.HandlerFunc(svc.ServeWebhook))
	defer hook.Close()
	deliver := func(ev []byte) {
		if status, body := stripetest.Deliver(t, hook.URL, ev, "whsec_race", time.Now()); status != 200 {
			t.Errorf("webhook: %d %s", status, body)
		}
	}
	// Created a while ago (its record is older than the resync's list
	// by more than the clocks' skew).
	if status, body := stripetest.Deliver(t, subRaceNode(t, bolt, "node-c", -time.Minute).URL,
		subEvent("evt_created", "customer.subscription.created", "active", t0), "whsec_race", time.Now()); status != 200 {
		t.Fatalf("webhook: %d %s", status, body)
	}

	if _, err := svc.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	at := deletedAt
	mu.Unlock()
	deliver(subEvent("evt_deleted", "customer.subscription.deleted", "canceled", at))

	got, err := bolt.GetSubscription(ctx, "u1", "geo")
	if err != nil || got.Status != "EXPIRED" {
		t.Errorf("the gateway subscription after a resync and then the deletion Stripe made after its list: %+v %v; want EXPIRED", got, err)
	}
}

// TestSecondLiveReportedOncePerTakeover: a user's second live Stripe
// subscription takes the gateway subscription over from the first, and
// the operator is warned once (a log line and an audit entry). Another
// node applies an event of the first subscription between this node's
// read of which Stripe subscription holds the gateway subscription and
// its swap of it, so the swap fails and is made again. The warning was
// given before the swap, on every try: the same takeover was reported
// twice, and reported on a try whose takeover did not happen.
func TestSecondLiveReportedOncePerTakeover(t *testing.T) {
	bolt := raceCustomer(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	deliver := func(url string, ev []byte) { deliverRace(t, url, ev) }
	event := func(evID, typ, subID, status string, created time.Time) []byte {
		return stripetest.Event(evID, typ, created, map[string]any{
			"id": subID, "object": "subscription", "customer": "cus_race", "status": status,
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_" + subID, "object": "subscription_item",
				"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": created.Add(720 * time.Hour).Unix()}}}})
	}
	nodeC := subRaceNode(t, bolt, "node-c", 0)
	deliver(nodeC.URL, event("evt_first", "customer.subscription.created", "sub_first", "active", t0))

	st := &otherNodeMidway{payStore: bolt, kind: payments.KindSubscriptionOf, id: "geo/u1", other: func() {
		payments.OnAnotherNode(func() {
			deliver(nodeC.URL, event("evt_first_past_due", "customer.subscription.updated", "sub_first", "past_due", t0.Add(time.Second)))
		})
	}}
	core, logs := observer.New(zapcore.InfoLevel)
	cat := meterCatalog(t)
	cfg := payments.Config{Provider: "stripe", SecretKey: "sk_test_race", WebhookSecret: "whsec_race",
		APIBase: "http://127.0.0.1:9",
		Prices:  []payments.Price{{Service: "geo", Product: "pro", Price: "price_pro"}}}
	if err := cfg.Validate(cat); err != nil {
		t.Fatal(err)
	}
	svc, err := payments.New(cfg, payments.Deps{Store: func() store.Store { return st }, Catalog: cat, NodeID: "node-b",
		Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	nodeB := httptest.NewServer(http.HandlerFunc(svc.ServeWebhook))
	defer nodeB.Close()
	deliver(nodeB.URL, event("evt_second", "customer.subscription.created", "sub_second", "active", t0.Add(2*time.Second)))

	n := 0
	for _, w := range logs.FilterLevelExact(zapcore.WarnLevel).All() {
		if f := w.ContextMap(); f["subscription"] == "sub_second" && f["other_subscription"] == "sub_first" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the takeover of the gateway subscription by a second live Stripe subscription was reported %d times, want once", n)
	}
	rb, err := bolt.GetPaymentRecord(ctx, payments.KindSubscriptionOf, "geo/u1")
	if err != nil || !strings.Contains(string(rb), `"sub_second"`) {
		t.Errorf("the link: %s %v; want sub_second's", rb, err)
	}
}

// subEventOf is subEvent of another subscription and customer.
func subEventOf(sub, cus, id, typ, status string, created time.Time) []byte {
	return stripetest.Event(id, typ, created, map[string]any{
		"id": sub, "object": "subscription", "customer": cus, "status": status,
		"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_" + sub, "object": "subscription_item",
			"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": created.Add(720 * time.Hour).Unix()}}}})
}

// TestSlowStripeHoldsOnlyItsCustomer: an invoice event reads its
// subscription from Stripe while the node holds the subscription's
// turn. A Stripe that takes long to answer for one customer's
// subscription held every other subscription event of the node behind
// it (one lock for the node): another user's cancellation waited for
// the slow read, up to stripe-go's 80 s. The turn is now the customer's.
func TestSlowStripeHoldsOnlyItsCustomer(t *testing.T) {
	bolt := raceCustomer(t) // u1, cus_race
	ctx := context.Background()
	b, _ := json.Marshal(payments.CustomerRecord{UserID: "u2", CustomerID: "cus_other", CreatedAt: time.Now().UTC()})
	for kind, id := range map[string]string{payments.KindCustomerUser: "cus_other", payments.KindCustomer: "u2"} {
		if _, err := bolt.InsertPaymentRecord(ctx, kind, id, b, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	inRead, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/subscriptions/sub_race" {
			http.Error(w, `{"error":{"type":"invalid_request_error","message":"not here"}}`, 404)
			return
		}
		once.Do(func() { close(inRead) })
		<-release // Stripe is slow for this one
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "sub_race", "object": "subscription", "customer": "cus_race", "status": "active",
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_race", "object": "subscription_item",
				"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": t0.Add(720 * time.Hour).Unix()}}}})
	}))
	defer api.Close()
	svc := raceService(t, bolt, api.URL, "node-a", 0)
	hook := httptest.NewServer(http.HandlerFunc(svc.ServeWebhook))
	defer hook.Close()
	deliver := func(ev []byte) {
		if status, body := stripetest.Deliver(t, hook.URL, ev, "whsec_race", time.Now()); status != 200 {
			t.Errorf("webhook: %d %s", status, body)
		}
	}
	deliver(subEvent("evt_created", "customer.subscription.created", "active", t0))
	deliver(subEventOf("sub_other", "cus_other", "evt_other", "customer.subscription.created", "active", t0))

	inv := map[string]any{"id": "in_slow", "object": "invoice", "customer": "cus_race", "status": "paid",
		"amount_due": 2900, "amount_paid": 2900, "amount_remaining": 0, "currency": "usd",
		"status_transitions": map[string]any{"paid_at": t0.Add(time.Second).Unix()},
		"parent":             map[string]any{"type": "subscription_details", "subscription_details": map[string]any{"subscription": "sub_race"}}}
	// From goroutines: the webhook is sent without t (which may not
	// stop a test from another goroutine), and the test waits for them.
	send := func(ev []byte) error {
		req, _ := http.NewRequest(http.MethodPost, hook.URL, bytes.NewReader(ev))
		req.Header.Set("Stripe-Signature", stripetest.Sign(ev, "whsec_race", time.Now()))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 {
			return fmt.Errorf("%d %s", resp.StatusCode, b)
		}
		return nil
	}
	var wg sync.WaitGroup
	defer func() {
		close(release) // Stripe answers the slow read; then the goroutines end
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		// Answered once Stripe is: the test's end releases it.
		defer wg.Done()
		_ = send(stripetest.Event("evt_paid", "invoice.paid", t0.Add(time.Second), inv))
	}()
	select {
	case <-inRead:
	case <-time.After(10 * time.Second):
		t.Fatal("the invoice's read-back never reached Stripe")
	}
	done := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		done <- send(subEventOf("sub_other", "cus_other", "evt_other_del", "customer.subscription.deleted", "canceled", t0.Add(2*time.Second)))
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("another customer's cancellation: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("another customer's cancellation waited for the slow Stripe read of cus_race's subscription")
	}
	if got, err := bolt.GetSubscription(ctx, "u2", "geo"); err != nil || got.Status != "EXPIRED" {
		t.Errorf("u2's subscription after its cancellation: %+v %v; want EXPIRED", got, err)
	}
}

// deliverRace sends a webhook event signed with the race tests' secret
// and wants it applied (200).
func deliverRace(t *testing.T, url string, ev []byte) {
	t.Helper()
	if status, body := stripetest.Deliver(t, url, ev, "whsec_race", time.Now()); status != 200 {
		t.Errorf("%s: %d %s", url, status, body)
	}
}
