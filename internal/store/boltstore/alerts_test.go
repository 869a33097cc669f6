package boltstore

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/platformgw/gateway/internal/store"
)

// TestChangedAccountsAfterCommit: a settled charge names its subscription
// once the commit is over, and only once.
func TestChangedAccountsAfterCommit(t *testing.T) {
	s := openTemp(t)
	refs, ready := s.ChangedAccounts() // turns the bookkeeping on
	if len(refs) != 0 {
		t.Fatalf("changes before any write: %v", refs)
	}
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0)
	s.ChangedAccounts()
	r, err := s.Reserve(ctx, a, whole(1), t0)
	d := r.Decision
	if err != nil || !d.Allowed {
		t.Fatalf("Reserve: %v %+v", err, d)
	}
	if _, err := s.Settle(ctx, r, whole(1), entryFor(a, whole(1), t0)); err != nil {
		t.Fatal(err)
	}
	// Settle returns once its commit is over, and published.
	select {
	case <-ready:
	default:
		t.Fatal("no signal after a committed charge")
	}
	refs, _ = s.ChangedAccounts()
	if len(refs) != 1 || refs[0] != (store.AccountRef{UserID: "u1", ServiceID: "svc"}) {
		t.Fatalf("changed %v, want u1/svc", refs)
	}
	if refs, _ := s.ChangedAccounts(); len(refs) != 0 {
		t.Fatalf("changed again without a write: %v", refs)
	}
}

// BenchmarkReserveSettleWithAlertFeed is BenchmarkReserveSettle with the
// usage alerts' change feed on and drained, as a gateway with alerts runs:
// compare the two for what the feed costs a call.
func BenchmarkReserveSettleWithAlertFeed(b *testing.B) {
	s := openTemp(b)
	const users = 64
	accounts := make([]store.Account, users)
	for i := range accounts {
		accounts[i] = subscribe(b, s, fmt.Sprintf("u%d", i), "svc", quotaAllow, 0)
		accounts[i].Product.SpendingCap = nil
	}
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			_, ready := s.ChangedAccounts()
			select {
			case <-stop:
				return
			case <-ready:
			}
		}
	}()
	defer func() { close(stop); <-drained }()
	var next atomic.Int64
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		a := accounts[next.Add(1)%users]
		for pb.Next() {
			res, err := s.Reserve(ctx, a, whole(1), t0)
			dec := res.Decision
			if err != nil || !dec.Allowed {
				b.Errorf("Reserve: %+v, %v", dec, err)
				return
			}
			if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
				b.Errorf("Settle: %v", err)
				return
			}
		}
	})
}
