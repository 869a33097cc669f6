package boltstore

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// TestGroupCommit: 64 writers × 50 reports all land, in fewer fdatasyncs
// than reports.
func TestGroupCommit(t *testing.T) {
	const writers, each = 64, 50
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	var commits, writes atomic.Int64
	s.ObserveCommits(func(_ time.Duration, n int) {
		commits.Add(1)
		writes.Add(int64(n))
	})
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range writers {
		wg.Go(func() {
			for range each {
				if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d Record calls failed", failed.Load())
	}
	nw, nc := writes.Load(), commits.Load() // before stateOf's own write
	entries := ledger(t, s, store.LedgerFilter{})
	if len(entries) != writers*each || stateOf(t, s, a, t0).Used != whole(writers*each) {
		t.Fatalf("%d entries, Used %s; want %d", len(entries), stateOf(t, s, a, t0).Used, writers*each)
	}
	// Every report is one settlement record made durable by some fdatasync
	// of the log; the applier's commits of the file count as writes too.
	if nw < writers*each || nc >= writers*each {
		t.Errorf("%d writes in %d commits; want %d writes sharing commits", nw, nc, writers*each)
	}
	t.Logf("%d writes in %d commits", nw, nc)
}

// TestObserveCommitsWhileWriting: the platform app sets the observer in
// every Provision, on a store a previous config is still writing through
// (the store outlives reloads), so setting it must not race the commit loop.
func TestObserveCommitsWhileWriting(t *testing.T) {
	s := openTemp(t)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var seen atomic.Int64
	for range 50 {
		s.ObserveCommits(func(time.Duration, int) { seen.Add(1) })
	}
	wg.Wait()
	s.ObserveCommits(nil) // nil turns observing off
	if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
		t.Fatal(err)
	}
}

// TestCloseWhileWriting: writes racing Close either commit or fail with
// ErrClosed; none hangs, and every one reported committed is in the file.
func TestCloseWhileWriting(t *testing.T) {
	path := storePath(t)
	var committed int
	for round := range 30 {
		s := openAt(t, path)
		a := subscribe(t, s, "u1", "svc", unlimited, 0)
		var ok atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 16 {
			wg.Go(func() {
				<-start
				for range 5 {
					_, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse)
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, ErrClosed):
					default:
						t.Errorf("Record: %v", err)
					}
				}
			})
		}
		close(start)
		s.Close()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: writers still blocked 20s after Close", round)
		}
		committed += int(ok.Load())
	}
	s := openAt(t, path)
	if n := len(ledger(t, s, store.LedgerFilter{})); n != committed {
		t.Errorf("%d entries in the file, %d writes reported committed", n, committed)
	}
	if _, err := s.Record(ctx, store.Account{UserID: "u1", ServiceID: "svc", Free: true}, store.LedgerEntry{Time: t0}, okResponse); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := s.Record(ctx, store.Account{UserID: "u1", ServiceID: "svc", Free: true}, store.LedgerEntry{Time: t0}, okResponse); !errors.Is(err, ErrClosed) {
		t.Errorf("Record after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}
