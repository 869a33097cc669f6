package stripewebhook_test

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// trialObj is a subscription object whose item's current period is
// [start, end), as Stripe sends it (a trial's period is the trial).
func trialObj(id, customer, status string, start, end, trialEnd time.Time) map[string]any {
	o := subObj(id, customer, status, "price_pro", false, end)
	o["trial_end"] = trialEnd.Unix()
	o["billing_cycle_anchor"] = trialEnd.Unix()
	item := o["items"].(map[string]any)["data"].([]any)[0].(map[string]any)
	item["current_period_start"] = start.Unix()
	item["price"] = map[string]any{"id": "price_pro", "object": "price",
		"recurring": map[string]any{"interval": "month", "interval_count": 1}}
	return o
}

// TestTrialConvertsToAFreshPaidPeriod: the first paid period after a
// Stripe trial is the one the caller pays for, from trial_end, with the
// plan's whole quota. The gateway's periods were anchored at the
// subscription's first put and never moved, so the quota the free trial
// used counted against the paid period: a caller who used the trial's
// 1000 requests was refused (or, with overage allowed, billed) on the
// first paid day. The conversion now starts the gateway's periods at
// Stripe's current period; a later event of the same period changes
// nothing.
func TestTrialConvertsToAFreshPaidPeriod(t *testing.T) {
	g := startGateway(t, "1h")
	ctx := context.Background()
	cust := g.customer("u-conv")
	now := time.Now().Truncate(time.Second)
	trialStart, trialEnd := now.Add(-20*24*time.Hour), now.Add(-6*24*time.Hour)
	paidEnd := trialEnd.AddDate(0, 1, 0)
	g.deliver(stripetest.Event("evt_c1", "customer.subscription.created", trialStart,
		trialObj("sub_conv", cust, "trialing", trialStart, trialEnd, trialEnd)), 200)
	s, _ := g.sub("u-conv")
	if s.Status != "TRIAL" {
		t.Fatalf("after created: %+v, want TRIAL", s)
	}
	svc, _ := g.app.Catalog().Service("svc")
	pro, _ := svc.Product("pro")
	trial := subscription.TrialTerms(*pro)
	acc := store.Account{UserID: "u-conv", ServiceID: "svc", Product: trial}
	// The trial uses its whole quota.
	if _, err := g.app.DataStore().Record(ctx, acc, store.LedgerEntry{ID: "r1", RequestID: "r1", Time: now, UserID: "u-conv",
		ServiceID: "svc", EndpointID: "echo", ProductID: "pro", Units: billing.Whole(1000), Source: store.SourceReport},
		func(store.LedgerEntry, billing.State) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if st, err := g.app.DataStore().State(ctx, acc, now); err != nil || st.Used != billing.Whole(1000) {
		t.Fatalf("the trial's period: used %s, %v", st.Used, err)
	}

	// The first payment goes through: active, a period from trial_end.
	g.deliver(stripetest.Event("evt_c2", "customer.subscription.updated", trialEnd.Add(time.Minute),
		trialObj("sub_conv", cust, "active", trialEnd, paidEnd, trialEnd)), 200)
	s, _ = g.sub("u-conv")
	if s.Status != "ACTIVE" || !s.StartedAt.Equal(trialEnd) {
		t.Fatalf("after the conversion: %s, periods from %s, want ACTIVE from %s", s.Status, s.StartedAt, trialEnd)
	}
	acc.Product = *pro
	st, err := g.app.DataStore().State(ctx, acc, now)
	if err != nil || st.Used != 0 {
		t.Fatalf("the first paid period has %s of the quota used (%v): the free trial's usage counted against it", st.Used, err)
	}
	if start, end := billing.PeriodBounds(pro.Period, pro.CalendarPeriods, s.StartedAt, now); !start.Equal(trialEnd) || !end.Equal(paidEnd) {
		t.Errorf("the gateway's period is %s..%s, Stripe's %s..%s", start, end, trialEnd, paidEnd)
	}

	// A later event of the same paid period (an invoice's read-back, a
	// cancel at period end) moves nothing.
	if _, err := g.app.DataStore().Record(ctx, acc, store.LedgerEntry{ID: "r2", RequestID: "r2", Time: now, UserID: "u-conv",
		ServiceID: "svc", EndpointID: "echo", ProductID: "pro", Units: billing.Whole(7), Source: store.SourceReport},
		func(store.LedgerEntry, billing.State) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	cancelling := trialObj("sub_conv", cust, "active", trialEnd, paidEnd, trialEnd)
	cancelling["cancel_at_period_end"] = true
	g.deliver(stripetest.Event("evt_c3", "customer.subscription.updated", trialEnd.Add(time.Hour), cancelling), 200)
	s, _ = g.sub("u-conv")
	if st, _ := g.app.DataStore().State(ctx, acc, now); s.Status != "CANCELLING" || !s.StartedAt.Equal(trialEnd) || st.Used != billing.Whole(7) {
		t.Fatalf("after a later event of the same period: %s from %s, used %s; want CANCELLING from %s, 7 used", s.Status, s.StartedAt, st.Used, trialEnd)
	}
}
