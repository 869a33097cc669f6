package platform

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestSummaryCountsCutCallsOfTheWholePeriod: the period summary of a
// time `at` shows the period that contains it, every figure the
// period's: unitsUsed, spend and the rest are its counter's, whenever
// in it they were charged. callsCutAtLimit was counted only from the
// period's start to `at`: asked about an hour before a call cut at the
// spending cap, the summary showed the cap spent and the call's 16
// tokens used, and no call cut ("callsCutAtLimit" absent), where the
// same period asked about now counted it.
func TestSummaryCountsCutCallsOfTheWholePeriod(t *testing.T) {
	env := admStartProducts(t, `,{"id": "capped", "billing_model": "USAGE_POSTPAID", "measurement_type": "PER_TOKEN", "unit_label": "token", "price": 0.5, "spending_cap": 8, "period": "day"}`)
	ctx := context.Background()
	ds := env.app.DataStore()
	now := time.Now().UTC()
	// The current daily period began two hours ago.
	start := now.Add(-26 * time.Hour)
	if _, err := ds.PutSubscription(ctx, store.Subscription{UserID: "carol", ServiceID: "weather", ProductID: "capped",
		Status: "ACTIVE", StartedAt: start, UpdatedAt: start}); err != nil {
		t.Fatal(err)
	}
	capped, _ := mustService(t, env).Product("capped")
	a := store.Account{UserID: "carol", ServiceID: "weather", Product: *capped}
	res, err := ds.Reserve(ctx, a, billing.Whole(1), now)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("hold: %v %+v", err, res.Decision)
	}
	cut, err := ds.Settle(ctx, res, billing.Whole(30), store.LedgerEntry{Time: now, UserID: "carol", ServiceID: "weather",
		ProductID: "capped", Source: store.SourceGateway})
	if err != nil || cut.Units != billing.Whole(16) || cut.UnitsClaimed != billing.Whole(30) {
		t.Fatalf("settle past the cap: %v %+v", err, cut)
	}
	for _, at := range []time.Time{now.Add(-time.Hour), now.Add(time.Minute)} {
		r := admJSON(t, "GET", fmt.Sprintf("/platform/users/carol/summary?at=%s", at.Format(time.RFC3339Nano)), "")
		var sum struct{ Subscriptions []cliPeriod }
		r.decode(t, &sum)
		if r.status != 200 || len(sum.Subscriptions) != 1 {
			t.Fatalf("summary at %s: %d %s", at, r.status, r.body)
		}
		if p := sum.Subscriptions[0]; p.UnitsUsed != "16" || p.Spend != "8" || p.CallsCutAtLimit != 1 {
			t.Errorf("summary at %s: %s; want the period's 16 tokens, spend 8 and its 1 call cut at the cap", at.Format(time.RFC3339), r.body)
		}
	}
}
