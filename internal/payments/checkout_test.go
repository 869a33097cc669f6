package payments_test

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// checkoutFor is alice's Checkout of geo's paid plan pro.
var checkoutFor = payments.CheckoutRequest{UserID: "alice", ServiceID: "geo", ProductID: "pro",
	SuccessURL: "https://gw.example/portal/plans/geo?m=subscribed", CancelURL: "https://gw.example/portal/plans/geo?m=checkout-cancelled"}

// slowCheckouts makes stripe-mock take d to create a Checkout Session, as
// Stripe takes a few hundred milliseconds: long enough for every click of
// a burst to arrive while the first session is being made.
func slowCheckouts(m *stripetest.Mock, d time.Duration) {
	m.Fail(func(r stripetest.Request) int {
		if r.Method == http.MethodPost && r.Path == "/v1/checkout/sessions" {
			time.Sleep(d)
		}
		return 0
	})
}

// sessionsCreated are the Checkout Sessions created at stripe-mock (the
// POSTs of /v1/checkout/sessions, not the reads or expiries of one).
func sessionsCreated(m *stripetest.Mock) []stripetest.Request {
	var out []stripetest.Request
	for _, r := range m.Requests("/v1/checkout/sessions") {
		if r.Method == http.MethodPost && r.Path == "/v1/checkout/sessions" {
			out = append(out, r)
		}
	}
	return out
}

// clickAtOnce starts alice's Checkout n times at the same instant, the
// i-th through services[i%len(services)], and returns the URLs and errors.
func clickAtOnce(n int, services ...*payments.Service) ([]string, []error) {
	urls, errs := make([]string, n), make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			urls[i], errs[i] = services[i%len(services)].StartSubscriptionCheckout(context.Background(), checkoutFor)
		}()
	}
	close(start)
	wg.Wait()
	return urls, errs
}

// openAtStripe makes stripe-mock say every Checkout Session read back is
// open for another hour of the env's clock, as Stripe says of a session
// made just now. Left alone stripe-mock, which keeps no state, says it
// expires at its fixture's 2009 (1234567890): a click that came after
// the session was made took it for one about to expire, expired it and
// made a second one (a click late under load; TestCheckoutOnceAcrossNodes
// failed so).
func openAtStripe(e *meterEnv) {
	e.mock.AnswerUnder("/v1/checkout/sessions/", map[string]any{"status": "open", "expires_at": e.clock.Now().Add(time.Hour).Unix()})
}

// clickLate is one more click of alice's, after the burst's session was
// made: it is sent to that session, as a click of the burst that ran
// late (a loaded machine) would be.
func clickLate(s *payments.Service, urls []string, errs []error) ([]string, []error) {
	u, err := s.StartSubscriptionCheckout(context.Background(), checkoutFor)
	return append(urls, u), append(errs, err)
}

// wantOneSession checks that the burst opened one Checkout Session, with
// an Idempotency-Key, and that every click was sent to it.
func wantOneSession(t *testing.T, m *stripetest.Mock, urls []string, errs []error) {
	t.Helper()
	created := sessionsCreated(m)
	if len(created) != 1 {
		t.Fatalf("%d clicks at once created %d Checkout Sessions at Stripe, want 1 (two paid sessions are two subscriptions and two charges)", len(urls), len(created))
	}
	if created[0].IdempotencyKey == "" {
		t.Errorf("the Checkout Session was created without an Idempotency-Key")
	}
	for i := range urls {
		if errs[i] != nil || urls[i] == "" || urls[i] != urls[0] {
			t.Errorf("click %d: %q %v, want the one session's URL %q", i, urls[i], errs[i], urls[0])
		}
	}
}

// TestCheckoutOnceForClicksAtOnce: eight clicks on Subscribe at the same
// instant (tabs, a double submit) open one Stripe Checkout Session, and
// all eight are sent to it. The old gateway remembered the session only
// after Stripe had made it, so every click found none and made its own.
func TestCheckoutOnceForClicksAtOnce(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	e.customer("alice", "cus_alice")
	s := e.service("node-a")
	slowCheckouts(e.mock, 300*time.Millisecond)
	openAtStripe(e)
	urls, errs := clickAtOnce(8, s)
	urls, errs = clickLate(s, urls, errs)
	wantOneSession(t, e.mock, urls, errs)
}

