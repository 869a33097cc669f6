package payments_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
)

// TestTwoLiveHandOverToAnOldTrialReadsItsEnd: the newer of two live
// Stripe subscriptions holds the gateway subscription; the older one,
// kept out, is trialing, and its record was written by a gateway from
// before records kept trial_end. The holder is deleted: the hand-over
// to the trialing one must not make a TRIAL with no end (free for good),
// and did nothing at all: the caller, whose trial Stripe runs, had no
// access until that subscription's next event, up to the trial's end.
// The hand-over now reads the trial's end from Stripe (kept in the
// record); while Stripe cannot be read the deletion fails (500), nothing
// of a trial without an end is written, and Stripe's retry of it hands
// over.
func TestTwoLiveHandOverToAnOldTrialReadsItsEnd(t *testing.T) {
	twoLiveStores(t, func(t *testing.T, open func(t *testing.T) payStore) {
		ctx := context.Background()
		st := open(t)
		mock := stripetest.Start(t)
		e := newTwoLive(t, st)
		e.url = twoLiveNodeAPI(t, st, "node-a", mock.URL)
		trialEnd := time.Now().Add(7 * 24 * time.Hour).Truncate(time.Second)
		trialing := func(obj map[string]any) { obj["trial_end"] = trialEnd.Unix() }
		mock.Answer("/v1/subscriptions/sub_old", map[string]any{"id": "sub_old", "customer": "cus_race", "status": "trialing",
			"trial_end": trialEnd.Unix()})
		e.send("created", "sub_old", "trialing", trialing)
		e.send("created", "sub_new", "active")
		e.send("updated", "sub_old", "trialing", trialing)
		if h := e.holder(); h != "sub_new" {
			t.Fatalf("the link names %s, want sub_new", h)
		}
		// sub_old's record as a gateway from before trial_end was kept
		// wrote it.
		b, err := st.GetPaymentRecord(ctx, payments.KindSubscription, "sub_old")
		var rec payments.SubscriptionRecord
		if err != nil || json.Unmarshal(b, &rec) != nil || rec.StripeStatus != "trialing" {
			t.Fatalf("sub_old's record: %s %v", b, err)
		}
		rec.TrialEnd, rec.Seq = time.Time{}, rec.Seq+1
		nb, _ := json.Marshal(rec)
		if err := st.SwapPaymentRecord(ctx, payments.KindSubscription, "sub_old", b, nb, time.Now()); err != nil {
			t.Fatal(err)
		}

		// Stripe cannot be read: the deletion fails, its own end stands,
		// and no trial without an end is written.
		mock.Fail(func(r stripetest.Request) int {
			if r.Method == http.MethodGet && r.Path == "/v1/subscriptions/sub_old" {
				return http.StatusServiceUnavailable
			}
			return 0
		})
		deleted := e.event("deleted", "sub_new", "canceled")
		if status, body := stripetest.Deliver(t, e.url, deleted, "whsec_race", time.Now()); status != http.StatusInternalServerError {
			t.Errorf("the holder's deletion while Stripe cannot be read: %d %s; want 500 (Stripe retries)", status, body)
		}
		if got := e.gateway(); got.Status == "TRIAL" && got.EndsAt.IsZero() {
			t.Errorf("the gateway subscription while Stripe cannot be read: %s %s, a trial without an end", got.ProductID, got.Status)
		}

		// Stripe answers again; its retry of the deletion hands over.
		mock.Fail(nil)
		if status, body := stripetest.Deliver(t, e.url, deleted, "whsec_race", time.Now()); status != 200 {
			t.Errorf("Stripe's retry of the deletion: %d %s", status, body)
		}
		want := trialEnd.Add(payments.DefaultPastDueGrace)
		if got := e.gateway(); got.ProductID != "pro" || got.Status != "TRIAL" || !got.EndsAt.Equal(want) || got.EndStatus != "EXPIRED" {
			t.Errorf("after the holder's deletion: %s %s ends %v %s; want pro TRIAL ending %v EXPIRED (sub_old's trial)",
				got.ProductID, got.Status, got.EndsAt, got.EndStatus, want)
		}
		if h := e.holder(); h != "sub_old" {
			t.Errorf("the link names %s, want sub_old", h)
		}
		if r := e.record("sub_old"); !r.TrialEnd.Equal(trialEnd) {
			t.Errorf("sub_old's record keeps trial end %v, want %v (read from Stripe)", r.TrialEnd, trialEnd)
		}
	})
}

// twoLiveNodeAPI is twoLiveNode with Stripe's API at api.
func twoLiveNodeAPI(t *testing.T, st store.Store, node, api string) string {
	t.Helper()
	_, url := twoLiveServiceAPI(t, st, node, api, nil)
	return url
}
