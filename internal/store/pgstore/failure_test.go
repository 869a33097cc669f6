package pgstore

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// clusterPort is the port of the private cluster the tests that stop and
// start PostgreSQL use (never the shared server's): PGTEST_CLUSTER_PORT,
// else 25431.
func clusterPort() int { return pgtest.ClusterPort(25431) }

// The database restarting: calls a lease covers go on, others get
// ErrUnavailable (never a panic, never an over-serve), and the node
// recovers by itself once the server is back.
func TestDatabaseRestart(t *testing.T) {
	c := pgtest.Cluster(t, clusterPort())
	dsn := c.DB("pgstore")
	s := openNode(t, dsn, "a", func(o *Options) { o.LeaseTTL = 10 * time.Second })
	ctx := context.Background()
	subscribe(t, s, "u", "svc", "q")
	subscribe(t, s, "u", "other", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)}
	res, err := s.Reserve(ctx, acct, units(1), time.Now())
	dec := res.Decision
	if err != nil || !dec.Allowed {
		t.Fatal(dec, err)
	}
	if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc"}); err != nil {
		t.Fatal(err)
	}

	c.Stop()
	// The lease taken before covers further calls while it is valid...
	covered, err := s.Reserve(ctx, acct, units(1), time.Now())
	dec2 := covered.Decision
	if err != nil || !dec2.Allowed {
		t.Fatalf("a call the lease covers, database down: %+v %v", dec2, err)
	}
	// ...a subscription without a lease cannot be served.
	other := store.Account{UserID: "u", ServiceID: "other", Product: quotaProduct(1000)}
	if _, err := s.Reserve(ctx, other, units(1), time.Now()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("no lease, database down: %v, want ErrUnavailable", err)
	}
	if _, err := s.KeyByHash(ctx, sha256.Sum256([]byte("k"))); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("key lookup, database down: %v", err)
	}
	if err := s.CreateKey(ctx, store.KeyRecord{ID: "k2", UserID: "u"}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("write, database down: %v", err)
	}
	// The covered call's settlement waits for the database (bounded).
	done := make(chan error, 1)
	go func() {
		_, err := s.Settle(ctx, covered, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc"})
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	c.Start()
	if err := <-done; err != nil {
		t.Fatalf("settlement across the restart: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := s.Reserve(ctx, other, units(1), time.Now())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not recovered after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	st, err := s.State(ctx, acct, time.Now())
	if err != nil || st.Used != units(2) {
		t.Fatalf("after recovery: used %s (%v), want 2", st.Used, err)
	}
}
