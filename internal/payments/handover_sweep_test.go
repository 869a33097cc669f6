package payments_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// TestHandOverSweepPastTheGrace: the newer of two live Stripe
// subscriptions holds the gateway subscription and its payment fails
// (past due); its grace runs out and no event of it comes after (Stripe
// set to leave a subscription past due once its retries are over, or a
// retry days away). The older one, live and paid, was kept out until
// an event of either came, up to a period away: no timer handed over.
// The sweep (every node's, each minute) now hands over what is owed;
// run again, or on a second node at once, it changes nothing more.
func TestHandOverSweepPastTheGrace(t *testing.T) {
	twoLiveStores(t, func(t *testing.T, open func(t *testing.T) payStore) {
		ctx := context.Background()
		st := open(t)
		var ahead atomic.Int64
		now := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
		e := newTwoLive(t, st)
		svcA, urlA := twoLiveService(t, st, "node-a", now)
		svcB, _ := twoLiveService(t, st, "node-b", now)
		e.url = urlA
		e.send("created", "sub_old", "active")
		e.send("created", "sub_new", "active")
		e.send("updated", "sub_old", "active")
		e.send("updated", "sub_new", "past_due")
		if n, err := svcA.SweepHandOvers(ctx); err != nil || n != 0 {
			t.Fatalf("a sweep in the holder's grace: %d hand-overs, %v; want none", n, err)
		}
		if got := e.gateway(); got.ProductID != "payg" || got.Status != "ACTIVE" || got.EndsAt.IsZero() {
			t.Fatalf("the holder past due, in its grace: %s %s ends %v; want payg ACTIVE ending with the grace", got.ProductID, got.Status, got.EndsAt)
		}
		ahead.Store(int64(payments.DefaultPastDueGrace + time.Hour))
		done := make(chan int, 2)
		for _, svc := range []*payments.Service{svcA, svcB} {
			go func() {
				n, err := svc.SweepHandOvers(ctx)
				if err != nil {
					t.Errorf("a sweep past the grace: %v", err)
				}
				done <- n
			}()
		}
		if n := <-done + <-done; n != 1 {
			t.Errorf("two nodes' sweeps past the grace made %d hand-overs, want 1", n)
		}
		if got := e.gateway(); got.ProductID != "pro" || got.Status != "ACTIVE" || !got.EndsAt.IsZero() {
			t.Errorf("after the sweep past the holder's grace: %s %s ends %v %s; want pro ACTIVE (sub_old's, live and paid)",
				got.ProductID, got.Status, got.EndsAt, got.EndStatus)
		}
		if h := e.holder(); h != "sub_old" {
			t.Errorf("the link names %s, want sub_old", h)
		}
		if n, err := svcA.SweepHandOvers(ctx); err != nil || n != 0 {
			t.Errorf("the sweep again: %d hand-overs, %v; want none", n, err)
		}
		// Its payment going through after all: the later bought takes
		// the gateway subscription back.
		e.send("updated", "sub_new", "active")
		if got := e.gateway(); got.ProductID != "payg" || got.Status != "ACTIVE" {
			t.Errorf("the holder paid after all: %s %s; want payg ACTIVE", got.ProductID, got.Status)
		}
	})
}

// twoLiveService is twoLiveNodeAt's service, with its webhook's URL.
func twoLiveService(t *testing.T, st store.Store, node string, now func() time.Time) (*payments.Service, string) {
	t.Helper()
	return twoLiveServiceAPI(t, st, node, "http://127.0.0.1:9", now)
}

// twoLiveServiceAPI is twoLiveService with Stripe's API at api (a
// stripe-mock); now nil is the wall clock.
func twoLiveServiceAPI(t *testing.T, st store.Store, node, api string, now func() time.Time) (*payments.Service, string) {
	t.Helper()
	cat := meterCatalog(t)
	cfg := payments.Config{Provider: "stripe", SecretKey: "sk_test_race", WebhookSecret: "whsec_race", APIBase: api,
		Prices: []payments.Price{{Service: "geo", Product: "pro", Price: "price_pro"}, {Service: "geo", Product: "payg", Price: "price_payg"}}}
	if err := cfg.Validate(cat); err != nil {
		t.Fatal(err)
	}
	svc, err := payments.New(cfg, payments.Deps{Store: func() store.Store { return st }, Catalog: cat, NodeID: node, Logger: zap.NewNop(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(svc.ServeWebhook))
	t.Cleanup(srv.Close)
	return svc, srv.URL
}
