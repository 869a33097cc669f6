package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// openNode opens a store ("a node") on dsn, closed when the test ends.
func openNode(t testing.TB, dsn, node string, tune ...func(*Options)) *Store {
	t.Helper()
	o := Options{DSN: dsn, NodeID: node}
	for _, f := range tune {
		f(&o)
	}
	s, err := Open(context.Background(), o)
	if err != nil {
		t.Fatalf("open %s: %v", node, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func units(n int64) billing.Units { return billing.Whole(n) }

func ptr(u billing.Units) *billing.Units { return &u }

// subscribe stores an active subscription started now.
func subscribe(t testing.TB, s *Store, user, service, product string) {
	t.Helper()
	now := time.Now().UTC()
	if _, err := s.PutSubscription(context.Background(), store.Subscription{UserID: user, ServiceID: service, ProductID: product,
		Status: "ACTIVE", StartedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
}
