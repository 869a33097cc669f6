package storetest

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testAuditWithChange: a key created or revoked, a subscription put and
// credits added append the audit entries given with them in the same
// transaction (store.Keys; AddCredits completes each detail with the
// balance). The entries are in the log with the change, numbered
// after every entry before them and in the order given; a change refused
// (a duplicate key, an unknown key) appends none; and an entry the store
// cannot write (a time past year 9999, which neither store can encode)
// fails the change whole: no key, the key still active, the subscription
// and its balance as they were, and no entry. The sequence numbers keep their meaning: they
// order the log, whichever way an entry came (AppendAudit or a change).
// After a restart the changes and their entries are all there.
func testAuditWithChange(t *testing.T, c *suite) {
	s := c.store(t)
	entry := func(action, keyID, detail string) store.AuditEntry {
		return store.AuditEntry{Time: T0, Actor: "admin-api 127.0.0.1:1", Action: action, UserID: "u1", KeyID: keyID, Detail: detail}
	}
	unwritable := func(e store.AuditEntry) store.AuditEntry {
		e.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
		return e
	}
	first, err := s.AppendAudit(ctx, entry("portal.sign_in", "", "before"))
	if err != nil {
		t.Fatal(err)
	}
	k1 := store.KeyRecord{ID: "key_1", Hash: KeyHash("sk_1"), UserID: "u1", Created: T0}
	if err := s.CreateKey(ctx, k1, entry("key.create", "key_1", "never expires")); err != nil {
		t.Fatal(err)
	}
	// Refused changes append nothing.
	dup := k1
	dup.ID = "key_dup"
	if err := s.CreateKey(ctx, dup, entry("key.create", "key_dup", "a duplicate")); !errors.Is(err, store.ErrExists) {
		t.Fatalf("CreateKey of a stored hash: %v, want ErrExists", err)
	}
	if _, err := s.RevokeKey(ctx, "key_none", T0, entry("key.revoke", "key_none", "")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("RevokeKey of no key: %v, want ErrNotFound", err)
	}
	sub := store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: "basic", Status: "ACTIVE", UpdatedAt: T0}
	if _, err := s.PutSubscription(ctx, sub, entry("subscription.put", "", "product basic")); err != nil {
		t.Fatal(err)
	}
	// Two entries with one change: both, in the order given.
	if _, err := s.RevokeKey(ctx, "key_1", T0.Add(time.Minute), entry("key.revoke", "key_1", "one"), entry("key.revoke", "key_1", "two")); err != nil {
		t.Fatal(err)
	}
	// Credits: the store completes the detail with the balance it left.
	if got, err := s.AddCredits(ctx, "u1", "svc", whole(10), T0, store.AuditEntry{Time: T0, Actor: "admin-api 127.0.0.1:1",
		Action: "credits.add", UserID: "u1", ServiceID: "svc", Detail: "amount 10"}); err != nil || got.Credits != whole(10) {
		t.Fatalf("AddCredits = %+v, %v", got, err)
	}
	if _, err := s.AddCredits(ctx, "u1", "none", whole(1), T0, entry("credits.add", "", "no subscription")); !errors.Is(err, store.ErrNoAccount) {
		t.Fatalf("AddCredits without a subscription: %v, want ErrNoAccount", err)
	}
	if _, err := s.AddCredits(ctx, "u1", "svc", billing.Units(math.MaxInt64), T0, entry("credits.add", "", "too much")); !errors.Is(err, store.ErrBalanceRange) {
		t.Fatalf("AddCredits past the range: %v, want ErrBalanceRange", err)
	}
	// No entry: the change alone, as before entries came with changes.
	if err := s.CreateKey(ctx, store.KeyRecord{ID: "key_2", Hash: KeyHash("sk_2"), UserID: "u1", Created: T0}); err != nil {
		t.Fatal(err)
	}

	// An entry that cannot be written: the change is not made either.
	k3 := store.KeyRecord{ID: "key_3", Hash: KeyHash("sk_3"), UserID: "u1", Created: T0}
	if err := s.CreateKey(ctx, k3, unwritable(entry("key.create", "key_3", ""))); err == nil {
		t.Error("CreateKey with an entry that cannot be written succeeded")
	}
	if k, err := s.KeyByID(ctx, "key_3"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("key made without its audit entry: %+v, %v", k, err)
	}
	if k, err := s.KeyByHash(ctx, k3.Hash); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("key made without its audit entry (by hash): %+v, %v", k, err)
	}
	if _, err := s.RevokeKey(ctx, "key_2", T0.Add(time.Minute), unwritable(entry("key.revoke", "key_2", ""))); err == nil {
		t.Error("RevokeKey with an entry that cannot be written succeeded")
	}
	if k, err := s.KeyByID(ctx, "key_2"); err != nil || !k.RevokedAt.IsZero() {
		t.Errorf("key revoked without its audit entry: %+v, %v", k, err)
	}
	if k, err := s.KeyByHash(ctx, KeyHash("sk_2")); err != nil || !k.RevokedAt.IsZero() {
		t.Errorf("key revoked without its audit entry (by hash): %+v, %v", k, err)
	}
	pro := sub
	pro.ProductID, pro.UpdatedAt = "pro", T0.Add(time.Minute)
	if _, err := s.PutSubscription(ctx, pro, unwritable(entry("subscription.put", "", "product pro"))); err == nil {
		t.Error("PutSubscription with an entry that cannot be written succeeded")
	}
	if got, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || got.ProductID != "basic" {
		t.Errorf("subscription put without its audit entry: %+v, %v", got, err)
	}
	newSub := store.Subscription{UserID: "u2", ServiceID: "svc", ProductID: "basic", Status: "ACTIVE", UpdatedAt: T0}
	if _, err := s.PutSubscription(ctx, newSub, unwritable(entry("subscription.put", "", ""))); err == nil {
		t.Error("PutSubscription of a new subscription with an entry that cannot be written succeeded")
	}
	if got, err := s.GetSubscription(ctx, "u2", "svc"); !errors.Is(err, store.ErrNoAccount) {
		t.Errorf("new subscription put without its audit entry: %+v, %v", got, err)
	}
	if _, err := s.AddCredits(ctx, "u1", "svc", whole(5), T0, unwritable(entry("credits.add", "", "amount 5"))); err == nil {
		t.Error("AddCredits with an entry that cannot be written succeeded")
	}
	if got, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || got.Credits != whole(10) {
		t.Errorf("credits added without their audit entry: %+v, %v; want a balance of 10", got, err)
	}

	last, err := s.AppendAudit(ctx, entry("portal.sign_in", "", "after"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"after", "amount 10, balance 10", "two", "one", "product basic", "never expires", "before"}
	check := func(when string) {
		t.Helper()
		entries, _, err := s.ListAudit(ctx, "", 100)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for i, e := range entries {
			got = append(got, e.Detail)
			if i > 0 && e.Seq >= entries[i-1].Seq {
				t.Errorf("%s: entry %q has seq %d, not below the newer %d", when, e.Detail, e.Seq, entries[i-1].Seq)
			}
			if e.Seq < first.Seq || e.Seq > last.Seq || !e.Time.Equal(T0) || e.Actor != "admin-api 127.0.0.1:1" || e.UserID != "u1" {
				t.Errorf("%s: entry %+v (seqs %d to %d)", when, e, first.Seq, last.Seq)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%s: audit log %q, want %q", when, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: audit log %q, want %q", when, got, want)
			}
		}
		if entries[1].Action != "credits.add" || entries[1].ServiceID != "svc" || entries[2].Action != "key.revoke" ||
			entries[2].KeyID != "key_1" || entries[4].Action != "subscription.put" || entries[5].Action != "key.create" ||
			entries[5].KeyID != "key_1" {
			t.Errorf("%s: entries %+v", when, entries)
		}
		if k, err := s.KeyByID(ctx, "key_1"); err != nil || !k.RevokedAt.Equal(T0.Add(time.Minute)) {
			t.Errorf("%s: key_1 %+v, %v", when, k, err)
		}
	}
	check("before a restart")
	if c.reopen == nil {
		return
	}
	s = c.restart(t, s)
	check("after a restart")
	for _, id := range []string{"key_3", "key_dup"} {
		if _, err := s.KeyByID(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("after a restart: %s: %v, want ErrNotFound", id, err)
		}
	}
	if k, err := s.KeyByID(ctx, "key_2"); err != nil || !k.RevokedAt.IsZero() {
		t.Errorf("after a restart: key_2 %+v, %v", k, err)
	}
	if got, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || got.ProductID != "basic" || got.Credits != whole(10) {
		t.Errorf("after a restart: subscription %+v, %v", got, err)
	}
}

