package boltstore

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// A key revoked while callers hammer it is refused by the first lookup
// that starts after RevokeKey returns, however the lookups interleave
// with the commit: a lookup that read the old record from an older
// snapshot must not put it back in the cache.
func TestCacheRevokedKeyRefusedAtOnce(t *testing.T) {
	s := openTemp(t)
	for round := range 20 {
		k := store.KeyRecord{ID: fmt.Sprintf("key_%d", round), Hash: keyHash(fmt.Sprintf("sk_%d", round)), UserID: "u1", Created: t0}
		if err := s.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
		var revoked atomic.Bool
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					after := revoked.Load() // read before the lookup starts
					got, err := s.KeyByHash(ctx, k.Hash)
					if err != nil {
						t.Errorf("KeyByHash: %v", err)
						return
					}
					if after && got.RevokedAt.IsZero() {
						t.Errorf("round %d: a lookup started after RevokeKey returned saw the key unrevoked", round)
						return
					}
				}
			})
		}
		time.Sleep(2 * time.Millisecond)
		if _, err := s.RevokeKey(ctx, k.ID, t0); err != nil {
			t.Fatal(err)
		}
		revoked.Store(true)
		time.Sleep(2 * time.Millisecond)
		close(stop)
		wg.Wait()
		if t.Failed() {
			return
		}
	}
}

