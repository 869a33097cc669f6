package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestExpireCreditsLeased: credits a node has leased for calls it has
// not settled yet count as spent when a grant expires, so those calls,
// settled after the expiry, do not spend credits the expiry took too:
// what expires is the grant's part not leased out, and the final balance
// is the grant less what the calls spent less what expired, never less.
func TestExpireCreditsLeased(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	subscribe(t, a, "u", "svc", "pp")
	now := time.Now().UTC()
	const grant, calls = 100, 30
	if _, err := a.GrantCredits(ctx, store.CreditGrant{ID: "pi_lease", UserID: "u", ServiceID: "svc", Credits: units(grant),
		GrantedAt: now.Add(-time.Minute), ExpiresAt: now.Add(time.Minute), Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: prepaidProduct(1)}
	var held []store.Reservation
	for range calls {
		res, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve: %+v %v", res.Decision, err)
		}
		held = append(held, res)
	}
	// What the database says, whatever either node caches.
	balance := func() (credits, creditsHeld billing.Units) {
		t.Helper()
		var c, h int64
		if err := b.pool.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions WHERE user_id = 'u' AND service_id = 'svc'").
			Scan(&c, &h); err != nil {
			t.Fatal(err)
		}
		return billing.Units(c), billing.Units(h)
	}
	_, leased := balance()
	if leased < units(calls) {
		t.Fatalf("credits held %d with %d calls in flight", leased, calls)
	}

	// The other node expires the grant while a's calls are in flight.
	expired, err := b.ExpireCredits(ctx, now.Add(time.Minute))
	if err != nil || len(expired) != 1 {
		t.Fatalf("expire: %+v %v", expired, err)
	}
	// A node may lease its next block in the background, so what was
	// held at the expiry is at least what was read before it: the expiry
	// took at most the rest, and never a credit the calls spend.
	gone := expired[0].Expired
	if gone > units(grant)-leased || gone > units(grant-calls) || gone <= 0 {
		t.Errorf("expired %s of a grant of %d with at least %s leased out for %d calls; want 0 < expired <= %s",
			gone, grant, leased, calls, units(grant)-leased)
	}

	for _, res := range held {
		if _, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	a.Close() // gives its leases back
	credits, creditsHeld := balance()
	if want := units(grant-calls) - gone; credits != want || creditsHeld != 0 || credits < 0 {
		t.Errorf("after settling: credits %s, held %s; want %s (%d granted - %d spent - %s expired)",
			credits, creditsHeld, want, grant, calls, gone)
	}
}
