package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestRefundThenLeasedCallRefused: after a full refund takes the balance
// below zero, every call must be refused (docs/payments.md, "The balance
// may go negative"). The bbolt store refuses at once; a fleet node kept
// serving calls from the credits it leased before the refund, made on
// another node. The change reaches the node by LISTEN/NOTIFY, which makes
// its leases of the subscription ask the database again.
func TestRefundThenLeasedCallRefused(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	subscribe(t, a, "u", "svc", "pp")
	now := time.Now().UTC()
	if _, err := a.GrantCredits(ctx, store.CreditGrant{ID: "pi_1", UserID: "u", ServiceID: "svc", Credits: units(100),
		GrantedAt: now.Add(-time.Minute), Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: prepaidProduct(10)}
	entry := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}
	// One call served and settled: node a leases a block for it.
	res, err := a.Reserve(ctx, acct, units(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve: %+v %v", res.Decision, err)
	}
	if _, err := a.Settle(ctx, res, units(1), entry); err != nil {
		t.Fatal(err)
	}
	// The top-up is refunded in full, through the other node: 100 taken
	// back of a balance of 90, so -10.
	sub, _, err := b.ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: units(100), At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the refund: credits %s, held %s", sub.Credits, sub.CreditsHeld)
	// Node a hears of it: the notification marks its leases of the
	// subscription stale (then drops its cache of it). Its cached
	// subscription may also just expire and be read again first (under
	// load the notification came later, and the test served a call from
	// the lease before it): what is waited for is the notification.
	heard := func() bool {
		a.leaser.mu.Lock()
		var les []*lease
		for k, le := range a.leaser.leases {
			if k.UserID == "u" && k.ServiceID == "svc" {
				les = append(les, le)
			}
		}
		a.leaser.mu.Unlock()
		for _, le := range les {
			le.mu.Lock()
			stale := le.stale
			le.mu.Unlock()
			if !stale {
				return false
			}
		}
		return true // a lease given back meanwhile admits nothing
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if s, err := a.GetSubscription(ctx, "u", "svc"); err == nil && s.Credits < 0 && heard() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node a never heard of the refund")
		}
		time.Sleep(10 * time.Millisecond)
	}
	served := 0
	for range 5 {
		res, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !res.Decision.Allowed {
			break
		}
		served++
		if _, err := a.Settle(ctx, res, units(1), entry); err != nil {
			t.Fatal(err)
		}
	}
	a.Close()
	var c, h int64
	if err := b.pool.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions WHERE user_id = 'u' AND service_id = 'svc'").
		Scan(&c, &h); err != nil {
		t.Fatal(err)
	}
	t.Logf("calls served after the refund: %d; balance now %s (held %s)", served, billing.Units(c), billing.Units(h))
	if served > 0 {
		t.Errorf("%d calls served at a balance below zero (want every call refused); balance %s instead of -10",
			served, billing.Units(c))
	}
}
