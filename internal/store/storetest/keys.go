package storetest

import (
	"crypto/subtle"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// testKeys: keys are found by hash and id, listed per user (a user id that
// is a prefix of another lists only its own), duplicates of either are
// refused whole, and revoking keeps the first time.
func testKeys(t *testing.T, c *suite) {
	s := c.store(t)
	keys := []store.KeyRecord{
		{ID: "key_b", Hash: KeyHash("sk_b"), UserID: "u1", Roles: []string{"admin", "reader"}, Label: "ci", Created: T0,
			ExpiresAt: T0.Add(90 * 24 * time.Hour)},
		{ID: "key_a", Hash: KeyHash("sk_a"), UserID: "u1", Created: T0.Add(time.Minute)},
		{ID: "key_c", Hash: KeyHash("sk_c"), UserID: "u10", Created: T0}, // u1 is a prefix of u10
		{ID: "key_d", Hash: KeyHash("sk_d"), UserID: "u2", Created: T0},
		// A key made in the portal: its parent and whether it ends with it.
		{ID: "key_e", Hash: KeyHash("sk_e"), UserID: "u2", Created: T0, ParentKeyID: "key_d", EndsWithParent: true},
	}
	for _, k := range keys {
		if err := s.CreateKey(ctx, k); err != nil {
			t.Fatalf("CreateKey(%s): %v", k.ID, err)
		}
	}
	for _, want := range keys {
		got, err := s.KeyByHash(ctx, want.Hash)
		if err != nil || !sameKey(got, want) {
			t.Errorf("KeyByHash(%s) = %+v, %v; want %+v", want.ID, got, err, want)
		}
		got, err = s.KeyByID(ctx, want.ID)
		if err != nil || !sameKey(got, want) {
			t.Errorf("KeyByID(%s) = %+v, %v; want %+v", want.ID, got, err, want)
		}
	}
	lists := []struct {
		user string
		want []string
	}{
		{"u1", []string{"key_a", "key_b"}},
		{"u10", []string{"key_c"}},
		{"u2", []string{"key_d", "key_e"}},
		{"nobody", nil},
		{"", []string{"key_a", "key_b", "key_c", "key_d", "key_e"}},
	}
	for _, l := range lists {
		got, err := s.ListKeys(ctx, l.user)
		if err != nil {
			t.Fatalf("ListKeys(%q): %v", l.user, err)
		}
		ids := keyIDs(got)
		slices.Sort(ids) // the order is not promised
		if !slices.Equal(ids, l.want) {
			t.Errorf("ListKeys(%q) = %v, want %v", l.user, ids, l.want)
		}
		for _, k := range got {
			if subtle.ConstantTimeCompare(k.Hash[:], make([]byte, len(k.Hash))) == 1 {
				t.Errorf("ListKeys(%q): key %s without its hash", l.user, k.ID)
			}
		}
	}

	dups := []store.KeyRecord{
		{ID: "key_new", Hash: KeyHash("sk_a"), UserID: "u3"},
		{ID: "key_a", Hash: KeyHash("sk_new"), UserID: "u3"},
	}
	for _, k := range dups {
		if err := s.CreateKey(ctx, k); !errors.Is(err, store.ErrExists) {
			t.Errorf("CreateKey(duplicate %s) = %v, want ErrExists", k.ID, err)
		}
	}
	if got, _ := s.ListKeys(ctx, "u3"); len(got) != 0 {
		t.Errorf("a refused key was stored: %+v", got)
	}
	if _, err := s.KeyByHash(ctx, KeyHash("sk_new")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused key was stored under its hash: %v", err)
	}

	first := T0.Add(time.Hour)
	k, err := s.RevokeKey(ctx, "key_a", first)
	if err != nil || !k.RevokedAt.Equal(first) {
		t.Fatalf("RevokeKey = %+v, %v", k, err)
	}
	k, err = s.RevokeKey(ctx, "key_a", first.Add(time.Hour))
	if err != nil || !k.RevokedAt.Equal(first) {
		t.Errorf("second RevokeKey = %v, %v; want the first time %s", k.RevokedAt, err, first)
	}
	k, err = s.KeyByHash(ctx, KeyHash("sk_a"))
	if err != nil || !k.RevokedAt.Equal(first) {
		t.Errorf("KeyByHash(revoked) = %+v, %v", k, err)
	}
	if k, _ := s.KeyByID(ctx, "key_b"); !k.RevokedAt.IsZero() {
		t.Errorf("revoking key_a revoked key_b: %+v", k)
	}
	// Revoking keeps what the key was made from.
	k, err = s.RevokeKey(ctx, "key_e", first)
	if err != nil || !k.RevokedAt.Equal(first) || k.ParentKeyID != "key_d" || !k.EndsWithParent {
		t.Errorf("RevokeKey(minted) = %+v, %v", k, err)
	}
	if k, err := s.KeyByHash(ctx, KeyHash("sk_e")); err != nil || k.ParentKeyID != "key_d" || !k.EndsWithParent || !k.RevokedAt.Equal(first) {
		t.Errorf("KeyByHash(revoked minted) = %+v, %v", k, err)
	}
	if _, err := s.KeyByHash(ctx, KeyHash("sk_unknown")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("KeyByHash(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.KeyByID(ctx, "key_unknown"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("KeyByID(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.RevokeKey(ctx, "key_unknown", T0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RevokeKey(unknown) = %v, want ErrNotFound", err)
	}
}

// testKeyIDAnyCase: a key id issued as a UUID is found whatever its case,
// next to an old "key_…" id.
func testKeyIDAnyCase(t *testing.T, c *suite) {
	s := c.store(t)
	old := store.KeyRecord{ID: "key_AbCdEfGhIjKlMnOpQrSt", Hash: KeyHash("sk_old"), UserID: "u1", Created: T0}
	fresh := store.KeyRecord{ID: servicekey.NewID(), Hash: KeyHash("sk_new"), UserID: "u1", Created: T0.Add(time.Minute)}
	for _, k := range []store.KeyRecord{old, fresh} {
		if err := s.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.KeyByID(ctx, strings.ToUpper(fresh.ID)); err != nil || !sameKey(got, fresh) {
		t.Errorf("KeyByID(upper case UUID) = %+v, %v", got, err)
	}
	if got, err := s.KeyByID(ctx, old.ID); err != nil || !sameKey(got, old) {
		t.Errorf("KeyByID(old id) = %+v, %v", got, err)
	}
	k, err := s.RevokeKey(ctx, old.ID, T0.Add(time.Hour))
	if err != nil || k.ID != old.ID || !k.RevokedAt.Equal(T0.Add(time.Hour)) {
		t.Fatalf("RevokeKey(old id) = %+v, %v", k, err)
	}
	if k, err := s.KeyByID(ctx, fresh.ID); err != nil || !k.RevokedAt.IsZero() {
		t.Errorf("revoking the old key touched the new one: %+v, %v", k, err)
	}
}

func sameKey(a, b store.KeyRecord) bool {
	return a.ID == b.ID && subtle.ConstantTimeCompare(a.Hash[:], b.Hash[:]) == 1 && a.UserID == b.UserID && slices.Equal(a.Roles, b.Roles) &&
		a.Label == b.Label && a.Created.Equal(b.Created) && a.ExpiresAt.Equal(b.ExpiresAt) && a.RevokedAt.Equal(b.RevokedAt) &&
		a.ParentKeyID == b.ParentKeyID && a.EndsWithParent == b.EndsWithParent
}

func keyIDs(ks []store.KeyRecord) []string {
	var ids []string
	for _, k := range ks {
		ids = append(ids, k.ID)
	}
	return ids
}

// testSubscriptions: a subscription starts when created unless given a
// start; an update keeps the start and the balance whatever it sends.
func testSubscriptions(t *testing.T, c *suite) {
	s := c.store(t)
	if _, err := s.GetSubscription(ctx, "u1", "svc"); !errors.Is(err, store.ErrNoAccount) {
		t.Fatalf("GetSubscription(none) = %v, want ErrNoAccount", err)
	}
	if _, err := s.AddCredits(ctx, "u1", "svc", whole(5), T0); !errors.Is(err, store.ErrNoAccount) {
		t.Fatalf("AddCredits(none) = %v, want ErrNoAccount", err)
	}
	created, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: "basic",
		Status: "TRIAL", UpdatedAt: T0})
	if err != nil || !created.StartedAt.Equal(T0) {
		t.Fatalf("PutSubscription(create) = %+v, %v; want StartedAt %s", created, err, T0)
	}
	start := T0.Add(-48 * time.Hour)
	other, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc2", ProductID: "basic",
		Status: "ACTIVE", StartedAt: start, UpdatedAt: T0})
	if err != nil || !other.StartedAt.Equal(start) {
		t.Fatalf("PutSubscription(create with start) = %+v, %v", other, err)
	}
	sub, err := s.AddCredits(ctx, "u1", "svc", whole(10), T0.Add(time.Minute))
	if err != nil || sub.Credits != whole(10) || !sub.UpdatedAt.Equal(T0.Add(time.Minute)) {
		t.Fatalf("AddCredits(+10) = %+v, %v", sub, err)
	}
	if sub, err = s.AddCredits(ctx, "u1", "svc", -whole(3), T0.Add(2*time.Minute)); err != nil || sub.Credits != whole(7) {
		t.Fatalf("AddCredits(-3) = %+v, %v", sub, err)
	}
	later := T0.Add(24 * time.Hour)
	updated, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: "pro",
		Status: "ACTIVE", StartedAt: later, UpdatedAt: later, Credits: whole(1000), CreditsHeld: whole(1)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSubscription(ctx, "u1", "svc")
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range []store.Subscription{updated, got} {
		if sub.ProductID != "pro" || sub.Status != "ACTIVE" || !sub.UpdatedAt.Equal(later) ||
			!sub.StartedAt.Equal(T0) || sub.Credits != whole(7) || sub.CreditsHeld != 0 {
			t.Errorf("after update: %+v; want product pro, ACTIVE, started %s, 7 credits", sub, T0)
		}
	}
	if got, _ := s.GetSubscription(ctx, "u1", "svc2"); got.ProductID != "basic" || !got.StartedAt.Equal(start) {
		t.Errorf("another service's subscription changed: %+v", got)
	}
	// Every status the store documents is stored as given.
	for _, status := range []string{"ACTIVE", "TRIAL", "CANCELLING", "CANCELLING_PENDING", "EXPIRED", "CANCELLED", "SUSPENDED"} {
		if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc2", ProductID: "basic",
			Status: status, UpdatedAt: later}); err != nil {
			t.Fatalf("PutSubscription(%s): %v", status, err)
		}
		if got, err := s.GetSubscription(ctx, "u1", "svc2"); err != nil || got.Status != status || !got.StartedAt.Equal(start) {
			t.Errorf("status %s stored as %+v, %v", status, got, err)
		}
	}
}

