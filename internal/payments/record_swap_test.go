package payments_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// otherNodeStore is a real store on which another node's change of one
// record lands right after each of this node's first reads of it: the
// interleaving of two nodes' read-change-writes of one invoice record,
// made certain instead of left to timing (TestFleetInvoiceMoneyBackAtOnce
// runs it for real on two processes).
type otherNodeStore struct {
	*boltstore.Store
	kind, id string
	changes  []func(map[string]any) // the other node's, one a read

	mu    sync.Mutex
	reads int
}

func (s *otherNodeStore) GetPaymentRecord(ctx context.Context, kind, id string) ([]byte, error) {
	b, err := s.Store.GetPaymentRecord(ctx, kind, id)
	if err != nil || kind != s.kind || id != s.id {
		return b, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reads < len(s.changes) {
		var r map[string]any
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, err
		}
		s.changes[s.reads](r)
		nb, _ := json.Marshal(r)
		if err := s.Store.PutPaymentRecord(ctx, kind, id, nb, time.Now()); err != nil {
			return nil, err
		}
	}
	s.reads++
	return b, nil
}

// TestInvoiceMoneyBackKeepsAnotherNodesChange: a refund of a kept
// invoice's charge whose node reads the record just before another node
// writes it (a lost dispute of the same charge) keeps the other's change:
// the refund is made on the record as the other left it. The old gateway
// put its record back over the other's, and the dispute was lost.
func TestInvoiceMoneyBackKeepsAnotherNodesChange(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	st := &otherNodeStore{Store: bolt, kind: payments.KindInvoice, id: "in_race", changes: []func(map[string]any){
		func(r map[string]any) { r["hostedUrl"] = "https://invoice.example/in_race" },
		func(r map[string]any) { r["disputed"] = 900 },
	}}
	srv := raceWebhook(t, st)

	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	rec, _ := json.Marshal(payments.InvoiceRecord{ID: "in_race", UserID: "u1", ServiceID: "geo", ProductID: "pro",
		CustomerID: "cus_race", Status: "paid", AmountDue: 2900, AmountPaid: 2900, Currency: "USD", PaidAt: t0, UpdatedAt: t0})
	if _, err := bolt.InsertPaymentRecord(context.Background(), payments.KindInvoice, "in_race", rec, t0); err != nil {
		t.Fatal(err)
	}
	ch := map[string]any{"id": "ch_race", "object": "charge", "amount": 2900, "currency": "usd", "payment_intent": "pi_race",
		"invoice": "in_race", "refunds": map[string]any{"object": "list", "has_more": false, "data": []any{map[string]any{
			"id": "re_race", "object": "refund", "amount": 700, "status": "succeeded", "charge": "ch_race", "created": t0.Unix()}}}}
	if status, body := stripetest.Deliver(t, srv.URL, stripetest.Event("evt_race", "charge.refunded", t0, ch), "whsec_race", time.Now()); status != 200 {
		t.Fatalf("charge.refunded: %d %s", status, body)
	}
	b, err := bolt.GetPaymentRecord(context.Background(), payments.KindInvoice, "in_race")
	var r payments.InvoiceRecord
	if err != nil || json.Unmarshal(b, &r) != nil || r.Refunded != 700 || r.Disputed != 900 || r.HostedURL == "" || r.Status != "paid" {
		t.Fatalf("the invoice after its refund here and its lost dispute written meanwhile by another node: %s %v; want refunded 700, disputed 900, the other's hosted URL", b, err)
	}
}

// raceWebhook serves the webhook of a Service on st. Nothing here asks
// Stripe: the charges name their invoice or top-up and carry their
// refunds.
func raceWebhook(t *testing.T, st store.Store) *httptest.Server {
	t.Helper()
	cat := meterCatalog(t)
	cfg := payments.Config{Provider: "stripe", SecretKey: "sk_test_race", WebhookSecret: "whsec_race",
		APIBase: "http://127.0.0.1:9",
		Prices:  []payments.Price{{Service: "geo", Product: "pro", Price: "price_pro"}}}
	if err := cfg.Validate(cat); err != nil {
		t.Fatal(err)
	}
	svc, err := payments.New(cfg, payments.Deps{Store: func() store.Store { return st }, Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(svc.ServeWebhook))
	t.Cleanup(srv.Close)
	return srv
}

// TestTopUpRefundKeepsAnotherNodesChange: as for an invoice, a top-up's
// refund made here while another node records the lost dispute of its
// charge keeps both on the top-up record (the credits were exact
// already: each reversal is once by its id). The old gateway put the
// record back over the other's, and the dispute was lost from it.
func TestTopUpRefundKeepsAnotherNodesChange(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	ctx := context.Background()
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	if _, err := bolt.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "geo", ProductID: "pro", Status: "ACTIVE",
		StartedAt: t0.Add(-time.Hour), UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := bolt.GrantCredits(ctx, store.CreditGrant{ID: "pi_top", UserID: "u1", ServiceID: "geo", Credits: billing.Whole(10),
		GrantedAt: t0, Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(payments.TopUpRecord{ID: "pi_top", SessionID: "cs_top", UserID: "u1", ServiceID: "geo", ProductID: "pro",
		Pack: "small", Credits: billing.Whole(10).String(), Amount: 1000, Currency: "USD", PaidAt: t0, UpdatedAt: t0})
	if _, err := bolt.InsertPaymentRecord(ctx, payments.KindTopUp, "pi_top", rec, t0); err != nil {
		t.Fatal(err)
	}
	st := &otherNodeStore{Store: bolt, kind: payments.KindTopUp, id: "pi_top", changes: []func(map[string]any){
		func(r map[string]any) { r["receiptUrl"] = "https://receipt.example/pi_top" },
		func(r map[string]any) { r["disputed"] = 1000 },
	}}
	srv := raceWebhook(t, st)
	ch := map[string]any{"id": "ch_top", "object": "charge", "amount": 1000, "currency": "usd", "payment_intent": "pi_top",
		"refunds": map[string]any{"object": "list", "has_more": false, "data": []any{map[string]any{
			"id": "re_top", "object": "refund", "amount": 300, "status": "succeeded", "charge": "ch_top", "created": t0.Unix()}}}}
	if status, body := stripetest.Deliver(t, srv.URL, stripetest.Event("evt_top", "charge.refunded", t0, ch), "whsec_race", time.Now()); status != 200 {
		t.Fatalf("charge.refunded: %d %s", status, body)
	}
	b, err := bolt.GetPaymentRecord(ctx, payments.KindTopUp, "pi_top")
	var r payments.TopUpRecord
	if err != nil || json.Unmarshal(b, &r) != nil || r.Refunded != 300 || r.Disputed != 1000 || r.ReceiptURL == "" {
		t.Fatalf("the top-up after its refund here and its lost dispute written meanwhile by another node: %s %v; want refunded 300, disputed 1000, the other's receipt URL", b, err)
	}
}
