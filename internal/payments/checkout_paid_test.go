package payments_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// paidCheckout is alice's first Checkout of geo's pro, opened by a
// click, and what Stripe says of it once she paid it: stripe-mock keeps
// no state, so its answers to the reads of the session and of the
// subscription it made are set (stripetest.Mock.Answer) to a session
// `complete` and a subscription `active`, as Stripe answers between the
// payment and its webhooks.
type paidCheckout struct {
	e       *meterEnv
	session string
	t0      time.Time // when Stripe made the session
}

const paidSub = "sub_paid_checkout"

func newPaidCheckout(t *testing.T, e *meterEnv, s *payments.Service) *paidCheckout {
	t.Helper()
	e.customer("alice", "cus_alice")
	rec, _ := json.Marshal(payments.CustomerRecord{UserID: "alice", CustomerID: "cus_alice", CreatedAt: e.clock.Now()})
	if _, err := e.st.(store.Payments).InsertPaymentRecord(context.Background(), payments.KindCustomerUser, "cus_alice", rec, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if url, err := s.StartSubscriptionCheckout(context.Background(), checkoutFor); err != nil || url == "" {
		t.Fatalf("the first click: %q %v", url, err)
	}
	b, err := e.st.(store.Payments).GetPaymentRecord(context.Background(), payments.KindCheckoutOpen, "geo/alice")
	var open struct {
		SessionID string `json:"sessionId"`
	}
	if err != nil || json.Unmarshal(b, &open) != nil || open.SessionID == "" {
		t.Fatalf("the open session record: %s %v", b, err)
	}
	p := &paidCheckout{e: e, session: open.SessionID, t0: e.clock.Now().Add(-2 * time.Minute).Truncate(time.Second)}
	e.mock.Answer("/v1/checkout/sessions/"+p.session, p.sessionObject("paid"))
	e.mock.Answer("/v1/subscriptions/"+paidSub, p.subscriptionObject("active"))
	return p
}

func (p *paidCheckout) sessionObject(paymentStatus string) map[string]any {
	return map[string]any{"id": p.session, "object": "checkout.session", "mode": "subscription", "status": "complete",
		"payment_status": paymentStatus, "customer": "cus_alice", "subscription": paidSub, "client_reference_id": "alice",
		"created": p.t0.Unix(), "expires_at": p.t0.Add(24 * time.Hour).Unix(),
		"metadata": map[string]string{payments.MetaUser: "alice", payments.MetaService: "geo", payments.MetaProduct: "pro"}}
}

func (p *paidCheckout) subscriptionObject(status string) map[string]any {
	start := p.t0.Add(time.Minute)
	return map[string]any{"id": paidSub, "object": "subscription", "customer": "cus_alice", "status": status,
		"created": start.Unix(), "start_date": start.Unix(), "billing_cycle_anchor": start.Unix(),
		"cancel_at_period_end": false, "cancel_at": nil, "trial_end": nil,
		"metadata": map[string]string{payments.MetaUser: "alice", payments.MetaService: "geo", payments.MetaProduct: "pro"},
		"items": map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_paid", "object": "subscription_item",
			"price":                map[string]any{"id": "price_pro", "object": "price", "recurring": map[string]any{"interval": "month", "interval_count": 1}},
			"current_period_start": start.Unix(), "current_period_end": start.AddDate(0, 1, 0).Unix()}}}}
}

// gateway is alice's gateway subscription to geo (zero if none).
func (p *paidCheckout) gateway(t *testing.T) store.Subscription {
	t.Helper()
	sub, err := p.e.st.GetSubscription(context.Background(), "alice", "geo")
	if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrNoAccount) {
		t.Fatal(err)
	}
	return sub
}

