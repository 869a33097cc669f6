package pgstore

import (
	"context"
	"testing"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/store"
	"github.com/platformgw/gateway/store/storetest"
)

// TestContract runs the contract every store keeps (store/storetest)
// against a fresh PostgreSQL database per case; a restart is Close and
// Open of a node with the same node id on the same database.
func TestContract(t *testing.T) {
	dsns := map[store.Store]string{}
	open := func(t *testing.T, dsn string) store.Store {
		s, err := Open(context.Background(), Options{DSN: dsn, NodeID: "contract"})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		dsns[s] = dsn
		return s
	}
	storetest.Run(t,
		func(t *testing.T) store.Store { return open(t, pgtest.DB(t)) },
		storetest.Reopen(func(t *testing.T, s store.Store) store.Store {
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return open(t, dsns[s])
		}),
	)
}
