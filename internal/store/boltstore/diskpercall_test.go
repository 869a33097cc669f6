package boltstore

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/platformgw/gateway/internal/store"
)

// dirBytes is what du reports for dir: the blocks its files take.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDiskPerCall measures the disk the whole store directory (store
// file, settlement log, ledger directory) takes per sync call: DISK_CALLS
// calls (Reserve, then Settle with its ledger row) of one user and one
// product from 32 goroutines, as the gateway makes them. It only runs
// when DISK_CALLS is set (docs/performance.md has the numbers):
//
//	DISK_CALLS=45000 go test -run TestDiskPerCall -v ./internal/store/boltstore/
func TestDiskPerCall(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DISK_CALLS"))
	if n <= 0 {
		t.Skip("set DISK_CALLS to measure")
	}
	// Settlement log segments of 1 MiB instead of 64, so that the log
	// rotates within the run and its applied segments go, as they do in
	// a long run: what stays is the current segment, a fixed size.
	defer func(b int64) { logSegmentBytes = b }(logSegmentBytes)
	logSegmentBytes = 1 << 20
	dir := t.TempDir()
	path := filepath.Join(dir, "platform.db")
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	if err := s.applyAll(); err != nil {
		t.Fatal(err)
	}
	base := dirBytes(t, dir)
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := g; i < n; i += 32 {
				res, err := s.Reserve(ctx, a, whole(1), t0)
				dec := res.Decision
				if err != nil || !dec.Allowed {
					t.Errorf("Reserve: %+v %v", dec, err)
					return
				}
				e := entryFor(a, 0, time.Now())
				e.EndpointID, e.RequestID = "forecast", uuid.NewString()
				if _, err := s.Settle(ctx, res, whole(1), e); err != nil {
					t.Errorf("Settle: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := s.applyAll(); err != nil {
		t.Fatal(err)
	}
	perCall := func(b int64) float64 { return float64(b-base) / float64(n) }
	open := dirBytes(t, dir)
	ledgerOpen := dirBytes(t, LedgerDir(path))
	var logBytes int64
	segs := s.log.Segments()
	for _, p := range segs {
		if fi, err := os.Stat(p); err == nil {
			logBytes += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
	}
	fiOpen, _ := os.Stat(path)
	if got := len(ledger(t, s, store.LedgerFilter{})); got != n {
		t.Fatalf("%d ledger rows, want %d", got, n)
	}
	st := s.LedgerStats()
	if err := s.led.Seal(); err != nil {
		t.Fatal(err)
	}
	sealed := dirBytes(t, dir)
	s.Close()
	closed := dirBytes(t, dir)
	fi, _ := os.Stat(path)
	t.Logf("%d calls, 32 goroutines; directory before %d bytes", n, base)
	t.Logf("open, everything applied: %.1f bytes a call: ledger directory %.1f (its active segment raw; %d segments), settlement log %d bytes in %d segment(s) (the current one), store file %d bytes",
		perCall(open), float64(ledgerOpen)/float64(n), st.Segments, logBytes, len(segs), fiOpen.Size())
	t.Logf("after sealing the ledger's segment: %.1f bytes a call", perCall(sealed))
	t.Logf("closed: %.1f bytes a call (store file %d bytes)", perCall(closed), fi.Size())
	if perCall(open) > 50 {
		t.Errorf("%.1f bytes a call on disk with the store open, over the budget of 50", perCall(open))
	}
}