// deliverWebhooks sends Stripe's two events of the paid Checkout, as
// they arrive after the clicks, and checks they change nothing.
func (p *paidCheckout) deliverWebhooks(t *testing.T, s *payments.Service) {
	t.Helper()
	before := p.gateway(t)
	srv := httptest.NewServer(http.HandlerFunc(s.ServeWebhook))
	defer srv.Close()
	for _, ev := range [][]byte{
		stripetest.Event("evt_paid_cs", "checkout.session.completed", p.t0.Add(time.Minute), p.sessionObject("paid")),
		stripetest.Event("evt_paid_sub", "customer.subscription.created", p.t0.Add(time.Minute), p.subscriptionObject("active")),
	} {
		if status, body := stripetest.Deliver(t, srv.URL, ev, "whsec_meters", time.Now()); status != 200 || strings.Contains(body, "ignored") {
			t.Fatalf("the webhook after the click applied the Checkout: %d %s", status, body)
		}
	}
	after := p.gateway(t)
	if after.Revision != before.Revision || after.ProductID != "pro" || after.Status != "ACTIVE" {
		t.Fatalf("the webhooks after the click changed the gateway subscription: %+v -> %+v, want it as the click applied it", before, after)
	}
}

// TestCheckoutPaidBeforeItsWebhook: alice paid her Checkout (Stripe says
// the session is complete) and, before Stripe's webhooks reached the
// gateway, clicked Subscribe again (the plans page from the menu, a
// second tab, her phone). The gateway took a session Stripe no longer
// says is open for one to replace, and opened a second Checkout she could
// pay: a second Stripe subscription and a second charge for one gateway
// subscription. The click now applies the paid session, as its webhooks
// would, creates nothing, and the webhooks arriving after it change
// nothing.
func TestCheckoutPaidBeforeItsWebhook(t *testing.T) {
	for _, payment := range []string{"paid", "no_payment_required", "unpaid"} {
		t.Run(payment, func(t *testing.T) {
			st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
			t.Cleanup(func() { _ = st.Close() })
			e := newMeterEnv(t, st)
			s := e.service("node-a")
			p := newPaidCheckout(t, e, s)
			status := "active"
			if payment == "unpaid" {
				// An asynchronous payment (a bank debit) still on its
				// way: the subscription is made, its first invoice not
				// yet paid.
				status = "incomplete"
			}
			e.mock.Answer("/v1/checkout/sessions/"+p.session, p.sessionObject(payment))
			e.mock.Answer("/v1/subscriptions/"+paidSub, p.subscriptionObject(status))
			url, err := s.StartSubscriptionCheckout(context.Background(), checkoutFor)
			if n := len(sessionsCreated(e.mock)); n != 1 {
				t.Fatalf("a click after the Checkout was paid (%s) and before its webhook: %q %v, and %d Checkout Sessions at Stripe; want 1: a second one is a second subscription and a second charge", payment, url, err, n)
			}
			if payment == "unpaid" {
				if !errors.Is(err, payments.ErrCheckoutConfirming) || url != "" {
					t.Fatalf("a click while the paid Checkout's payment is on its way: %q %v, want ErrCheckoutConfirming", url, err)
				}
				if g := p.gateway(t); g.ProductID != "" {
					t.Fatalf("a payment on its way gave a plan: %+v", g)
				}
				return
			}
			if !errors.Is(err, payments.ErrCheckoutPaid) || url != "" {
				t.Fatalf("a click after the Checkout was paid: %q %v, want ErrCheckoutPaid", url, err)
			}
			if g := p.gateway(t); g.ProductID != "pro" || g.Status != "ACTIVE" {
				t.Fatalf("the paid Checkout was not applied by the click: the gateway subscription is %+v, want pro ACTIVE", g)
			}
			// Clicked again: the same answer, nothing made, nothing
			// written again.
			rev := p.gateway(t).Revision
			if url, err := s.StartSubscriptionCheckout(context.Background(), checkoutFor); !errors.Is(err, payments.ErrCheckoutPaid) || url != "" ||
				len(sessionsCreated(e.mock)) != 1 || p.gateway(t).Revision != rev {
				t.Fatalf("a second click after the paid Checkout was applied: %q %v, %d sessions", url, err, len(sessionsCreated(e.mock)))
			}
			p.deliverWebhooks(t, s)
			// Once the subscription ended (cancelled at Stripe, its
			// event applied), a click opens a new Checkout.
			e.mock.Answer("/v1/subscriptions/"+paidSub, p.subscriptionObject("canceled"))
			srv := httptest.NewServer(http.HandlerFunc(s.ServeWebhook))
			defer srv.Close()
			ev := stripetest.Event("evt_paid_del", "customer.subscription.deleted", p.t0.Add(time.Hour), p.subscriptionObject("canceled"))
			if status, body := stripetest.Deliver(t, srv.URL, ev, "whsec_meters", time.Now()); status != 200 {
				t.Fatalf("the cancellation: %d %s", status, body)
			}
			if url, err := s.StartSubscriptionCheckout(context.Background(), checkoutFor); err != nil || url == "" || len(sessionsCreated(e.mock)) != 2 {
				t.Fatalf("a click after the paid subscription ended: %q %v, %d sessions; want a new one", url, err, len(sessionsCreated(e.mock)))
			}
		})
	}
}

