package payments_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
)

// TestRaceKeepsAnOldRecordsTrialEnd: as TestRaceKeepsTheTrialsEnd, but
// the newer trial was applied by a node of the version before records
// kept trial_end (a fleet half-way through an upgrade): it set the
// gateway subscription TRIAL ending past_due_grace after the trial's end
// and wrote the record without it. Node a, whose older activation lost
// the record's swap, puts the record's state back; a trialing record
// without its end must not become a TRIAL with no end (the caller kept
// the plan free until some later event came): the trial's end is read
// from Stripe. While Stripe cannot be read the event fails (500) and
// nothing of a trial without an end is written; Stripe's retry of the
// same event, once Stripe answers, puts the trial back with its end.
func TestRaceKeepsAnOldRecordsTrialEnd(t *testing.T) {
	bolt := raceCustomer(t)
	ctx := context.Background()
	mock := stripetest.Start(t)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	trialEnd := t0.Add(14 * 24 * time.Hour)
	want := trialEnd.Add(payments.DefaultPastDueGrace)
	items := map[string]any{"object": "list", "data": []any{map[string]any{"id": "si_race", "object": "subscription_item",
		"price": map[string]any{"id": "price_pro", "object": "price"}, "current_period_end": t0.Add(720 * time.Hour).Unix()}}}
	mock.Answer("/v1/subscriptions/sub_race", map[string]any{"id": "sub_race", "customer": "cus_race", "status": "trialing",
		"trial_end": trialEnd.Unix(), "items": items})
	event := func(id, status string, created, trialEnd time.Time) []byte {
		sub := map[string]any{"id": "sub_race", "object": "subscription", "customer": "cus_race", "status": status, "items": items}
		if !trialEnd.IsZero() {
			sub["trial_end"] = trialEnd.Unix()
		}
		return stripetest.Event(id, "customer.subscription.updated", created, sub)
	}
	// Node b, of the version before: its trial given again (to
	// trialEnd), applied in the middle of node a's handling.
	oldNode := func() {
		now := time.Now().UTC()
		if _, err := bolt.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "geo", ProductID: "pro",
			Status: "TRIAL", UpdatedAt: now, EndsAt: want, EndStatus: "EXPIRED"}); err != nil {
			t.Error(err)
			return
		}
		b, err := bolt.GetPaymentRecord(ctx, payments.KindSubscription, "sub_race")
		var rec payments.SubscriptionRecord
		if err != nil || json.Unmarshal(b, &rec) != nil {
			t.Errorf("the record: %s %v", b, err)
			return
		}
		rec.StripeStatus, rec.Status, rec.TrialEnd = "trialing", "TRIAL", time.Time{} // not kept then
		rec.EventCreated, rec.UpdatedAt, rec.Seq = t0.Add(2*time.Second), now, rec.Seq+1
		nb, _ := json.Marshal(rec)
		if strings.Contains(string(nb), "trialEnd") {
			t.Fatalf("the old version's record has a trialEnd: %s", nb)
		}
		if err := bolt.SwapPaymentRecord(ctx, payments.KindSubscription, "sub_race", b, nb, now); err != nil {
			t.Error(err)
		}
	}
	st := &otherNodeMidway{payStore: bolt, kind: payments.KindSubscription, id: "sub_race", other: oldNode}
	nodeA := httptest.NewServer(http.HandlerFunc(raceService(t, st, mock.URL, "node-a", 0).ServeWebhook))
	t.Cleanup(nodeA.Close)
	deliver := func(url string, ev []byte) (int, string) {
		return stripetest.Deliver(t, url, ev, "whsec_race", time.Now())
	}
	if status, body := deliver(subRaceNode(t, bolt, "node-c", 0).URL, event("evt_first_trial", "trialing", t0, t0.Add(7*24*time.Hour))); status != 200 {
		t.Fatalf("the first trial: %d %s", status, body)
	}

	// Stripe cannot be read: the event fails, and no trial without an
	// end is written.
	mock.Fail(func(r stripetest.Request) int {
		if r.Method == http.MethodGet && r.Path == "/v1/subscriptions/sub_race" {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	paid := event("evt_paid_early", "active", t0.Add(time.Second), time.Time{})
	if status, body := deliver(nodeA.URL, paid); status != http.StatusInternalServerError {
		t.Errorf("the older activation lost to an old record's trial while Stripe cannot be read: %d %s; want 500 (Stripe retries)", status, body)
	}
	if sub, err := bolt.GetSubscription(ctx, "u1", "geo"); err != nil || sub.Status == "TRIAL" && sub.EndsAt.IsZero() {
		t.Errorf("the gateway subscription while Stripe cannot be read: %s %s ends %v (%v); a trial without an end", sub.ProductID, sub.Status, sub.EndsAt, err)
	}

	// Stripe answers again; its retry of the event puts the trial back
	// with its end.
	mock.Fail(nil)
	if status, body := deliver(nodeA.URL, paid); status != 200 {
		t.Errorf("Stripe's retry of the activation: %d %s", status, body)
	}
	sub, err := bolt.GetSubscription(ctx, "u1", "geo")
	if err != nil || sub.Status != "TRIAL" || !sub.EndsAt.Equal(want) {
		t.Errorf("the gateway subscription after an older activation and an old node's newer trial at once: %s %s ends %v (%v); want TRIAL ending %v",
			sub.ProductID, sub.Status, sub.EndsAt, err, want)
	}
	rb, err := bolt.GetPaymentRecord(ctx, payments.KindSubscription, "sub_race")
	var rec payments.SubscriptionRecord
	if err != nil || json.Unmarshal(rb, &rec) != nil || rec.StripeStatus != "trialing" || !rec.TrialEnd.Equal(trialEnd) {
		t.Errorf("the record: %s %v; want trialing, its trial's end read from Stripe", rb, err)
	}
}
