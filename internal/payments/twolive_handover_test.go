package payments_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
)

// leaseRefusedOnce is a store whose lease name is refused, once armed,
// by an error: the hand-over's lease of the other subscription cannot be
// taken (another node applying it past the wait, a store blip).
type leaseRefusedOnce struct {
	payStore
	name  string
	armed atomic.Bool
}

func (s *leaseRefusedOnce) TakeLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (store.Lease, error) {
	if name == s.name && s.armed.CompareAndSwap(true, false) {
		return store.Lease{}, errors.New("the lease cannot be taken just now")
	}
	return s.payStore.TakeLease(ctx, name, holder, ttl, now)
}

// TestTwoLiveHandOverThatFailsIsRetried: the newer of two live Stripe
// subscriptions holds the gateway subscription and is deleted; its
// hand-over to the older one, live and paid, fails (its lease cannot be
// taken). The event was answered 200 with the gateway subscription
// EXPIRED, and Stripe's redelivery of it (had it been one) changed
// nothing: the caller paying for the older one had no access until its
// next event, up to a period away. The event now fails when its
// hand-over does, and Stripe's retry of it hands over.
func TestTwoLiveHandOverThatFailsIsRetried(t *testing.T) {
	twoLiveStores(t, func(t *testing.T, open func(t *testing.T) payStore) {
		raw := open(t)
		refuse := &leaseRefusedOnce{payStore: raw, name: "stripe_subscription/sub_old"}
		e := newTwoLive(t, refuse)
		e.st = raw
		e.send("created", "sub_old", "active")
		e.send("created", "sub_new", "active")
		e.send("updated", "sub_old", "active")
		refuse.armed.Store(true)
		ev := e.event("deleted", "sub_new", "canceled")
		// Stripe delivers an event until it is answered 2xx.
		for try := 1; ; try++ {
			status, body := stripetest.Deliver(t, e.url, ev, "whsec_race", time.Now())
			if status == 200 {
				break
			}
			if try == 3 {
				t.Fatalf("the deletion is still answered %d %s after %d deliveries", status, body, try)
			}
		}
		if refuse.armed.Load() {
			t.Fatal("the hand-over never asked for the lease")
		}
		if got := e.gateway(); got.ProductID != "pro" || got.Status != "ACTIVE" {
			t.Errorf("after the holder's deletion (its hand-over failed once): %s %s; want pro ACTIVE (sub_old's, live and paid)", got.ProductID, got.Status)
		}
		if h := e.holder(); h != "sub_old" {
			t.Errorf("the link names %s, want sub_old", h)
		}
	})
}

// TestTwoLiveHandOverPastTheGrace: the newer of two live Stripe
// subscriptions holds the gateway subscription and its payment fails
// (past due): it keeps access for past_due_grace, then the gateway
// subscription is SUSPENDED by its end. Stripe goes on retrying the
// payment for days (each retry an event of it, the state unchanged)
// before it marks it unpaid or cancels it. The older one, live and paid,
// was kept out all that time: no event of the holder wrote anything, so
// none handed over. The holder's first event past its grace now hands
// the gateway subscription over.
func TestTwoLiveHandOverPastTheGrace(t *testing.T) {
	twoLiveStores(t, func(t *testing.T, open func(t *testing.T) payStore) {
		st := open(t)
		var ahead atomic.Int64
		e := newTwoLive(t, st)
		e.url = twoLiveNodeAt(t, st, "node-a", func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) })
		e.send("created", "sub_old", "active")
		e.send("created", "sub_new", "active")
		e.send("updated", "sub_old", "active")
		e.send("updated", "sub_new", "past_due")
		if got := e.gateway(); got.ProductID != "payg" || got.Status != "ACTIVE" || got.EndsAt.IsZero() {
			t.Fatalf("the holder past due: %s %s ends %v; want payg ACTIVE ending with the grace", got.ProductID, got.Status, got.EndsAt)
		}
		ahead.Store(int64(payments.DefaultPastDueGrace + time.Hour))
		e.send("updated", "sub_new", "past_due") // a payment retry failed: still past due
		if got := e.gateway(); got.ProductID != "pro" || got.Status != "ACTIVE" || !got.EndsAt.IsZero() {
			t.Errorf("the holder's event past its grace: %s %s ends %v %s; want pro ACTIVE (sub_old's, live and paid)",
				got.ProductID, got.Status, got.EndsAt, got.EndStatus)
		}
		// Its payment going through after all: the later bought takes
		// the gateway subscription back.
		e.send("updated", "sub_new", "active")
		if got := e.gateway(); got.ProductID != "payg" || got.Status != "ACTIVE" {
			t.Errorf("the holder paid after all: %s %s; want payg ACTIVE", got.ProductID, got.Status)
		}
	})
}

// twoLiveNodeAt is twoLiveNode with the app's clock now.
func twoLiveNodeAt(t *testing.T, st store.Store, node string, now func() time.Time) string {
	t.Helper()
	_, url := twoLiveService(t, st, node, now)
	return url
}

// TestTwoLiveKeptOutDeletedLeavesTheList: the older of two live Stripe
// subscriptions, kept out while the newer holds the gateway
// subscription, is deleted (the operator cancels the duplicate). Its
// end changes nothing of the gateway subscription, and it leaves the
// link's list of the ones to hand over to: it stayed listed for good,
// read at every hand-over and taking one of the list's places.
func TestTwoLiveKeptOutDeletedLeavesTheList(t *testing.T) {
	twoLiveStores(t, func(t *testing.T, open func(t *testing.T) payStore) {
		e := newTwoLive(t, open(t))
		e.send("created", "sub_old", "active")
		e.send("created", "sub_new", "active")
		e.send("updated", "sub_old", "active")
		if others := twoLiveOthers(t, e.st); len(others) != 1 || others[0] != "sub_old" {
			t.Fatalf("the link lists %v, want [sub_old]", others)
		}
		e.send("deleted", "sub_old", "canceled")
		if got := e.gateway(); got.ProductID != "payg" || got.Status != "ACTIVE" || !got.EndsAt.IsZero() {
			t.Errorf("after the kept-out one's deletion: %s %s ends %v; want payg ACTIVE (sub_new's, untouched)", got.ProductID, got.Status, got.EndsAt)
		}
		if h := e.holder(); h != "sub_new" {
			t.Errorf("the link names %s, want sub_new", h)
		}
		if others := twoLiveOthers(t, e.st); len(others) != 0 {
			t.Errorf("the link lists %v after the kept-out one's deletion, want none", others)
		}
		// A late event of it (older than its deletion) lists it again no more.
		e.n -= 3
		e.send("updated", "sub_old", "active")
		e.n += 3
		if others := twoLiveOthers(t, e.st); len(others) != 0 {
			t.Errorf("the link lists %v after a late event of the deleted one, want none", others)
		}
	})
}

// twoLiveOthers is the link's list of the live ones kept out.
func twoLiveOthers(t *testing.T, st payStore) []string {
	t.Helper()
	b, err := st.GetPaymentRecord(context.Background(), payments.KindSubscriptionOf, "geo/u1")
	var link struct {
		Others []string `json:"others"`
	}
	if err != nil || json.Unmarshal(b, &link) != nil {
		t.Fatalf("the link: %s %v", b, err)
	}
	return link.Others
}
