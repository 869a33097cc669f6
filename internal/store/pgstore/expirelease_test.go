package pgstore

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestExpireCreditsLeased: credits a node has leased for calls it has
// not settled yet count as spent when a grant expires, so those calls,
// settled after the expiry, do not spend credits the expiry took too:
// what expires at once is the grant's part not leased out. What the block
// leased before the expiry gives back unspent when the node returns it
// expires then (it was the grant's: before, it stayed in the balance, a
// caller kept it), and a block leased after the expiry, from credits that
// do not expire, gives back what it did not use untouched: the final
// balance is what did not expire less what the calls spent.
func TestExpireCreditsLeased(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	const grant, calls = 100, 30
	now, acct, held := heldAtExpiry(t, a, "pi_lease", grant, calls)
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
	if gone > units(grant)-leased || gone > units(grant-calls) || gone <= 0 || gone+expired[0].Deferred != units(grant) {
		t.Errorf("expired %s (deferred %s) of a grant of %d with at least %s leased out for %d calls; want 0 < expired <= %s, the rest deferred",
			gone, expired[0].Deferred, grant, leased, calls, units(grant)-leased)
	}

	// Credits that do not expire, leased by b after the expiry for a
	// call that uses 1 of them; b gives its block back at its Close.
	if _, err := b.GrantCredits(ctx, store.CreditGrant{ID: "pi_after", UserID: "u", ServiceID: "svc", Credits: units(20),
		GrantedAt: now.Add(2 * time.Minute), Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	res, err := b.Reserve(ctx, acct, units(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve on b after the expiry: %+v %v", res.Decision, err)
	}
	if _, err := b.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}); err != nil {
		t.Fatal(err)
	}

	for _, res := range held {
		if _, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	a.Close() // gives its leases back: what they did not use of the grant expires
	b.Close()
	c := openNode(t, dsn, "c")
	var credits, creditsHeld int64
	if err := c.pool.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions WHERE user_id = 'u' AND service_id = 'svc'").
		Scan(&credits, &creditsHeld); err != nil {
		t.Fatal(err)
	}
	if want := units(20 - 1); billing.Units(credits) != want || creditsHeld != 0 {
		t.Errorf("after settling: credits %s, held %s; want %s (%d granted and %d spent of the expiring grant, 20 - 1 of the other)",
			billing.Units(credits), billing.Units(creditsHeld), want, grant, calls)
	}
	gs, err := c.ListCreditGrants(ctx, "u", "svc")
	if err != nil || len(gs) != 2 || gs[0].Expired != units(grant-calls) || gs[0].Deferred != 0 ||
		gs[0].ExpiredLater != units(grant-calls)-gone {
		t.Errorf("grants after the leases came back = %+v, %v; want %d expired (%s of it later), nothing deferred",
			gs, err, grant-calls, units(grant-calls)-gone)
	}
}

// TestExpireCreditsLeaseLapsed: a node's lease row held at a grant's
// expiry ends (swept: the node was cut off past lease_ttl, or restarted
// later than that) while calls it served from the row are still to be
// shipped. The sweep expires what the row gave back of the grant; the
// calls shipped afterwards were served from those credits, so they are
// charged them, not credits a second time. Before, the grant expired in
// full and the calls were charged as well: a balance of -30 where the
// grant of 100 had 30 spent and 70 expired.
func TestExpireCreditsLeaseLapsed(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	const grant, calls = 100, 30
	now, _, held := heldAtExpiry(t, a, "pi_lapse", grant, calls)
	expired, err := b.ExpireCredits(ctx, now.Add(time.Minute))
	if err != nil || len(expired) != 1 || expired[0].Deferred <= 0 {
		t.Fatalf("expire: %+v %v; want a part deferred to a's lease", expired, err)
	}
	// a's lease lapses (its renewals do not reach the database) and b
	// sweeps it, with a's calls in flight.
	if _, err := b.pool.Exec(ctx, "UPDATE leases SET expires_at = now() - interval '1 second' WHERE holder LIKE 'a/%'"); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(ctx, expiredSQL)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := pgx.CollectRows(rows, scanLeaseRef)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.returnLeases(ctx, refs, true); err != nil || n == 0 { // sweepExpired's statement
		t.Fatalf("sweep: %d rows, %v", n, err)
	}
	for _, res := range held {
		if _, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	a.Close()
	b.Close()
	c := openNode(t, dsn, "c")
	var credits, creditsHeld int64
	if err := c.pool.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions WHERE user_id = 'u' AND service_id = 'svc'").
		Scan(&credits, &creditsHeld); err != nil {
		t.Fatal(err)
	}
	if billing.Units(credits) != 0 || creditsHeld != 0 {
		t.Errorf("after the lapse: credits %s, held %s; want 0 (%d spent of the grant of %d, the rest expired)",
			billing.Units(credits), billing.Units(creditsHeld), calls, grant)
	}
	gs, err := c.ListCreditGrants(ctx, "u", "svc")
	if err != nil || len(gs) != 1 || gs[0].Expired != units(grant-calls) || gs[0].Deferred != 0 ||
		gs[0].ExpiredLater != units(grant-calls)-expired[0].Expired {
		t.Errorf("grant after the lapse = %+v, %v; want %d expired (%s later), nothing deferred",
			gs, err, grant-calls, units(grant-calls)-expired[0].Expired)
	}
	es, _, err := c.ListAudit(ctx, "", 20)
	found := false
	for _, e := range es {
		found = found || e.Action == "credits.unexpire"
	}
	if err != nil || !found {
		t.Errorf("audit %+v, %v; want a credits.unexpire entry", es, err)
	}
}

// heldAtExpiry subscribes u to svc on a prepaid product at 1 credit a
// call, grants it credits expiring in a minute, and has node a reserve
// calls of them (its lease's blocks, held): the start of the expiry's
// lease tests. It returns the time the grant was made from.
func heldAtExpiry(t *testing.T, a *Store, grantID string, grant, calls int64) (time.Time, store.Account, []store.Reservation) {
	t.Helper()
	ctx := context.Background()
	subscribe(t, a, "u", "svc", "pp")
	now := time.Now().UTC()
	if _, err := a.GrantCredits(ctx, store.CreditGrant{ID: grantID, UserID: "u", ServiceID: "svc", Credits: units(grant),
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
	return now, acct, held
}

// TestPruneLedgerPrunesLeasePreEnded: what lease rows ended holding
// credits marked at a deferred expiry expired (lease_pre_ended) is kept
// for calls they served that are shipped later, as long as the ledger
// keeps rows of that time: a ledger prune (ledger_retention, usage prune)
// deletes the rows that ended before its cutoff, and only those.
func TestPruneLedgerPrunesLeasePreEnded(t *testing.T) {
	ctx := context.Background()
	s := openNode(t, pgtest.DB(t), "a")
	cut := time.Date(2024, 3, 10, 0, 0, 0, 0, time.UTC)
	for _, r := range []struct {
		holder string
		ended  time.Time
	}{{"old", cut.Add(-time.Hour)}, {"at-cut", cut}, {"new", time.Now()}} {
		if _, err := s.pool.Exec(ctx, `INSERT INTO lease_pre_ended (holder, user_id, service_id, period, credits, ended_at)
			VALUES ($1, 'u1', 'svc', 0, 5, $2)`, r.holder, r.ended); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.PruneLedger(ctx, cut); err != nil {
		t.Fatal(err)
	}
	rows, err := s.pool.Query(ctx, "SELECT holder FROM lease_pre_ended ORDER BY holder")
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(left, []string{"at-cut", "new"}) {
		t.Errorf("lease_pre_ended after a prune before %s: %q, want the rows that ended at or after it (at-cut, new)", cut, left)
	}
}

// TestExpireCreditsLeasedOrder: what a node's block leased before an
// expiry charges is taken oldest grant first, as ordinary spending takes
// it, a grant that does not expire included; what it gives back unspent
// expires only as far as it is of the grants due. Grants A 100 and B 100
// expire, C 50 does not and is older than B; a node's calls in flight at
// the expiry spend 150, A's and C's, and B's 100 expire (at once, the
// part not leased out; as the block, which holds 10 more released before
// the expiry, comes back, the rest). Before, the
// charges took the deferred credits first (A's and some of B's), the
// block's give-back took C's first: a balance of 50.
func TestExpireCreditsLeasedOrder(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	subscribe(t, a, "u", "svc", "pp")
	now := time.Now().UTC()
	for _, g := range []store.CreditGrant{
		{ID: "A", Credits: units(100), GrantedAt: now.Add(-3 * time.Minute), ExpiresAt: now.Add(time.Minute)},
		{ID: "C", Credits: units(50), GrantedAt: now.Add(-2 * time.Minute)},
		{ID: "B", Credits: units(100), GrantedAt: now.Add(-time.Minute), ExpiresAt: now.Add(time.Minute)},
	} {
		g.UserID, g.ServiceID, g.Source = "u", "svc", "stripe"
		if _, err := a.GrantCredits(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: prepaidProduct(1)}
	var held []store.Reservation
	for range 160 {
		res, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve: %+v %v", res.Decision, err)
		}
		held = append(held, res)
	}
	// 10 released: their credits stay in the node's block, leased at the
	// expiry and given back unused.
	for _, res := range held[150:] {
		if _, err := a.Settle(ctx, res, 0, store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	held = held[:150]
	expired, err := b.ExpireCredits(ctx, now.Add(time.Minute))
	if err != nil || len(expired) != 2 || expired[0].Expired != 0 || expired[0].Deferred != units(100) {
		t.Fatalf("expire with 150 in flight: %+v %v; want A's 100 deferred", expired, err)
	}
	if expired[1].Deferred <= 0 {
		// The node's block held no more than its calls: the charges close
		// the expiry whichever order they are taken in.
		t.Fatalf("B %+v: want some of it deferred, the node's block leased past the 150 calls it charges", expired[1])
	}
	for _, res := range held {
		if _, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	a.Close() // gives its block back: what it did not use of B expires
	b.Close()
	c := openNode(t, dsn, "c")
	var credits, creditsHeld int64
	if err := c.pool.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions WHERE user_id = 'u' AND service_id = 'svc'").
		Scan(&credits, &creditsHeld); err != nil {
		t.Fatal(err)
	}
	if credits != 0 || creditsHeld != 0 {
		t.Errorf("after the block came back: credits %s, held %s; want 0 (250 granted, 150 spent, B's 100 expired)",
			billing.Units(credits), billing.Units(creditsHeld))
	}
	gs, err := c.ListCreditGrants(ctx, "u", "svc")
	if err != nil || len(gs) != 3 {
		t.Fatalf("grants: %+v, %v", gs, err)
	}
	for _, g := range gs {
		want := units(0)
		if g.ID == "B" {
			want = units(100)
		}
		if g.Expired != want || g.Deferred != 0 {
			t.Errorf("grant %s expired %s (later %s), deferred %s; want %s expired, nothing deferred", g.ID, g.Expired,
				g.ExpiredLater, g.Deferred, want)
		}
	}
}

// TestExpireCreditsLeaseLapsedOrder: a lease row held at an expiry ends
// with calls it served still to be shipped, and its give-back took
// credits that do not expire as well as the grant's: the calls, shipped
// later, spent those first (oldest first, as everywhere), and unexpire
// only what they spent beyond them. C 50 does not expire and is older
// than A 50, which does; a node's block holds all 100 at A's expiry, 60
// of them for calls in flight, and lapses: its give-back expires A's 50
// (what it holds of C goes back to the balance). The 60 calls shipped
// afterwards spent C's 50 and 10 of A's: A stays 40 expired, a balance
// of 0. Before, they unexpired all of A's 50: a balance of 40.
func TestExpireCreditsLeaseLapsedOrder(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	subscribe(t, a, "u", "svc", "pp")
	now := time.Now().UTC()
	for _, g := range []store.CreditGrant{
		{ID: "C", Credits: units(50), GrantedAt: now.Add(-2 * time.Minute)},
		{ID: "A", Credits: units(50), GrantedAt: now.Add(-time.Minute), ExpiresAt: now.Add(time.Minute)},
	} {
		g.UserID, g.ServiceID, g.Source = "u", "svc", "stripe"
		if _, err := a.GrantCredits(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: prepaidProduct(1)}
	var held []store.Reservation
	for range 100 {
		res, err := a.Reserve(ctx, acct, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("reserve: %+v %v", res.Decision, err)
		}
		held = append(held, res)
	}
	// 40 released: their credits stay in the node's block, held at the
	// expiry.
	for _, res := range held[60:] {
		if _, err := a.Settle(ctx, res, 0, store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	held = held[:60]
	expired, err := b.ExpireCredits(ctx, now.Add(time.Minute))
	if err != nil || len(expired) != 1 || expired[0].Expired != 0 || expired[0].Deferred != units(50) {
		t.Fatalf("expire with the block holding all 100: %+v %v; want A's 50 deferred", expired, err)
	}
	// a's lease lapses and b sweeps it, with a's 60 calls in flight.
	if _, err := b.pool.Exec(ctx, "UPDATE leases SET expires_at = now() - interval '1 second' WHERE holder LIKE 'a/%'"); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(ctx, expiredSQL)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := pgx.CollectRows(rows, scanLeaseRef)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.returnLeases(ctx, refs, true); err != nil || n == 0 {
		t.Fatalf("sweep: %d rows, %v", n, err)
	}
	for _, res := range held {
		if _, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "pp", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	a.Close()
	b.Close()
	c := openNode(t, dsn, "c")
	var credits, creditsHeld int64
	if err := c.pool.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions WHERE user_id = 'u' AND service_id = 'svc'").
		Scan(&credits, &creditsHeld); err != nil {
		t.Fatal(err)
	}
	if credits != 0 || creditsHeld != 0 {
		t.Errorf("after the lapse: credits %s, held %s; want 0 (100 granted, 60 spent, C's 50 and A's 10, A's 40 expired)",
			billing.Units(credits), billing.Units(creditsHeld))
	}
	gs, err := c.ListCreditGrants(ctx, "u", "svc")
	if err != nil || len(gs) != 2 {
		t.Fatalf("grants: %+v, %v", gs, err)
	}
	for _, g := range gs {
		want := units(0)
		if g.ID == "A" {
			want = units(40)
		}
		if g.Expired != want || g.Deferred != 0 {
			t.Errorf("grant %s expired %s (later %s), deferred %s; want %s expired, nothing deferred", g.ID, g.Expired,
				g.ExpiredLater, g.Deferred, want)
		}
	}
}
