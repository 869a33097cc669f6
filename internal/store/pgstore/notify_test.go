package pgstore

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// waitRevoked polls b's key lookup until it shows the revocation, for at
// most limit.
func waitRevoked(t *testing.T, b *Store, h [32]byte, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		k, err := b.KeyByHash(context.Background(), h)
		if err != nil {
			t.Fatal(err)
		}
		if !k.RevokedAt.IsZero() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node b still serves the key %s after its revocation on a", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A key revoked on one node is refused by another within a second: by
// NOTIFY while the notification connection is up, by the cache's TTL
// while it is down.
func TestRevocationReachesOtherNodes(t *testing.T) {
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	ctx := context.Background()
	for i, name := range []string{"k1", "k2"} {
		h := sha256.Sum256([]byte(name))
		k := store.KeyRecord{ID: name, Hash: h, UserID: "u", Created: time.Now()}
		if err := a.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
		if _, err := b.KeyByHash(ctx, h); err != nil { // cached on b
			t.Fatal(err)
		}
		if i == 1 {
			b.listen.close() // the notification connection down
			if b.listen.up() {
				b.listen.isUp.Store(false)
			}
		} else {
			deadline := time.Now().Add(5 * time.Second)
			for !b.listen.up() && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if _, err := a.RevokeKey(ctx, name, time.Now()); err != nil {
			t.Fatal(err)
		}
		waitRevoked(t, b, h, time.Second+200*time.Millisecond)
	}
}

// A credit change on one node is seen by another's subscription lookups.
func TestCreditChangeReachesOtherNodes(t *testing.T) {
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	ctx := context.Background()
	subscribe(t, a, "u", "svc", "pp")
	if _, err := b.GetSubscription(ctx, "u", "svc"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AddCredits(ctx, "u", "svc", units(5), time.Now()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second + 200*time.Millisecond)
	for {
		sub, err := b.GetSubscription(ctx, "u", "svc")
		if err != nil {
			t.Fatal(err)
		}
		if sub.Credits == units(5) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("b still shows %s credits", sub.Credits)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
