package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// testPutSubscriptionIf: a conditional put writes only over the revision
// it names. Every put moves the revision on (a change of the balance
// does not); a put over the revision read is written, with its audit
// entry; one over a revision a put moved on since is ErrStale with the
// subscription as stored, and writes nothing, its entry neither; none
// stored is ErrNoAccount. Of puts racing over one revision, one wins.
// The revision survives a restart.
func testPutSubscriptionIf(t *testing.T, c *suite) {
	s := c.store(t)
	entry := func(detail string) store.AuditEntry {
		return store.AuditEntry{Time: T0, Actor: "stripe", Action: "subscription.stripe", UserID: "u1", ServiceID: "svc", Detail: detail}
	}
	audited := func() []string {
		t.Helper()
		es, _, err := s.ListAudit(ctx, "", 100)
		if err != nil {
			t.Fatal(err)
		}
		var ds []string
		for _, e := range es {
			ds = append(ds, e.Detail)
		}
		return ds
	}
	put := func(sub store.Subscription) store.Subscription {
		t.Helper()
		got, err := s.PutSubscription(ctx, sub)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	basic := store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: "basic", Status: "ACTIVE", UpdatedAt: T0}
	if _, err := s.PutSubscriptionIf(ctx, basic, 0, entry("none stored")); !errors.Is(err, store.ErrNoAccount) {
		t.Fatalf("PutSubscriptionIf with none stored: %v, want ErrNoAccount", err)
	}
	if _, err := s.GetSubscription(ctx, "u1", "svc"); !errors.Is(err, store.ErrNoAccount) {
		t.Fatalf("after a refused conditional put: %v, want none stored", err)
	}
	created := put(basic)
	if created.Revision != 1 {
		t.Fatalf("the first put's revision: %d, want 1", created.Revision)
	}
	if got, err := s.AddCredits(ctx, "u1", "svc", whole(5), T0.Add(time.Minute)); err != nil || got.Revision != 1 {
		t.Fatalf("AddCredits: revision %d (%v), want 1 kept", got.Revision, err)
	}
	read, err := s.GetSubscription(ctx, "u1", "svc")
	if err != nil || read.Revision != 1 {
		t.Fatalf("GetSubscription: revision %d (%v), want 1", read.Revision, err)
	}

	// The condition holds: written, the balance kept, the entry with it.
	pro := basic
	pro.ProductID, pro.Status, pro.EndsAt, pro.EndStatus = "pro", "CANCELLING", T0.Add(time.Hour), "CANCELLED"
	pro.Revision = 99 // the store's, not the put's
	got, err := s.PutSubscriptionIf(ctx, pro, read.Revision, entry("over revision 1"))
	if err != nil || got.ProductID != "pro" || got.Revision != 2 || got.Credits != whole(5) {
		t.Fatalf("PutSubscriptionIf over the revision read: %+v, %v; want pro, revision 2, 5 credits", got, err)
	}
	if got, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || got.ProductID != "pro" || got.Status != "CANCELLING" ||
		!got.EndsAt.Equal(T0.Add(time.Hour)) || got.Revision != 2 {
		t.Fatalf("after the conditional put: %+v, %v", got, err)
	}

	// Changed in between (an operator's put): refused, nothing written.
	operator := basic
	operator.ProductID, operator.Status = "payg", "ACTIVE"
	if got := put(operator); got.Revision != 3 {
		t.Fatalf("a put after it: revision %d, want 3", got.Revision)
	}
	before := audited()
	got, err = s.PutSubscriptionIf(ctx, pro, 2, entry("over revision 2, put over since"))
	if !errors.Is(err, store.ErrStale) || got.ProductID != "payg" || got.Revision != 3 {
		t.Fatalf("PutSubscriptionIf over a revision put over since: %+v, %v; want ErrStale with the stored payg at revision 3", got, err)
	}
	if got, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || got.ProductID != "payg" || !got.EndsAt.IsZero() ||
		got.Revision != 3 || got.Credits != whole(5) {
		t.Fatalf("after a refused conditional put: %+v, %v; want the operator's payg, revision 3", got, err)
	}
	if after := audited(); len(after) != len(before) {
		t.Fatalf("a refused conditional put appended audit entries: %q, before %q", after, before)
	}

	// Puts racing over one revision: one is written.
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	won, stale := 0, 0
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := basic
			sub.ProductID = string(rune('a' + i))
			_, err := s.PutSubscriptionIf(ctx, sub, 3)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, store.ErrStale):
				stale++
			default:
				t.Errorf("a racing conditional put: %v", err)
			}
		}()
	}
	wg.Wait()
	if won != 1 || stale != n-1 {
		t.Fatalf("%d conditional puts over one revision: %d written, %d stale; want 1 and %d", n, won, stale, n-1)
	}
	if got, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || got.Revision != 4 {
		t.Fatalf("after the race: revision %d (%v), want 4", got.Revision, err)
	}
	if c.reopen == nil {
		return
	}
	s = c.restart(t, s)
	if got, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || got.Revision != 4 {
		t.Fatalf("after a restart: revision %d (%v), want 4", got.Revision, err)
	}
	if _, err := s.PutSubscriptionIf(ctx, pro, 4); err != nil {
		t.Fatalf("PutSubscriptionIf over the revision kept across a restart: %v", err)
	}
}
