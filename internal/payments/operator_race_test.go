package payments_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
)

// beforeFirstSwap runs before, once, just before the first swap of one
// payment record: what another writer does between this node's write
// of the gateway subscription and its swap of the record.
type beforeFirstSwap struct {
	payStore
	kind, id string
	before   func()

	once sync.Once
}

func (s *beforeFirstSwap) SwapPaymentRecord(ctx context.Context, kind, id string, old, body []byte, at time.Time) error {
	if kind == s.kind && id == s.id {
		s.once.Do(s.before)
	}
	return s.payStore.SwapPaymentRecord(ctx, kind, id, old, body, at)
}

// TestRacePutBackKeepsAnOperatorsPlan: node a applies an older event of
// a Stripe subscription (active) while node b applies the newer one
// (cancelling at the period's end) in the middle of it, so a writes
// ACTIVE over b's CANCELLING and, its swap of the record failing, puts
// b's state back. An operator puts another plan (the admin API, the
// console) between a's write and its putting back. The put-back undoes
// a's own stale write only: the operator's plan, the latest explicit
// write, stays (Stripe's state is written again with the subscription's
// next event, as over any plan put since). The put-back wrote b's state
// over whatever was there: the operator's plan was lost without a word.
func TestRacePutBackKeepsAnOperatorsPlan(t *testing.T) {
	operatorPlanRace(t, "a race put back while an operator put a plan", func(midway payStore, put func()) payStore {
		return &beforeFirstSwap{payStore: midway, kind: payments.KindSubscription, id: "sub_race", before: put}
	})
}

// operatorPlanRace is the setting of the operator tests: node a applies
// an older event of a Stripe subscription (active) while node b applies
// the newer one (cancelling at the period's end) in the middle of it
// (otherNodeMidway), and an operator puts another plan (payg ACTIVE)
// when the store wrap makes of node a's calls put. The operator's plan
// stays; the subscription's next event sets it as Stripe says. A
// wrapped store that says whether it raced (raced) must have.
func operatorPlanRace(t *testing.T, what string, wrap func(midway payStore, put func()) payStore) {
	t.Helper()
	bolt := raceCustomer(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	deliver := func(url string, ev []byte) { deliverRace(t, url, ev) }
	event := func(id string, created time.Time, cancelling bool) []byte {
		return stripetest.Event(id, "customer.subscription.updated", created, map[string]any{
			"id": "sub_race", "object": "subscription", "customer": "cus_race", "status": "active", "cancel_at_period_end": cancelling,
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_race", "object": "subscription_item",
				"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": t0.Add(720 * time.Hour).Unix()}}}})
	}
	nodeB := subRaceNode(t, bolt, "node-b", time.Minute) // node a stalled past its lease
	midway := &otherNodeMidway{payStore: bolt, kind: payments.KindSubscription, id: "sub_race", other: func() {
		payments.OnAnotherNode(func() { deliver(nodeB.URL, event("evt_cancelling", t0.Add(2*time.Second), true)) })
	}}
	operator := store.Subscription{UserID: "u1", ServiceID: "geo", ProductID: "payg", Status: "ACTIVE"}
	st := wrap(midway, func() {
		now := time.Now().UTC()
		put := operator
		put.UpdatedAt = now
		if _, err := bolt.PutSubscription(ctx, put, store.AuditEntry{Time: now, Actor: "admin:ops", Action: "subscription.put",
			UserID: "u1", ServiceID: "geo", Detail: "product payg, status ACTIVE"}); err != nil {
			t.Error(err)
		}
	})
	nodeA := httptest.NewServer(http.HandlerFunc(raceService(t, st, "http://127.0.0.1:9", "node-a", 0).ServeWebhook))
	t.Cleanup(nodeA.Close)
	deliver(subRaceNode(t, bolt, "node-c", 0).URL, subEvent("evt_created", "customer.subscription.created", "active", t0))
	deliver(nodeA.URL, event("evt_active", t0.Add(time.Second), false))

	if r, ok := st.(interface{ raced() bool }); ok && !r.raced() {
		t.Fatal("node a's swap of the record never failed: no put-back was raced")
	}
	sub, err := bolt.GetSubscription(ctx, "u1", "geo")
	if err != nil || sub.ProductID != operator.ProductID || sub.Status != operator.Status || !sub.EndsAt.IsZero() {
		t.Errorf("the gateway subscription after %s: %s %s ends %v %s (%v); want the operator's %s %s",
			what, sub.ProductID, sub.Status, sub.EndsAt, sub.EndStatus, err, operator.ProductID, operator.Status)
	}
	// The subscription's next event sets it as Stripe says, as over any
	// plan put since.
	deliver(nodeB.URL, event("evt_next", t0.Add(3*time.Second), true))
	if sub, err := bolt.GetSubscription(ctx, "u1", "geo"); err != nil || sub.ProductID != "pro" || sub.Status != "CANCELLING" {
		t.Errorf("the gateway subscription after the next event: %s %s (%v); want pro CANCELLING", sub.ProductID, sub.Status, err)
	}
}

// afterPutBackRead runs put, once, just after the first read of the
// gateway subscription that follows this node's failed swap of one
// payment record: the read of a put-back (reapplyRecord), which decides
// whether the gateway subscription is still as this Stripe subscription
// left it. put lands between that read and the put-back's write.
type afterPutBackRead struct {
	payStore
	kind, id string
	put      func()

	mu    sync.Mutex
	armed bool
	once  sync.Once
}

func (s *afterPutBackRead) SwapPaymentRecord(ctx context.Context, kind, id string, old, body []byte, at time.Time) error {
	err := s.payStore.SwapPaymentRecord(ctx, kind, id, old, body, at)
	if kind == s.kind && id == s.id && err != nil {
		s.mu.Lock()
		s.armed = true
		s.mu.Unlock()
	}
	return err
}

func (s *afterPutBackRead) GetSubscription(ctx context.Context, userID, serviceID string) (store.Subscription, error) {
	sub, err := s.payStore.GetSubscription(ctx, userID, serviceID)
	s.mu.Lock()
	armed := s.armed
	s.mu.Unlock()
	if armed {
		s.once.Do(s.put)
	}
	return sub, err
}

// TestRacePutBackFencedAgainstAnOperatorsPlan is
// TestRacePutBackKeepsAnOperatorsPlan with the operator's plan put in
// the instant after the put-back read the gateway subscription (and
// found it still as node a's stale write left it) and before it wrote
// b's state back. The put-back's fence was that read: a put landing
// after it was written over, the operator's plan lost without a word.
// The put-back is now a conditional write (store
// PutSubscriptionIf, on the revision it read): refused, it reads again
// and finds the operator's plan, which stays.
func TestRacePutBackFencedAgainstAnOperatorsPlan(t *testing.T) {
	operatorPlanRace(t, "an operator's plan put between the put-back's read and its write", func(midway payStore, put func()) payStore {
		return &afterPutBackRead{payStore: midway, kind: payments.KindSubscription, id: "sub_race", put: put}
	})
}

// raced says whether node a's swap of the record failed, so that a
// put-back was raced at all.
func (s *afterPutBackRead) raced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.armed
}