// testPruneLedgerAudited: a prune given its audit entry writes it with
// the removal (store.LedgerPruner), completed with what went: the rows the
// entries name are the rows that went (one entry in all, or one per
// PostgreSQL partition). An entry that cannot be written removes nothing;
// a prune that removes nothing writes none; the entries outlive a restart.
func testPruneLedgerAudited(t *testing.T, c *suite) {
	s := c.store(t)
	lp, _ := pruner(t, s)
	writeRollupRows(t, s)
	all := Ledger(t, s, store.LedgerFilter{})
	cut := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC) // a month past every row
	entry := store.AuditEntry{Time: T0, Actor: "admin-api 127.0.0.1:1", Action: "usage.prune",
		Detail: "raw ledger rows before " + cut.Format(time.RFC3339)}
	bad := entry
	bad.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := lp.PruneLedger(ctx, cut, bad); err == nil {
		t.Error("PruneLedger with an entry that cannot be written succeeded")
	}
	if rows := Ledger(t, s, store.LedgerFilter{}); len(rows) != len(all) {
		t.Fatalf("%d of %d rows left after a prune whose entry could not be written", len(rows), len(all))
	}
	if got, _, err := s.ListAudit(ctx, "", 10); err != nil || len(got) != 0 {
		t.Fatalf("audit log after a refused prune: %+v, %v", got, err)
	}
	res, err := lp.PruneLedger(ctx, cut, entry)
	if err != nil || res.Rows != int64(len(all)) || res.Segments == 0 {
		t.Fatalf("PruneLedger = %+v, %v; want the %d rows gone", res, err, len(all))
	}
	if _, err := lp.PruneLedger(ctx, cut, entry); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		got, _, err := s.ListAudit(ctx, "", 100)
		if err != nil || len(got) == 0 || len(got) > res.Segments {
			t.Fatalf("%s: audit log %+v, %v; want one entry per prune or partition of the first prune (%d)", when, got, err, res.Segments)
		}
		var segs int
		var rows, bytes int64
		for _, e := range got {
			var n int
			var r, b int64
			if _, err := fmt.Sscanf(e.Detail, entry.Detail+": %d segments, %d rows, %d bytes removed", &n, &r, &b); err != nil ||
				e.Action != entry.Action || e.Actor != entry.Actor || !e.Time.Equal(T0) {
				t.Fatalf("%s: entry %+v (%v)", when, e, err)
			}
			segs, rows, bytes = segs+n, rows+r, bytes+b
		}
		if segs != res.Segments || rows != res.Rows || bytes != res.Bytes {
			t.Errorf("%s: the entries name %d segments, %d rows, %d bytes; the prune removed %+v", when, segs, rows, bytes, res)
		}
	}
	check("after the prunes")
	if c.reopen != nil {
		s = c.restart(t, s)
		check("after a restart")
		if rows := Ledger(t, s, store.LedgerFilter{}); len(rows) != 0 {
			t.Errorf("%d rows after a restart", len(rows))
		}
	}
}