// A subscription change is seen by the next read, by the next Reserve in
// the commit loop, and by a Reserve committed in the same batch as the
// change.
func TestCacheSubscriptionChanges(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", prepaid, whole(10))
	if sub, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || sub.Credits != whole(10) {
		t.Fatalf("GetSubscription = %+v, %v", sub, err)
	}
	// Settled charges change the prepaid balance: the cache must not keep
	// the old one.
	res, err := s.Reserve(ctx, a, whole(4), t0)
	dec := res.Decision
	if err != nil || !dec.Allowed {
		t.Fatalf("Reserve: %+v, %v", dec, err)
	}
	if _, err := s.Settle(ctx, res, whole(4), entryFor(a, 0, t0)); err != nil {
		t.Fatal(err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.Credits != whole(9) { // 4 units at 0.25
		t.Errorf("credits after a settled charge = %s, want 9", sub.Credits)
	}
	if _, err := s.AddCredits(ctx, "u1", "svc", whole(-9), t0); err != nil {
		t.Fatal(err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.Credits != 0 {
		t.Errorf("credits after AddCredits = %s, want 0", sub.Credits)
	}
	if res, _ := s.Reserve(ctx, a, whole(1), t0); res.Decision.Allowed {
		t.Error("Reserve with no credits left was allowed: the commit loop read a stale balance")
	}

	// Credits added and a reservation made concurrently share commits; the
	// reservation must see the balance of the write before it.
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for i := range 40 {
		wg.Go(func() {
			if i%2 == 0 {
				if _, err := s.AddCredits(ctx, "u1", "svc", billing.Units(250_000), t0); err != nil {
					t.Error(err)
				}
				return
			}
			res, err := s.Reserve(ctx, a, whole(1), t0)
			dec := res.Decision
			if err != nil {
				t.Error(err)
				return
			}
			if dec.Allowed {
				allowed.Add(1)
				if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	sub, _ := s.GetSubscription(ctx, "u1", "svc")
	want := billing.Units(20*250_000) - billing.Units(allowed.Load()*250_000)
	if sub.Credits != want || sub.CreditsHeld != 0 {
		t.Errorf("after %d charged calls: credits %s held %s, want %s held 0", allowed.Load(), sub.Credits, sub.CreditsHeld, want)
	}

	// A changed status is seen at once.
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: "prepaid",
		Status: "SUSPENDED", UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.Status != "SUSPENDED" {
		t.Errorf("status after PutSubscription = %s", sub.Status)
	}
}

// A failed write rolls its batch back; the cache must not keep what the
// rolled-back transaction wrote.
func TestCacheRolledBackWrite(t *testing.T) {
	s := openTemp(t)
	subscribe(t, s, "u1", "svc", prepaid, whole(10))
	if _, err := s.GetSubscription(ctx, "u1", "svc"); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := s.update(func(tx *bolt.Tx) error {
		sub, err := s.readSub(tx, "u1", "svc")
		if err != nil {
			return err
		}
		sub.Credits = whole(1000)
		if err := s.writeSub(tx, sub); err != nil {
			return err
		}
		// Read back inside the transaction: the write, not the cache.
		if got, _ := s.readSub(tx, "u1", "svc"); got.Credits != whole(1000) {
			t.Errorf("read in the writing transaction = %s, want its own write", got.Credits)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("update = %v", err)
	}
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.Credits != whole(10) {
		t.Errorf("credits after a rolled back write = %s, want 10", sub.Credits)
	}
}

// The interleaving the generations guard against, step by step: a lookup
// misses, reads the key from a snapshot taken before the revocation
// commits, and only then fills the cache.
func TestCacheStaleFillRefused(t *testing.T) {
	s := openTemp(t)
	k := store.KeyRecord{ID: "key_1", Hash: keyHash("sk_1"), UserID: "u1", Created: t0}
	if err := s.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	_, cached, gen := s.cache.key(k.Hash)
	if cached {
		t.Fatal("a key nobody looked up is cached")
	}
	stale, err := s.KeyByID(ctx, k.ID) // the read from the old snapshot
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeKey(ctx, k.ID, t0); err != nil {
		t.Fatal(err)
	}
	s.cache.fillKey(stale, gen)
	if got, _ := s.KeyByHash(ctx, k.Hash); got.RevokedAt.IsZero() {
		t.Error("a record read before the revocation was cached after it")
	}

	// The same for a subscription.
	subscribe(t, s, "u1", "svc", quotaBlock, 0)
	key := subKey("u1", "svc")
	_, _, sgen := s.cache.sub(key)
	old, _ := s.GetSubscription(ctx, "u1", "svc")
	s.cache.drop(nil, map[string]struct{}{string(key): {}}, nil) // as after the next commit
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: "quota-block",
		Status: "CANCELLED", UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	s.cache.fillSub(key, old, sgen)
	if got, _ := s.GetSubscription(ctx, "u1", "svc"); got.Status != "CANCELLED" {
		t.Errorf("status %s: a subscription read before a change was cached after it", got.Status)
	}
}

// A polled job shows each change at once: progress, completion, expiry.
func TestCacheJobChanges(t *testing.T) {
	s := openTemp(t)
	j := store.Job{ID: "job-1", UserID: "u1", ServiceID: "svc", EndpointID: "e", Status: store.JobPending,
		CreatedAt: t0, UpdatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	status := func() store.Job {
		t.Helper()
		got, err := s.GetJob(ctx, j.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := status(); got.Status != store.JobPending {
		t.Fatalf("status %s", got.Status)
	}
	if _, err := s.UpdateJob(ctx, j.ID, func(j *store.Job) error {
		j.Status, j.PercentageComplete = store.JobRunning, 40
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := status(); got.Status != store.JobRunning || got.PercentageComplete != 40 {
		t.Errorf("after progress: %s %v%%", got.Status, got.PercentageComplete)
	}
	if n, err := s.ExpireJobs(ctx, t0.Add(2*time.Hour), "expired"); err != nil || n != 1 {
		t.Fatalf("ExpireJobs = %d, %v", n, err)
	}
	if got := status(); got.Status != store.JobFailed || got.ErrorMessage != "expired" {
		t.Errorf("after expiry: %s %q", got.Status, got.ErrorMessage)
	}

	// A large inline result is served, just not kept in the cache.
	big := store.Job{ID: "job-2", UserID: "u1", ServiceID: "svc", EndpointID: "e", Status: store.JobCompleted,
		Result: strings.Repeat("r", 2*jobCacheMaxResult), CreatedAt: t0, UpdatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	if err := s.CreateJob(ctx, big); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetJob(ctx, big.ID); err != nil || got.Result != big.Result {
		t.Fatalf("GetJob(large) = %d bytes, %v", len(got.Result), err)
	}
	if _, cached, _ := s.cache.job(big.ID); cached {
		t.Error("a job with a large result was cached")
	}
}