// TestCheckoutOnceAcrossNodes: the same clicks spread over two nodes of a
// fleet on one PostgreSQL database (a balancer in front) open one
// session too.
func TestCheckoutOnceAcrossNodes(t *testing.T) {
	dsn := pgtest.DB(t)
	open := func(node string) *pgstore.Store {
		st, err := pgstore.Open(context.Background(), pgstore.Options{DSN: dsn, NodeID: node})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	st1, st2 := open("n1"), open("n2")
	e := newMeterEnv(t, st1)
	e2 := &meterEnv{t: t, st: st2, mock: e.mock, clock: e.clock, cat: e.cat, seq: e.seq}
	e.customer("alice", "cus_alice")
	slowCheckouts(e.mock, 300*time.Millisecond)
	openAtStripe(e)
	s1, s2 := e.service("n1"), e2.service("n2")
	urls, errs := clickAtOnce(8, s1, s2)
	urls, errs = clickLate(s2, urls, errs)
	wantOneSession(t, e.mock, urls, errs)
}

// TestCheckoutClaimOfADeadNode: a node that claimed the Checkout and
// died before it made the session holds the user back for a bounded
// time only. Meanwhile a click is told a checkout is being opened
// (nothing is created); once this node has seen the claim unchanged for
// its bound the next click takes it over and opens the session. A session Stripe says is
// no longer open is replaced by a new one.
func TestCheckoutClaimOfADeadNode(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	e.customer("alice", "cus_alice")
	s := e.service("node-a")
	ctx := context.Background()
	pay := store.Payments(st)
	// The claim as the dead node left it: no session yet.
	claim, _ := json.Marshal(map[string]any{"productId": "pro", "claim": "node-b-dead", "claimedAt": e.clock.Now()})
	if _, err := pay.InsertPaymentRecord(ctx, payments.KindCheckoutOpen, "geo/alice", claim, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if url, err := s.StartSubscriptionCheckout(ctx, checkoutFor); !errors.Is(err, payments.ErrCheckoutBusy) {
		t.Fatalf("a click while another node opens the checkout: %q %v, want ErrCheckoutBusy", url, err)
	}
	if waited := time.Since(began); waited > 10*time.Second {
		t.Errorf("the click waited %v for the claim, want a few seconds", waited)
	}
	if n := len(sessionsCreated(e.mock)); n != 0 {
		t.Fatalf("%d Checkout Sessions created while another node held the claim", n)
	}
	e.clock.Add(31 * time.Second)
	first, err := s.StartSubscriptionCheckout(ctx, checkoutFor)
	if err != nil || first == "" {
		t.Fatalf("a click after the dead node's claim ran out: %q %v", first, err)
	}
	if n := len(sessionsCreated(e.mock)); n != 1 {
		t.Fatalf("%d Checkout Sessions after taking the claim over, want 1", n)
	}
	b, err := pay.GetPaymentRecord(ctx, payments.KindCheckoutOpen, "geo/alice")
	var rec struct {
		SessionID string `json:"sessionId"`
		Claim     string `json:"claim"`
	}
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.SessionID == "" || rec.Claim != "" {
		t.Fatalf("the open session record: %s %v", b, err)
	}
	// Open: the next click goes back to it.
	e.mock.Answer("/v1/checkout/sessions/"+rec.SessionID, map[string]any{"status": "open", "expires_at": e.clock.Now().Add(time.Hour).Unix()})
	if again, err := s.StartSubscriptionCheckout(ctx, checkoutFor); err != nil || again != first || len(sessionsCreated(e.mock)) != 1 {
		t.Fatalf("a click while the session is open: %q %v, %d sessions; want %q and no new one", again, err, len(sessionsCreated(e.mock)), first)
	}
	// Expired at Stripe: a new session, once, however many click.
	e.mock.Answer("/v1/checkout/sessions/"+rec.SessionID, map[string]any{"status": "expired"})
	slowCheckouts(e.mock, 300*time.Millisecond)
	urls, errs := clickAtOnce(4, s)
	for i := range urls {
		if errs[i] != nil || urls[i] == "" {
			t.Errorf("click %d after the session expired: %q %v", i, urls[i], errs[i])
		}
	}
	if n := len(sessionsCreated(e.mock)); n != 2 {
		t.Fatalf("%d Checkout Sessions after the first expired and 4 clicks, want 2", n)
	}
	// Open but about to expire: replaced, and expired at Stripe so that
	// only the new one can be paid.
	e.mock.Fail(nil)
	b, err = pay.GetPaymentRecord(ctx, payments.KindCheckoutOpen, "geo/alice")
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.SessionID == "" {
		t.Fatalf("the open session record: %s %v", b, err)
	}
	e.mock.Answer("/v1/checkout/sessions/"+rec.SessionID, map[string]any{"status": "open", "expires_at": e.clock.Now().Add(30 * time.Second).Unix()})
	if url, err := s.StartSubscriptionCheckout(ctx, checkoutFor); err != nil || url == "" {
		t.Fatalf("a click as the session expires: %q %v", url, err)
	}
	if n := len(sessionsCreated(e.mock)); n != 3 {
		t.Fatalf("%d Checkout Sessions after one about to expire, want 3", n)
	}
	if ex := e.mock.Requests("/v1/checkout/sessions/" + rec.SessionID + "/expire"); len(ex) != 1 || ex[0].Method != http.MethodPost {
		t.Fatalf("the replaced session was expired at Stripe by %+v, want one POST", ex)
	}
}

// TestSecondLiveSubscriptionIsReported: a user who paid two Checkout
// Sessions of one service (one opened before the gateway kept them to
// one) has two live Stripe subscriptions, and pays both. The gateway
// subscription follows the newer; the operator is warned, naming both
// Stripe subscriptions, so one is cancelled and refunded in Stripe.
func TestSecondLiveSubscriptionIsReported(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	e.customer("alice", "cus_alice")
	rec, _ := json.Marshal(payments.CustomerRecord{UserID: "alice", CustomerID: "cus_alice", CreatedAt: e.clock.Now()})
	if _, err := store.Payments(st).InsertPaymentRecord(context.Background(), payments.KindCustomerUser, "cus_alice", rec, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	cfg := e.config()
	if err := cfg.Validate(e.cat); err != nil {
		t.Fatal(err)
	}
	svc, err := payments.New(cfg, payments.Deps{Store: func() store.Store { return st }, Catalog: e.cat,
		Now: e.clock.Now, NodeID: "node-a", Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(svc.ServeWebhook))
	t.Cleanup(srv.Close)
	t0 := e.clock.Now().Add(-time.Minute).Truncate(time.Second)
	for i, id := range []string{"sub_first", "sub_second"} {
		sub := map[string]any{"id": id, "object": "subscription", "customer": "cus_alice", "status": "active",
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_" + id, "object": "subscription_item",
				"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": t0.Add(720 * time.Hour).Unix()}}}}
		ev := stripetest.Event("evt_"+id, "customer.subscription.created", t0.Add(time.Duration(i)*time.Second), sub)
		if status, body := stripetest.Deliver(t, srv.URL, ev, "whsec_meters", time.Now()); status != 200 {
			t.Fatalf("%s created: %d %s", id, status, body)
		}
	}
	warned := logs.FilterLevelExact(zapcore.WarnLevel).All()
	found := false
	for _, w := range warned {
		f := w.ContextMap()
		if f["subscription"] == "sub_second" && f["other_subscription"] == "sub_first" && f["user_id"] == "alice" && f["service_id"] == "geo" {
			found = true
			for k, v := range f {
				if s, ok := v.(string); ok && (strings.Contains(s, "sk_test") || strings.Contains(s, "whsec")) {
					t.Errorf("the warning's %s holds a secret: %q", k, s)
				}
			}
		}
	}
	if !found {
		t.Fatalf("no warning naming both live Stripe subscriptions of alice's geo; warnings: %+v", warned)
	}
}

// TestCheckoutClaimOfASkewedNode: a claim's time is written by the
// clock of the node that made it, and the clocks of a fleet's nodes can
// be far apart. A dead node whose clock ran an hour ahead left a claim
// that seemed to be made in the future: the user could open no Checkout
// for an hour. A live node whose clock runs an hour behind makes claims
// that seem an hour old: another node took them over at once, while
// their sessions were being made (two sessions created, one expired,
// the first click answered "busy"). A claim is now taken over only by a
// node that has itself seen it unchanged for 30 s of its own clock.
func TestCheckoutClaimOfASkewedNode(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	e.customer("alice", "cus_alice")
	e.customer("bob", "cus_bob")
	s := e.service("node-a")
	ctx := context.Background()
	pay := store.Payments(st)
	claimOf := func(user, token string, at time.Time) {
		t.Helper()
		claim, _ := json.Marshal(map[string]any{"productId": "pro", "claim": token, "claimedAt": at})
		if _, err := pay.InsertPaymentRecord(ctx, payments.KindCheckoutOpen, "geo/"+user, claim, e.clock.Now()); err != nil {
			t.Fatal(err)
		}
	}

	// A dead node an hour ahead.
	claimOf("alice", "node-b-dead-ahead", e.clock.Now().Add(time.Hour))
	if url, err := s.StartSubscriptionCheckout(ctx, checkoutFor); !errors.Is(err, payments.ErrCheckoutBusy) {
		t.Fatalf("a click while another node's claim is fresh: %q %v, want ErrCheckoutBusy", url, err)
	}
	e.clock.Add(31 * time.Second)
	if url, err := s.StartSubscriptionCheckout(ctx, checkoutFor); err != nil || url == "" {
		t.Fatalf("a click 31 s after the first saw the claim of a dead node whose clock ran an hour ahead: %q %v; want its claim taken over", url, err)
	}
	if n := len(sessionsCreated(e.mock)); n != 1 {
		t.Fatalf("%d Checkout Sessions after taking the claim over, want 1", n)
	}

	// A live node an hour behind, making bob's session right now.
	claimOf("bob", "node-c-live-behind", e.clock.Now().Add(-time.Hour))
	bob := checkoutFor
	bob.UserID = "bob"
	if url, err := s.StartSubscriptionCheckout(ctx, bob); !errors.Is(err, payments.ErrCheckoutBusy) {
		t.Errorf("a click while a node whose clock runs an hour behind holds a fresh claim: %q %v, want ErrCheckoutBusy", url, err)
	}
	if n := len(sessionsCreated(e.mock)); n != 1 {
		t.Errorf("%d Checkout Sessions: a fresh claim of a node whose clock runs behind was taken over", n)
	}
}
