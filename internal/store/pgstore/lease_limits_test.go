package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestLeaseFollowsQuotaChange: 20 calls used under a quota of 1000;
// the subscription moves to a product with a quota of 10 (blocked). The
// docs (operations.md): "moving to a smaller quota than what is used
// blocks further calls until the period renews". boltstore refuses the
// next call; pgstore admits it from the node's lease, leased under the old
// quota.
func TestLeaseFollowsQuotaChange(t *testing.T) {
	s := openNode(t, pgtest.DB(t), "a")
	ctx := context.Background()
	subscribe(t, s, "u", "svc", "q")
	big := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)}
	for range 20 {
		res, err := s.Reserve(ctx, big, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve under the big quota: %v %+v", err, res.Decision)
		}
		if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Source: store.SourceGateway, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	// The change of product (as ops.PutSubscription makes it).
	now := time.Now().UTC()
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "svc", ProductID: "small", Status: "ACTIVE", UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	small := big
	small.Product = quotaProduct(10)
	small.Product.ID = "small"
	st, _ := s.State(ctx, small, time.Now())
	t.Logf("state after the change: used %s, held %s", st.Used, st.Reserved)
	admitted := 0
	for range 50 {
		res, err := s.Reserve(ctx, small, units(1), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !res.Decision.Allowed {
			break
		}
		admitted++
		if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "small", Source: store.SourceGateway, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	st, _ = s.State(ctx, small, time.Now())
	if admitted > 0 {
		t.Errorf("%d calls admitted under a quota of 10 with 20 already used (used now %s)", admitted, st.Used)
	}
	// Back to the larger quota: admitted again at once, not refused from
	// the smaller one's refusal.
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "svc", ProductID: "q", Status: "ACTIVE", UpdatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Reserve(ctx, big, units(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve after the quota was raised again: %v %+v", err, res.Decision)
	}
	if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Source: store.SourceGateway, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.State(ctx, big, time.Now()); st.Used != units(21) {
		t.Errorf("used %s after one more call, want 21", st.Used)
	}
}
