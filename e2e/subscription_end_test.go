package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// TestSubscriptionEndsAtTheCall: through the real server, a cancelled
// subscription is served up to its end and refused from it by the app's
// clock, as its end status, before any sweep has run; the sweep then
// sets the stored status, and the admin API shows the end.
func TestSubscriptionEndsAtTheCall(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	g := startGateway(t, t.TempDir(), catalogBlock(be.URL))
	key, _ := g.newKey("u-leaving")
	ends := time.Now().UTC().Add(time.Hour)
	if _, err := g.store().PutSubscription(context.Background(), store.Subscription{UserID: "u-leaving", ServiceID: "svc",
		ProductID: "big", Status: "CANCELLING", UpdatedAt: time.Now().UTC(), EndsAt: ends, EndStatus: "CANCELLED"}); err != nil {
		t.Fatal(err)
	}
	if resp, body := call(t, "POST", invokeURL("svc", "echo"), key, "{}"); resp.StatusCode != 200 {
		t.Fatalf("before the end: %d %s", resp.StatusCode, body)
	}
	g.app().SetClock(func() time.Time { return ends })
	defer g.app().SetClock(nil)
	before := be.count()
	resp, body := call(t, "POST", invokeURL("svc", "echo"), key, "{}")
	if resp.StatusCode != 403 || errorCode(t, resp, body) != "subscription_inactive" || be.count() != before {
		t.Fatalf("at the end: %d %s, want 403 subscription_inactive, not forwarded", resp.StatusCode, body)
	}
	var sub struct {
		Status    string    `json:"status"`
		EndsAt    time.Time `json:"endsAt"`
		EndStatus string    `json:"endStatus"`
	}
	url := fmt.Sprintf("http://localhost:%d/platform/subscriptions/u-leaving/svc", adminPort)
	adminGet(t, url, 200, &sub)
	if sub.Status != "CANCELLING" || !sub.EndsAt.Equal(ends) || sub.EndStatus != "CANCELLED" {
		t.Errorf("before the sweep: %+v", sub)
	}
	g.app().RunSubscriptionSweep(context.Background())
	adminGet(t, url, 200, &sub)
	if sub.Status != "CANCELLED" || !sub.EndsAt.Equal(ends) {
		t.Errorf("after the sweep: %+v, want CANCELLED with its end", sub)
	}
}
