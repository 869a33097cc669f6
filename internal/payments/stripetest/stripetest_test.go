package stripetest_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
)

// The harness itself: stripe-mock answers stripe-go through the recording
// proxy, the proxy records what passed and fails what it is told to, and
// a signed event verifies with stripe-go's own webhook code.
func TestMockRecordsAndFails(t *testing.T) {
	m := stripetest.Start(t)
	sc := payments.NewStripeClient("sk_test_123", m.URL)
	ctx := context.Background()
	params := &stripe.CustomerCreateParams{Email: stripe.String("ada@example.com")}
	params.SetIdempotencyKey("customer-ada")
	if _, err := sc.V1Customers.Create(ctx, params); err != nil {
		t.Fatalf("create customer through the proxy: %v", err)
	}
	got := m.Requests("/v1/customers")
	if len(got) != 1 || got[0].Method != http.MethodPost || got[0].Form.Get("email") != "ada@example.com" ||
		got[0].IdempotencyKey != "customer-ada" || got[0].Status != http.StatusOK {
		t.Fatalf("recorded %+v", got)
	}
	m.Fail(func(r stripetest.Request) int { return http.StatusBadRequest })
	if _, err := sc.V1Customers.Retrieve(ctx, "cus_1", nil); err == nil {
		t.Fatal("an injected failure reached the client as success")
	}
	m.Fail(nil)
	if _, err := sc.V1Customers.Retrieve(ctx, "cus_1", nil); err != nil {
		t.Fatalf("after failures stop: %v", err)
	}
}

func TestSignVerifiesWithStripeGo(t *testing.T) {
	const secret = "whsec_test"
	now := time.Now()
	payload := stripetest.Event("evt_1", "invoice.paid", now, map[string]any{"id": "in_1", "object": "invoice"})
	header := stripetest.Sign(payload, secret, now)
	ev, err := webhook.ConstructEventWithOptions(payload, header, secret, webhook.ConstructEventOptions{IgnoreAPIVersionMismatch: true})
	if err != nil || ev.ID != "evt_1" || ev.Type != "invoice.paid" {
		t.Fatalf("event %+v, err %v", ev, err)
	}
	if _, err := webhook.ConstructEventWithOptions(payload, stripetest.Sign(payload, "whsec_other", now), secret,
		webhook.ConstructEventOptions{IgnoreAPIVersionMismatch: true}); err == nil {
		t.Fatal("a payload signed with another secret verified")
	}
}
