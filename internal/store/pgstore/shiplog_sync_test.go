package pgstore

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// syncFailFS is the OS's files, whose fdatasync fails while failing is
// set (a disk returning EIO).
type syncFailFS struct {
	vfs.FS
	failing *atomic.Bool
}

type syncFailFile struct {
	vfs.File
	failing *atomic.Bool
}

func (f syncFailFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return syncFailFile{file, f.failing}, nil
}

func (f syncFailFile) Datasync() error {
	if f.failing.Load() {
		return errors.New("input/output error (injected)")
	}
	return f.File.Datasync()
}

func (f syncFailFile) Sync() error {
	if f.failing.Load() {
		return errors.New("input/output error (injected)")
	}
	return f.File.Sync()
}

// A settle log node whose log cannot fdatasync a settlement waits for
// PostgreSQL to have it (docs/fleet.md, "Failure modes"); with the
// database down too, the wait ends after settleWait with the settlement
// still queued, and shipped once the database is back: the call is
// charged. Settle answered plain ErrUnavailable, which the gateway takes
// for a charge that failed (the caller's answer withheld, 503 "not
// charged"), where a settlement kept and written later is
// ErrSettlementPending, as the group commit answers it.
func TestSettleLogSyncFailureDuringOutageIsPending(t *testing.T) {
	old := settleWait
	settleWait = time.Second
	t.Cleanup(func() { settleWait = old })
	c := pgtest.Cluster(t, clusterPort())
	dsn := c.DB("pgstore")
	var failing atomic.Bool
	s := openNode(t, dsn, "a", func(o *Options) {
		o.LogDir, o.ShipInterval, o.LeaseMax, o.LeaseTTL = t.TempDir(), 20*time.Millisecond, units(100), 30*time.Second
		o.logFS = syncFailFS{vfs.OS, &failing}
	})
	subscribe(t, s, "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)}
	for range 4 {
		call(t, s, acct) // the lease grows past what the next call needs
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.Stop()
	failing.Store(true)
	ctx := context.Background()
	res, err := s.Reserve(ctx, acct, units(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve from the lease, the database down: %+v %v", res.Decision, err)
	}
	_, err = s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q",
		Source: store.SourceGateway})
	if !errors.Is(err, store.ErrSettlementPending) {
		t.Errorf("settle, the log's fdatasync failing and the database down: %v, want ErrSettlementPending (kept, written later)", err)
	}
	failing.Store(false)
	c.Start()
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Flush(fctx); err != nil {
		t.Fatalf("not shipped after the database came back: %v", err)
	}
	n, sum, _, _ := ledgerOf(t, s, acct)
	if n != 5 || sum != units(5) {
		t.Fatalf("%d entries of %s units, want 5: the settlement answered as failed was charged", n, sum)
	}
}
