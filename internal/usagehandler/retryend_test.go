package usagehandler

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// TestEstimateRetryAfterStopsAtSubscriptionEnd: a denied estimate
// (quota_exceeded) says when to retry: the end of the billing period,
// never earlier (docs/wire-contract.md). When the subscription ends
// first (a cancellation, a trial's end, an end the operator set) the
// message says so too, since a retry from then on is refused as
// subscription_inactive.
func TestEstimateRetryAfterStopsAtSubscriptionEnd(t *testing.T) {
	f := newFlightServer(t)
	ctx := context.Background()
	k, hash, err := servicekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.st.CreateKey(ctx, store.KeyRecord{ID: "key_leaving", Hash: hash, UserID: "leaving", Created: f.at}); err != nil {
		t.Fatal(err)
	}
	ends := f.at.Add(2 * time.Hour)
	if _, err := f.st.PutSubscription(ctx, store.Subscription{UserID: "leaving", ServiceID: "svc", ProductID: "basic",
		Status: "CANCELLING", StartedAt: f.at.Add(-time.Hour), UpdatedAt: f.at, EndsAt: ends, EndStatus: "CANCELLED"}); err != nil {
		t.Fatal(err)
	}
	// The quota of 10 is used up.
	if a := f.post("/api/usage/report", `{"userId":"leaving","serviceId":"svc","unitsUsed":10,"timestamp":1772366400}`, flightSecret); a.status != 200 {
		t.Fatalf("report: %d %s", a.status, a.body)
	}
	for _, tc := range []struct {
		path, body, secret string
		header             []string
	}{
		{"/api/v1/service-keys/estimate-usage", `{"serviceKey":"` + k + `","serviceId":"svc","estimatedUnits":1}`, flightSecret, nil},
		{"/api/v1/billing/usage/estimate", `{"userId":"leaving","serviceId":"svc","estimatedUnits":1}`, "", []string{"Authorization", "Bearer " + k}},
	} {
		a := f.post(tc.path, tc.body, tc.secret, tc.header...)
		var e struct {
			Code       string
			Message    string
			RetryAfter int
		}
		json.Unmarshal([]byte(a.body), &e)
		toEnd := int(ends.Sub(f.at) / time.Second)
		if a.status != 429 || e.Code != "quota_exceeded" || e.RetryAfter <= toEnd || a.header.Get("Retry-After") != strconv.Itoa(e.RetryAfter) {
			t.Errorf("%s: %d Retry-After %q %s, want 429 quota_exceeded with retryAfter the period's reset, past the subscription's end (%d s)",
				tc.path, a.status, a.header.Get("Retry-After"), a.body, toEnd)
		}
		if !strings.HasSuffix(e.Message, "the subscription ends before then, at "+ends.Format(time.RFC3339)) {
			t.Errorf("%s: message %q, want it to end with the subscription's end", tc.path, e.Message)
		}
	}
}