// TestCheckoutPaidStripeUnreachable: the paid session cannot be applied
// (Stripe does not answer the read of its subscription): the click is
// told the payment is being confirmed, and nothing is created.
func TestCheckoutPaidStripeUnreachable(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	s := e.service("node-a")
	p := newPaidCheckout(t, e, s)
	e.mock.Fail(func(r stripetest.Request) int {
		if r.Method == http.MethodGet && strings.HasPrefix(r.Path, "/v1/subscriptions/") {
			return http.StatusBadRequest
		}
		return 0
	})
	url, err := s.StartSubscriptionCheckout(context.Background(), checkoutFor)
	if !errors.Is(err, payments.ErrCheckoutConfirming) || url != "" || len(sessionsCreated(e.mock)) != 1 {
		t.Fatalf("a click after the Checkout was paid, Stripe unreachable: %q %v, %d sessions; want ErrCheckoutConfirming and no new one", url, err, len(sessionsCreated(e.mock)))
	}
	if g := p.gateway(t); g.ProductID != "" {
		t.Fatalf("a Checkout not confirmed gave a plan: %+v", g)
	}
	// Stripe back: the next click applies it.
	e.mock.Fail(nil)
	if url, err := s.StartSubscriptionCheckout(context.Background(), checkoutFor); !errors.Is(err, payments.ErrCheckoutPaid) || url != "" || len(sessionsCreated(e.mock)) != 1 {
		t.Fatalf("a click once Stripe answers: %q %v", url, err)
	}
	if g := p.gateway(t); g.ProductID != "pro" || g.Status != "ACTIVE" {
		t.Fatalf("the gateway subscription after the paid Checkout was applied: %+v", g)
	}
	p.deliverWebhooks(t, s)
}

// TestCheckoutPaidAcrossNodes: clicks on two nodes of a fleet (one
// PostgreSQL database) at once after the Checkout was paid apply it once
// (the gateway subscription written once) and create nothing.
func TestCheckoutPaidAcrossNodes(t *testing.T) {
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
	s1, s2 := e.service("n1"), e2.service("n2")
	p := newPaidCheckout(t, e, s1)
	urls, errs := clickAtOnce(6, s1, s2)
	for i := range urls {
		if !errors.Is(errs[i], payments.ErrCheckoutPaid) || urls[i] != "" {
			t.Errorf("click %d after the Checkout was paid: %q %v, want ErrCheckoutPaid", i, urls[i], errs[i])
		}
	}
	if n := len(sessionsCreated(e.mock)); n != 1 {
		t.Fatalf("%d Checkout Sessions at Stripe after clicks on two nodes, want 1", n)
	}
	g := p.gateway(t)
	if g.ProductID != "pro" || g.Status != "ACTIVE" || g.Revision != 1 {
		t.Fatalf("the gateway subscription after clicks on two nodes: %+v (revision %d), want pro ACTIVE written once", g, g.Revision)
	}
	p.deliverWebhooks(t, s2)
}
