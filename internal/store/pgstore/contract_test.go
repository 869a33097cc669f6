package pgstore

import (
	"context"
	"testing"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// TestContract runs the contract every store keeps (internal/store/storetest)
// against a fresh PostgreSQL database per case, with settle commit (and,
// as the platform gives it, a settlement log for what a stop cannot
// commit); a restart is Close and Open of a node with the same node id on
// the same database and log directory.
func TestContract(t *testing.T) {
	runContract(t, false)
}

// TestContractSettleLog runs the contract with the node's settlement log
// (shiplog.go): settlements acknowledged once in the log and shipped in
// the background; the suite's barrier waits for the shipper, and a
// restart reopens the same log directory.
func TestContractSettleLog(t *testing.T) {
	runContract(t, true)
}

func runContract(t *testing.T, withLog bool) {
	type opened struct{ dsn, dir string }
	nodes := map[store.Store]opened{}
	open := func(t *testing.T, o opened) store.Store {
		opts := Options{DSN: o.dsn, NodeID: "contract"}
		opts.LogDir, opts.SettleCommit = o.dir, !withLog
		s, err := Open(context.Background(), opts)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		nodes[s] = o
		return s
	}
	storetest.Run(t,
		func(t *testing.T) store.Store { return open(t, opened{pgtest.DB(t), t.TempDir()}) },
		storetest.Reopen(func(t *testing.T, s store.Store) store.Store {
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return open(t, nodes[s])
		}),
		storetest.Sync(func(t *testing.T, s store.Store) {
			if err := s.(*Store).Flush(context.Background()); err != nil {
				t.Fatalf("Flush: %v", err)
			}
		}),
	)
}
