package boltstore

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/store"
)

func TestScanLedger(t *testing.T) {
	s := openTemp(t)
	accounts := []store.Account{
		subscribe(t, s, "u1", "svc1", unlimited, 0),
		subscribe(t, s, "u2", "svc1", unlimited, 0),
		subscribe(t, s, "u1", "svc2", unlimited, 0),
	}
	// Ten entries a second apart: i%3 picks the account.
	for i := range 10 {
		a := accounts[i%3]
		if _, err := s.Record(ctx, a, entryFor(a, whole(int64(i+1)), t0.Add(time.Duration(i)*time.Second)), okResponse); err != nil {
			t.Fatal(err)
		}
	}
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	tests := []struct {
		name string
		f    store.LedgerFilter
		want []int // entries by index
	}{
		{"all", store.LedgerFilter{}, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"from is inclusive", store.LedgerFilter{From: at(3)}, []int{3, 4, 5, 6, 7, 8, 9}},
		{"to is exclusive", store.LedgerFilter{To: at(3)}, []int{0, 1, 2}},
		{"from and to", store.LedgerFilter{From: at(2), To: at(5)}, []int{2, 3, 4}},
		{"between entries", store.LedgerFilter{From: at(2).Add(time.Millisecond), To: at(5).Add(-time.Millisecond)}, []int{3, 4}},
		{"empty range", store.LedgerFilter{From: at(5), To: at(5)}, nil},
		{"after the last", store.LedgerFilter{From: at(10)}, nil},
		{"user", store.LedgerFilter{UserID: "u1"}, []int{0, 2, 3, 5, 6, 8, 9}},
		{"service", store.LedgerFilter{ServiceID: "svc1"}, []int{0, 1, 3, 4, 6, 7, 9}},
		{"user and service", store.LedgerFilter{UserID: "u1", ServiceID: "svc2"}, []int{2, 5, 8}},
		{"user, service and time", store.LedgerFilter{UserID: "u1", ServiceID: "svc1", From: at(1), To: at(9)}, []int{3, 6}},
		{"unknown user", store.LedgerFilter{UserID: "u3"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []int
			for _, e := range ledger(t, s, tt.f) {
				got = append(got, int(e.Units/whole(1))-1)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("entries %v, want %v", got, tt.want)
			}
		})
	}

	// Scanning stops at fn's first error and returns it.
	stop := errors.New("stop")
	calls := 0
	err := s.ScanLedger(ctx, store.LedgerFilter{}, func(store.LedgerEntry) error {
		calls++
		if calls == 4 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 4 {
		t.Errorf("ScanLedger = %v after %d calls, want stop after 4", err, calls)
	}
}

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
