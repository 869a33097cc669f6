package payments_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// TestTopUpGrantsOnTheAdminAPI: an operator checks a prepaid balance
// against what Stripe was paid through the admin API: the grants of a
// subscription (GET …/grants), each with what refunds and disputes took
// back and what it has left, beside the balance.
func TestTopUpGrantsOnTheAdminAPI(t *testing.T) {
	e := startTopUps(t)
	e.payer("gus")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	e.mustDeliver("evt_gus_paid", "checkout.session.completed", at, paidSession("cs_gus", "pi_gus", "gus", "small", 1000))
	e.mustDeliver("evt_gus_refund", "charge.refunded", at, map[string]any{"id": "ch_gus", "object": "charge", "amount": 1000,
		"amount_refunded": 250, "currency": "usd", "payment_intent": "pi_gus", "customer": "cus_gus",
		"refunds": map[string]any{"object": "list", "data": []any{
			map[string]any{"id": "re_gus", "object": "refund", "amount": 250, "status": "succeeded", "created": at.Unix()}}}})
	e.wantBalance("gus", "75")
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://localhost:%d%s", topUpAdminPort, path))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	status, body := get("/platform/subscriptions/gus/echo/grants")
	var got struct {
		Grants []struct {
			ID, Source, Reference      string
			Credits, Reversed, Expired billing.Units
			Left                       billing.Units
			GrantedAt                  time.Time
		}
	}
	if status != http.StatusOK || json.Unmarshal(body, &got) != nil || len(got.Grants) != 1 {
		t.Fatalf("grants: %d %s", status, body)
	}
	g := got.Grants[0]
	if g.ID != "pi_gus" || g.Source != "stripe" || g.Credits != billing.Whole(100) || g.Reversed != billing.Whole(25) ||
		g.Expired != 0 || g.Left != billing.Whole(75) || !g.GrantedAt.Equal(at) || g.Reference == "" {
		t.Errorf("grant %+v, want pi_gus: 100 granted, 25 taken back, 75 left", g)
	}
	if status, body := get("/platform/subscriptions/nobody/echo/grants"); status != http.StatusNotFound {
		t.Errorf("grants of no subscription: %d %s, want 404", status, body)
	}
	e.caller("hal")
	if status, body := get("/platform/subscriptions/hal/echo/grants"); status != http.StatusOK || string(body) != "{\"grants\":[]}\n" {
		t.Errorf("grants of a subscription that bought nothing: %d %q, want 200 and none", status, body)
	}
}
