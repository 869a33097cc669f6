package payments_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
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

// twoLive is one user (u1, customer cus_race) with two live Stripe
// subscriptions of service geo: sub_old of product pro (bought a month
// ago) and sub_new of product payg (bought yesterday, the caller's latest
// purchase), on a real store, through one node's webhook.
type twoLive struct {
	t    *testing.T
	st   payStore
	url  string
	logs *observer.ObservedLogs
	t0   time.Time
	n    int
}

// twoLiveStores runs f on bbolt and on PostgreSQL; open makes a fresh,
// empty store of the kind, closed when t ends.
func twoLiveStores(t *testing.T, f func(t *testing.T, open func(t *testing.T) payStore)) {
	t.Run("bolt", func(t *testing.T) {
		f(t, func(t *testing.T) payStore {
			bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = bolt.Close() })
			return bolt
		})
	})
	t.Run("pg", func(t *testing.T) {
		f(t, func(t *testing.T) payStore {
			st, err := pgstore.Open(context.Background(), pgstore.Options{DSN: pgtest.DB(t), NodeID: "node-a"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			return st
		})
	})
}

func newTwoLive(t *testing.T, st payStore) *twoLive {
	t.Helper()
	ctx := context.Background()
	b, _ := json.Marshal(payments.CustomerRecord{UserID: "u1", CustomerID: "cus_race", CreatedAt: time.Now().UTC()})
	for kind, id := range map[string]string{payments.KindCustomerUser: "cus_race", payments.KindCustomer: "u1"} {
		if _, err := st.InsertPaymentRecord(ctx, kind, id, b, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	url, logs := twoLiveNode(t, st, "node-a")
	return &twoLive{t: t, st: st, url: url, logs: logs, t0: time.Now().Add(-time.Hour).Truncate(time.Second)}
}

// twoLiveNode serves node's webhook on st, selling geo's pro for
// price_pro and payg for price_payg; logs are its log lines.
func twoLiveNode(t *testing.T, st store.Store, node string) (string, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	cat := meterCatalog(t)
	cfg := payments.Config{Provider: "stripe", SecretKey: "sk_test_race", WebhookSecret: "whsec_race", APIBase: "http://127.0.0.1:9",
		Prices: []payments.Price{{Service: "geo", Product: "pro", Price: "price_pro"}, {Service: "geo", Product: "payg", Price: "price_payg"}}}
	if err := cfg.Validate(cat); err != nil {
		t.Fatal(err)
	}
	svc, err := payments.New(cfg, payments.Deps{Store: func() store.Store { return st }, Catalog: cat, NodeID: node, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(svc.ServeWebhook))
	t.Cleanup(srv.Close)
	return srv.URL, logs
}

// bought is when each subscription was made at Stripe (its created and
// start_date); price is its product's Price.
var (
	twoLiveBought = map[string]time.Duration{"sub_old": -30 * 24 * time.Hour, "sub_new": -24 * time.Hour}
	twoLivePrice  = map[string]string{"sub_old": "price_pro", "sub_new": "price_payg"}
)

// send delivers the next customer.subscription.<typ> event of sub (each
// a second after the one before) and wants it applied. mod changes the
// subscription object first.
func (e *twoLive) send(typ, sub, status string, mod ...func(map[string]any)) {
	e.t.Helper()
	if status, body := stripetest.Deliver(e.t, e.url, e.event(typ, sub, status, mod...), "whsec_race", time.Now()); status != 200 {
		e.t.Fatalf("%s %s: %d %s", typ, sub, status, body)
	}
}

// event is the next customer.subscription.<typ> event of sub.
func (e *twoLive) event(typ, sub, status string, mod ...func(map[string]any)) []byte {
	e.n++
	at := e.t0.Add(time.Duration(e.n) * time.Second)
	bought := e.t0.Add(twoLiveBought[sub])
	obj := map[string]any{"id": sub, "object": "subscription", "customer": "cus_race", "status": status,
		"created": bought.Unix(), "start_date": bought.Unix(),
		"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_" + sub, "object": "subscription_item",
			"price":                map[string]any{"id": twoLivePrice[sub], "object": "price"},
			"current_period_start": e.t0.Add(-time.Hour).Unix(), "current_period_end": e.t0.Add(720 * time.Hour).Unix()}}}}
	for _, m := range mod {
		m(obj)
	}
	return stripetest.Event(fmt.Sprintf("evt_%s_%s_%d", sub, typ, e.n), "customer.subscription."+typ, at, obj)
}

// gateway is u1's gateway subscription to geo.
func (e *twoLive) gateway() store.Subscription {
	e.t.Helper()
	sub, err := e.st.GetSubscription(context.Background(), "u1", "geo")
	if err != nil {
		e.t.Fatalf("the gateway subscription: %v", err)
	}
	return sub
}

// holder is the Stripe subscription the link names.
func (e *twoLive) holder() string {
	e.t.Helper()
	b, err := e.st.GetPaymentRecord(context.Background(), payments.KindSubscriptionOf, "geo/u1")
	var link struct {
		SubscriptionID string `json:"subscriptionId"`
	}
	if err != nil || json.Unmarshal(b, &link) != nil {
		e.t.Fatalf("the link: %s %v", b, err)
	}
	return link.SubscriptionID
}

// record is sub's record.
func (e *twoLive) record(sub string) payments.SubscriptionRecord {
	e.t.Helper()
	b, err := e.st.GetPaymentRecord(context.Background(), payments.KindSubscription, sub)
	var rec payments.SubscriptionRecord
	if err != nil || json.Unmarshal(b, &rec) != nil {
		e.t.Fatalf("the record of %s: %s %v", sub, b, err)
	}
	return rec
}

// warnings are the warnings naming both subscriptions, in either role;
// none may hold a secret.
func (e *twoLive) warnings() int {
	e.t.Helper()
	n := 0
	for _, w := range e.logs.FilterLevelExact(zapcore.WarnLevel).All() {
		f := w.ContextMap()
		a, b := f["subscription"], f["other_subscription"]
		if a == "sub_old" && b == "sub_new" || a == "sub_new" && b == "sub_old" {
			n++
		}
		for k, v := range f {
			if s, ok := v.(string); ok && (strings.Contains(s, "sk_test") || strings.Contains(s, "whsec")) {
				e.t.Errorf("the warning's %s holds a secret: %q", k, s)
			}
		}
	}
	return n
}

// TestTwoLiveSubscriptionsKeepTheNewer: a user with two live Stripe
// subscriptions of one service (one opened before the gateway kept
// Checkouts to one, or one made in the Dashboard) pays both, and the
// gateway subscription followed whichever's event came last: every
// customer.subscription.updated (or invoice.paid) of either flipped its
// product, period and status, with a warning each time, until the
// operator cancelled one. Now the newer Stripe subscription (the
// caller's latest purchase) holds it while it is live: the older one's
// events are recorded and change nothing, and the operator is warned
// once, whichever of the two was seen first.
func TestTwoLiveSubscriptionsKeepTheNewer(t *testing.T) {
	twoLiveStores(t, func(t *testing.T, open func(t *testing.T) payStore) {
		for _, newerFirst := range []bool{false, true} {
			name := "older_first"
			if newerFirst {
				name = "newer_first"
			}
			t.Run(name, func(t *testing.T) {
				e := newTwoLive(t, open(t))
				if newerFirst {
					e.send("created", "sub_new", "active")
					e.send("created", "sub_old", "active")
				} else {
					e.send("created", "sub_old", "active")
					e.send("created", "sub_new", "active")
				}
				// Alternating updated events of the two: the gateway
				// subscription after each, and the link.
				var seen, want []string
				for i := range 6 {
					sub := []string{"sub_old", "sub_new"}[i%2]
					e.send("updated", sub, "active")
					got := e.gateway()
					seen = append(seen, sub+"→"+got.ProductID+" "+got.Status+" ("+e.holder()+")")
					want = append(want, sub+"→payg ACTIVE (sub_new)")
				}
				if strings.Join(seen, ", ") != strings.Join(want, ", ") {
					t.Errorf("the gateway subscription after alternating events of the two:\n  %s\nwant sub_new's (payg, the newer) throughout:\n  %s",
						strings.Join(seen, ", "), strings.Join(want, ", "))
				}
				if rec := e.record("sub_old"); rec.StripeStatus != "active" || !rec.EventCreated.Equal(e.t0.Add(time.Duration(e.n-1)*time.Second)) {
					t.Errorf("sub_old's record: %s as of %v; want its last event recorded (active, %v)", rec.StripeStatus, rec.EventCreated, e.t0.Add(time.Duration(e.n-1)*time.Second))
				}
				if n := e.warnings(); n != 1 {
					t.Errorf("the two live subscriptions were reported %d times, want once", n)
				}
			})
		}
	})
}

// TestTwoLiveHandOverWhenTheHolderEnds: the newer of two live Stripe
// subscriptions holds the gateway subscription and ends (the operator
// cancels the duplicate in the Dashboard, the caller cancels the
// upgrade, or its payment fails for good: unpaid). The older one, still
// live and paid, takes the gateway subscription over at once, from its
// record: the gateway subscription was left EXPIRED (or SUSPENDED) until
// the older one's next event (its next invoice, up to a period away)
// while the caller paid for it. An older one that has ended by then
// takes nothing.
func TestTwoLiveHandOverWhenTheHolderEnds(t *testing.T) {
	twoLiveStores(t, func(t *testing.T, open func(t *testing.T) payStore) {
		for _, end := range []string{"canceled", "unpaid"} {
			t.Run(end, func(t *testing.T) {
				e := newTwoLive(t, open(t))
				e.send("created", "sub_old", "active")
				e.send("created", "sub_new", "active")
				e.send("updated", "sub_old", "active")
				if got := e.gateway(); got.ProductID != "payg" {
					t.Fatalf("before the end: %s %s, want payg (sub_new's)", got.ProductID, got.Status)
				}
				typ := "deleted"
				if end == "unpaid" {
					typ = "updated"
				}
				e.send(typ, "sub_new", end)
				got := e.gateway()
				if got.ProductID != "pro" || got.Status != "ACTIVE" || !got.EndsAt.IsZero() {
					t.Errorf("after the newer subscription became %s: %s %s ends %v %s; want pro ACTIVE (sub_old's, live and paid) at once",
						end, got.ProductID, got.Status, got.EndsAt, got.EndStatus)
				}
				if h := e.holder(); h != "sub_old" {
					t.Errorf("after the newer subscription became %s the link names %s, want sub_old", end, h)
				}
				// sub_old's own events set it as before.
				e.send("updated", "sub_old", "active", func(o map[string]any) { o["cancel_at_period_end"] = true })
				if got := e.gateway(); got.ProductID != "pro" || got.Status != "CANCELLING" {
					t.Errorf("after sub_old's next event (cancelling): %s %s, want pro CANCELLING", got.ProductID, got.Status)
				}
				// Its end ends the gateway subscription; nothing is left
				// to hand over to.
				e.send("deleted", "sub_old", "canceled")
				if got := e.gateway(); got.Status != "EXPIRED" {
					t.Errorf("after both ended: %s %s, want EXPIRED", got.ProductID, got.Status)
				}
			})
		}
		t.Run("older_ended_first", func(t *testing.T) {
			e := newTwoLive(t, open(t))
			e.send("created", "sub_old", "active")
			e.send("created", "sub_new", "active")
			e.send("deleted", "sub_old", "canceled")
			if got := e.gateway(); got.ProductID != "payg" || got.Status != "ACTIVE" {
				t.Fatalf("after the older one's deletion: %s %s, want payg ACTIVE (sub_new's, untouched)", got.ProductID, got.Status)
			}
			e.send("deleted", "sub_new", "canceled")
			if got := e.gateway(); got.ProductID != "payg" || got.Status != "EXPIRED" {
				t.Errorf("after both ended: %s %s, want payg EXPIRED (nothing live to hand over to)", got.ProductID, got.Status)
			}
		})
	})
}

// armedMidway is otherNodeMidway once armed: other runs inside the
// first read of the record after arm.
type armedMidway struct {
	payStore
	kind, id string
	other    func()
	armed    atomic.Bool
}

func (s *armedMidway) GetPaymentRecord(ctx context.Context, kind, id string) ([]byte, error) {
	b, err := s.payStore.GetPaymentRecord(ctx, kind, id)
	if kind == s.kind && id == s.id && s.armed.CompareAndSwap(true, false) {
		s.other()
	}
	return b, err
}

// TestTwoLiveKeptOutReportedOnce: the newer of two live Stripe
// subscriptions holds the gateway subscription and the older one's
// first event comes (the link records it, the operator is warned).
// Another node applies an event of the newer one between this node's
// read of the link and its swap of it, so the swap fails and is made
// again: the older one is still kept out, listed once and reported
// once.
func TestTwoLiveKeptOutReportedOnce(t *testing.T) {
	twoLiveStores(t, func(t *testing.T, open func(t *testing.T) payStore) {
		raw := open(t)
		mid := &armedMidway{payStore: raw, kind: payments.KindSubscriptionOf, id: "geo/u1"}
		e := newTwoLive(t, mid)
		e.st = raw
		otherURL, _ := twoLiveNode(t, raw, "node-b")
		e.send("created", "sub_new", "active")
		// Past due: the link's applied state changes with it.
		pastDue := e.event("updated", "sub_new", "past_due")
		mid.other = func() {
			payments.OnAnotherNode(func() {
				if status, body := stripetest.Deliver(t, otherURL, pastDue, "whsec_race", time.Now()); status != 200 {
					t.Errorf("node b: %d %s", status, body)
				}
			})
		}
		mid.armed.Store(true)
		e.send("created", "sub_old", "active")
		if mid.armed.Load() {
			t.Fatal("node b's event never ran")
		}
		if got := e.gateway(); got.ProductID != "payg" || got.Status != "ACTIVE" || got.EndsAt.IsZero() {
			t.Errorf("the gateway subscription: %s %s ends %v; want payg ACTIVE ending with the past-due grace (sub_new's)", got.ProductID, got.Status, got.EndsAt)
		}
		b, err := raw.GetPaymentRecord(context.Background(), payments.KindSubscriptionOf, "geo/u1")
		var link struct {
			SubscriptionID string   `json:"subscriptionId"`
			Others         []string `json:"others"`
		}
		if err != nil || json.Unmarshal(b, &link) != nil || link.SubscriptionID != "sub_new" || len(link.Others) != 1 || link.Others[0] != "sub_old" {
			t.Errorf("the link: %s %v; want sub_new's, listing sub_old once", b, err)
		}
		if n := e.warnings(); n != 1 {
			t.Errorf("the older live subscription kept out was reported %d times, want once", n)
		}
		// Its later events are not reported again.
		e.send("updated", "sub_old", "active")
		if n := e.warnings(); n != 1 {
			t.Errorf("after another event of the older one: reported %d times, want once", n)
		}
	})
}
