package boltstore

import (
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// TestContract runs the contract every store keeps (internal/store/storetest)
// against a bbolt file in a temp dir; a restart is Close and Open of the
// same file.
func TestContract(t *testing.T) {
	storetest.Run(t,
		func(t *testing.T) store.Store { return openTemp(t) },
		storetest.Reopen(func(t *testing.T, s store.Store) store.Store {
			path := s.(*Store).Path()
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return openAt(t, path)
		}),
		// Reserve returns before its hold is durable; a write through the
		// commit loop after it lands after it.
		storetest.Sync(func(t *testing.T, s store.Store) {
			if err := s.(*Store).update(func(*bolt.Tx) error { return nil }); err != nil {
				t.Fatalf("waiting for earlier commits: %v", err)
			}
		}),
	)
}