// testRestartPeriods: a put with RestartPeriodsAt moves the period
// anchor, so the period containing now starts there with nothing used
// (payments: a Stripe trial converted to its first paid period); a put
// without it keeps the anchor and what the period used, and the balance
// is kept either way.
func testRestartPeriods(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", quotaBlock, whole(3))
	now := T0.Add(10 * 24 * time.Hour)
	if _, err := s.Record(ctx, a, EntryFor(a, whole(10), now), OKResponse); err != nil {
		t.Fatal(err)
	}
	used := func(when string, want billing.Units) {
		t.Helper()
		st, err := s.State(ctx, a, now.Add(time.Minute))
		if err != nil || st.Used != want {
			t.Fatalf("%s: used %s (%v), want %s", when, st.Used, err, want)
		}
		if r, err := s.Reserve(ctx, a, whole(1), now.Add(time.Minute)); err != nil || r.Decision.Allowed != (want < whole(10)) {
			t.Fatalf("%s: a hold is %+v, %v", when, r.Decision, err)
		} else if r.ID != "" {
			if _, err := s.Settle(ctx, r, 0, store.LedgerEntry{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	used("before", whole(10))
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: quotaBlock.ID,
		Status: "ACTIVE", UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	used("after a put that keeps the anchor", whole(10))
	restart := now.Add(-time.Hour)
	got, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: quotaBlock.ID,
		Status: "ACTIVE", UpdatedAt: now, RestartPeriodsAt: restart})
	if err != nil || !got.StartedAt.Equal(restart) || got.Credits != whole(3) || !got.RestartPeriodsAt.IsZero() {
		t.Fatalf("put with RestartPeriodsAt = %+v, %v; want started %s, 3 credits", got, err, restart)
	}
	if got, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || !got.StartedAt.Equal(restart) {
		t.Fatalf("stored: %+v, %v; want started %s", got, err, restart)
	}
	used("after the restart", 0)
}

// testNegativeBalance: credits may go below zero; the subscription stays
// readable, a hold is refused (not an error), and credits added bring it
// back.
func testNegativeBalance(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", prepaid, whole(1))
	sub, err := s.AddCredits(ctx, "u1", "svc", -whole(3), T0)
	if err != nil || sub.Credits != -whole(2) {
		t.Fatalf("AddCredits(-3) = %+v, %v", sub, err)
	}
	if got, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || got.Credits != -whole(2) {
		t.Fatalf("GetSubscription of an overdrawn balance = %+v, %v", got, err)
	}
	if st := c.state(t, s, a, T0); st.Credits != -whole(2) {
		t.Errorf("State.Credits = %s, want -2", st.Credits)
	}
	if res, err := s.Reserve(ctx, a, whole(1), T0); err != nil || res.Decision.Allowed {
		t.Errorf("Reserve on an overdrawn balance = %+v, %v; want a refusal", res.Decision, err)
	}
	// A call that costs nothing (an endpoint of cost 0, a PREPAID product
	// of price 0) is decided alike by both stores on an overdrawn balance.
	free := prepaid
	free.ID, free.Price = "prepaid-free", 0
	for _, tc := range []struct {
		name  string
		p     billing.Product
		units billing.Units
	}{{"0 units", prepaid, 0}, {"price 0", free, whole(1)}} {
		a := a
		a.Product = tc.p
		res, err := s.Reserve(ctx, a, tc.units, T0)
		if err != nil {
			t.Fatalf("Reserve(%s) on an overdrawn balance: %v", tc.name, err)
		}
		if res.Decision.Allowed {
			if _, err := s.Settle(ctx, res, 0, store.LedgerEntry{Time: T0, UserID: "u1", ServiceID: "svc", ProductID: tc.p.ID}); err != nil {
				t.Fatal(err)
			}
		}
		if want := billing.Decide(tc.p, billing.State{Credits: -whole(2)}, tc.units).Allowed; res.Decision.Allowed != want {
			t.Errorf("Reserve(%s) on a balance of -2: allowed %v, billing.Decide says %v (%+v)", tc.name, res.Decision.Allowed, want, res.Decision)
		}
	}
	if sub, err := s.AddCredits(ctx, "u1", "svc", whole(3), T0); err != nil || sub.Credits != whole(1) {
		t.Errorf("AddCredits(+3) = %+v, %v", sub, err)
	}

	// A change that would pass what a balance holds is refused and changes
	// nothing, either way (the embedded store wrapped round: ten adds of
	// 10^12 credits read as -8.4 trillion).
	steps := []struct {
		amount billing.Units
		want   billing.Units // the balance after; with fail, the one kept
		fail   bool
	}{
		{whole(9_000_000_000_000), whole(9_000_000_000_001), false},
		{whole(1_000_000_000_000), whole(9_000_000_000_001), true},
		{-whole(9_000_000_000_000), whole(1), false},
		{-whole(9_000_000_000_000), -whole(8_999_999_999_999), false},
		{-whole(1_000_000_000_000), -whole(8_999_999_999_999), true},
	}
	for _, st := range steps {
		sub, err := s.AddCredits(ctx, "u1", "svc", st.amount, T0)
		if st.fail != (err != nil) || (st.fail && !errors.Is(err, store.ErrBalanceRange)) || (!st.fail && sub.Credits != st.want) {
			t.Errorf("AddCredits(%s) = %s, %v; want %s, failing %v", st.amount, sub.Credits, err, st.want, st.fail)
		}
		if got, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || got.Credits != st.want {
			t.Errorf("after AddCredits(%s): balance %s, %v; want %s", st.amount, got.Credits, err, st.want)
		}
	}
}

// testSubscriptionEnd: a subscription's end (EndsAt, EndStatus) is the
// put's: it is stored as given, kept by AddCredits and by settlement
// (which touch only the balance), replaced by the next put (an operator
// who sets a status without an end clears it) and kept across a restart.
func testSubscriptionEnd(t *testing.T, c *suite) {
	s := c.store(t)
	ends := T0.Add(30 * 24 * time.Hour)
	a := store.Account{UserID: "u1", ServiceID: "svc", Product: prepaid}
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: prepaid.ID,
		Status: "CANCELLING", UpdatedAt: T0.Add(-time.Hour), EndsAt: ends, EndStatus: "CANCELLED"}); err != nil {
		t.Fatal(err)
	}
	wantEnd := func(when string, s store.Store, at time.Time, status string) {
		t.Helper()
		got, err := s.GetSubscription(ctx, "u1", "svc")
		if err != nil || !got.EndsAt.Equal(at) || got.EndStatus != status {
			t.Errorf("%s: %+v, %v; want endsAt %s, endStatus %q", when, got, err, at, status)
		}
	}
	wantEnd("put", s, ends, "CANCELLED")
	if _, err := s.AddCredits(ctx, "u1", "svc", whole(10), T0); err != nil {
		t.Fatal(err)
	}
	wantEnd("after AddCredits", s, ends, "CANCELLED")
	res, err := s.Reserve(ctx, a, whole(4), T0)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	if _, err := s.Settle(ctx, res, whole(4), store.LedgerEntry{Time: T0.Add(time.Second), UserID: "u1",
		ServiceID: "svc", EndpointID: "ep", ProductID: prepaid.ID, RequestID: "req-1", Source: store.SourceGateway}); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if st := c.state(t, s, a, T0.Add(time.Second)); st.Credits != whole(9) {
		t.Fatalf("credits after settling = %s, want 9", st.Credits)
	}
	wantEnd("after settlement", s, ends, "CANCELLED")
	if c.reopen != nil {
		s = c.restart(t, s)
		wantEnd("after a restart", s, ends, "CANCELLED")
	}
	trialEnd := T0.Add(14 * 24 * time.Hour)
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: prepaid.ID,
		Status: "TRIAL", UpdatedAt: T0, EndsAt: trialEnd, EndStatus: "EXPIRED"}); err != nil {
		t.Fatal(err)
	}
	wantEnd("a put with another end", s, trialEnd, "EXPIRED")
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: prepaid.ID,
		Status: "ACTIVE", UpdatedAt: T0}); err != nil {
		t.Fatal(err)
	}
	wantEnd("a put without an end", s, time.Time{}, "")
	if got, _ := s.GetSubscription(ctx, "u1", "svc"); got.Credits != whole(9) {
		t.Errorf("the puts changed the balance: %+v", got)
	}
}
