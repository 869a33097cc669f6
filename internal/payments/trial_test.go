package payments_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// call is one call of user to service geo as the invoke path makes it:
// subscription.Resolve at the call's start, a hold, and the settle of
// one unit. It returns the decision and what the ledger row cost.
func (e *meterEnv) call(user string) (billing.Decision, billing.Units) {
	e.t.Helper()
	ctx := context.Background()
	svc, _ := e.cat.Service("geo")
	now := e.clock.Now()
	a, err := subscription.Resolve(ctx, svc, user, now, e.st.GetSubscription)
	if err != nil {
		e.t.Fatalf("resolve %s: %v", user, err)
	}
	res, err := e.st.Reserve(ctx, a.Account, billing.Whole(1), now)
	if err != nil {
		e.t.Fatal(err)
	}
	if !res.Decision.Allowed {
		return res.Decision, 0
	}
	id := fmt.Sprintf("call-%d", e.seq.Add(1))
	le, err := e.st.Settle(ctx, res, billing.Whole(1), store.LedgerEntry{ID: id, RequestID: id, Time: now, UserID: user,
		ServiceID: "geo", EndpointID: "lookup", ProductID: a.Account.Product.ID, Source: store.SourceGateway})
	if err != nil {
		e.t.Fatal(err)
	}
	return res.Decision, le.Cost
}

// TestTrialUsageIsFree: a subscription in TRIAL (Stripe's trialing, or a
// trial taken in the portal) is a free trial, as the storefront says:
// its calls cost nothing, neither the period's overage nor a postpaid
// plan's units, so nothing is in the ledger's cost, nothing reaches a
// Stripe meter (Stripe does not invoice a trial's metered usage either)
// and nothing counts as usage not invoiced yet. A quota's overage, which
// would be billed, is refused in the trial instead. Once the trial has
// converted (ACTIVE) the plan's prices apply again.
func TestTrialUsageIsFree(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	ctx := context.Background()
	trialEnd := e.clock.Now().Add(14 * 24 * time.Hour)
	for _, u := range []struct{ user, product string }{{"carol", "pro"}, {"alice", "payg"}} {
		if _, err := st.PutSubscription(ctx, store.Subscription{UserID: u.user, ServiceID: "geo", ProductID: u.product,
			Status: "TRIAL", StartedAt: e.clock.Now(), UpdatedAt: e.clock.Now(), EndsAt: trialEnd, EndStatus: "EXPIRED"}); err != nil {
			t.Fatal(err)
		}
	}
	e.customer("carol", "cus_carol")
	e.customer("alice", "cus_alice")
	s := e.service("node-a")
	ship(t, s) // the first run starts the cursor

	// carol's pro plan: 10 included, overage allowed at 0.01 when paid.
	for i := 1; i <= 12; i++ {
		d, cost := e.call("carol")
		switch {
		case i <= 10 && (!d.Allowed || cost != 0):
			t.Fatalf("trial call %d inside the quota: allowed %v, cost %s", i, d.Allowed, cost)
		case i > 10 && d.Allowed:
			t.Fatalf("trial call %d past the quota was allowed (cost %s): a free trial's overage is refused, not billed", i, cost)
		case i > 10 && d.Code != billing.CodeQuotaExceeded:
			t.Fatalf("trial call %d past the quota refused with %q, want %s", i, d.Code, billing.CodeQuotaExceeded)
		}
	}
	// alice's pay-as-you-go plan: every unit is priced when paid.
	for i := 1; i <= 5; i++ {
		if d, cost := e.call("alice"); !d.Allowed || cost != 0 {
			t.Fatalf("trial call %d of a postpaid plan: allowed %v, cost %s, want free", i, d.Allowed, cost)
		}
	}
	if c := e.ledgerCost("carol") + e.ledgerCost("alice"); c != 0 {
		t.Fatalf("the trial's calls cost %s in the ledger, want 0", c)
	}
	e.clock.Add(2 * time.Hour)
	if run := ship(t, s); run.Sent != 0 {
		t.Fatalf("the trial's usage was sent to Stripe's meters: %+v", run)
	}

	// The trial converts: the plan's prices apply from then on.
	for _, u := range []struct{ user, product string }{{"carol", "pro"}, {"alice", "payg"}} {
		if _, err := st.PutSubscription(ctx, store.Subscription{UserID: u.user, ServiceID: "geo", ProductID: u.product,
			Status: "ACTIVE", UpdatedAt: e.clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if d, cost := e.call("carol"); !d.Allowed || cost != plan.Price {
		t.Fatalf("paid call past the quota: allowed %v, cost %s, want overage at %s", d.Allowed, cost, plan.Price)
	}
	if d, cost := e.call("alice"); !d.Allowed || cost != postpaid.Price {
		t.Fatalf("paid postpaid call: allowed %v, cost %s, want %s", d.Allowed, cost, postpaid.Price)
	}
	e.clock.Add(2 * time.Hour)
	ship(t, s)
	got := sums(t, stripeSaw(t, e.mock))
	if got["cus_carol"] != int64(plan.Price) || got["cus_alice"] != int64(postpaid.Price) {
		t.Fatalf("Stripe's meters got %v, want only the paid calls: carol %d, alice %d", got, plan.Price, postpaid.Price)
	}
}
