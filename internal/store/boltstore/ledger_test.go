package boltstore

import (
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// TestScanLedgerLarge: a ledger of many appended batches streams every
// entry once, in order.
func TestScanLedgerLarge(t *testing.T) {
	const n = 9096 // several of the ledger's blocks and the applier's batches
	s := openTemp(t)
	a := subscribe(t, s, "a", "svc", unlimited, 0)
	b := subscribe(t, s, "b", "svc", unlimited, 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for w := range 32 {
		wg.Go(func() {
			for i := w; i < n; i += 32 {
				acc := a
				if i%11 == 0 { // b is sparse (under one in eight): its scans cross the scan bound with few matches
					acc = b
				}
				if _, err := s.Record(ctx, acc, entryFor(acc, whole(1), t0.Add(time.Duration(i)*time.Millisecond)), okResponse); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d Record calls failed: %v", len(errs), errs[0])
	}
	check := func(name string, f store.LedgerFilter, want int, keep func(store.LedgerEntry) bool) []store.LedgerEntry {
		t.Helper()
		got := ledger(t, s, f)
		seen := map[uint64]bool{}
		for i, e := range got {
			if seen[e.Seq] {
				t.Fatalf("%s: entry %d seen twice", name, e.Seq)
			}
			seen[e.Seq] = true
			if !keep(e) {
				t.Fatalf("%s: entry %+v does not match the filter", name, e)
			}
			if i > 0 && (e.Seq <= got[i-1].Seq || e.Time.Before(got[i-1].Time)) {
				t.Fatalf("%s: entry %d (%s) after %d (%s)", name, e.Seq, e.Time, got[i-1].Seq, got[i-1].Time)
			}
		}
		if len(got) != want {
			t.Fatalf("%s: %d entries, want %d", name, len(got), want)
		}
		return got
	}
	all := check("all", store.LedgerFilter{}, n, func(store.LedgerEntry) bool { return true })
	nb := (n + 10) / 11
	check("user a", store.LedgerFilter{UserID: "a"}, n-nb, func(e store.LedgerEntry) bool { return e.UserID == "a" })
	check("user b", store.LedgerFilter{UserID: "b"}, nb, func(e store.LedgerEntry) bool { return e.UserID == "b" })
	// Bounds in the middle of a chunk.
	from, to := all[1000].Time, all[7000].Time
	want := 0
	for _, e := range all {
		if !e.Time.Before(from) && e.Time.Before(to) {
			want++
		}
	}
	check("from, to", store.LedgerFilter{From: from, To: to}, want, func(e store.LedgerEntry) bool {
		return !e.Time.Before(from) && e.Time.Before(to)
	})
}
