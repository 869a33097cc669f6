package ledger

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// BenchmarkRollupFrame is what a seal holds the append lock for: the
// rollups that changed since the last frame (here a day of 100 users) in
// a ledger of 876,000 (100 users, every hour of a year).
func BenchmarkRollupFrame(b *testing.B) {
	r := newRollups()
	for u := range 100 {
		for h := range 8760 {
			e := store.LedgerEntry{UserID: fmt.Sprint("user-", u), ServiceID: "weather", EndpointID: "forecast", ProductID: "basic",
				Time: t0.Add(time.Duration(h) * time.Hour), Units: 1}
			r.add(&e)
		}
	}
	r.frame(1, false)
	b.ResetTimer()
	for i := range b.N {
		for u := range 100 {
			for h := range 24 {
				e := store.LedgerEntry{UserID: fmt.Sprint("user-", u), ServiceID: "weather", EndpointID: "forecast",
					ProductID: "basic", Time: t0.Add(time.Duration(8760-24+h) * time.Hour), Units: 1}
				r.add(&e)
			}
		}
		r.frame(uint64(i), false)
	}
}

// ledgerStore is a store whose ledger is l (only the ledger methods are
// there): what store.ScanUsage reads.
type ledgerStore struct {
	store.Store
	l *Ledger
}

func (s ledgerStore) ScanLedger(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error {
	return s.l.Scan(ctx, f, fn)
}

func (s ledgerStore) ScanRollups(ctx context.Context, f store.RollupFilter, fn func(store.Rollup) error) error {
	return s.l.ScanRollups(ctx, f, fn)
}

// BenchmarkMonthSummary is the console overview's read: the units of a
// 30-day month of a million rows (ten users, every hour), summed by
// store.ScanUsage from the hourly rollups, and from the raw rows (a store
// without rollups).
//
//	go test -run '^$' -bench MonthSummary -benchmem -cpu 1 ./internal/store/ledger
func BenchmarkMonthSummary(b *testing.B) {
	const n = 1_000_000
	l := open(b, b.TempDir(), Options{})
	defer l.Close()
	month := 30 * 24 * time.Hour
	es := make([]store.LedgerEntry, 0, 10000)
	var pos uint64
	for i := range n {
		e := syncEntry(uint64(i+1), t0.Add(time.Duration(i)*(month/n)))
		e.UserID = fmt.Sprint("user-", i%10)
		es = append(es, e)
		if len(es) == cap(es) {
			pos++
			if err := l.Append(es, pos); err != nil {
				b.Fatal(err)
			}
			es = es[:0]
		}
	}
	if err := l.Seal(); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		s    store.Store
	}{
		{"rollups", ledgerStore{l: l}},
		{"raw", struct{ store.Store }{ledgerStore{l: l}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				var calls int64
				if err := store.ScanUsage(context.Background(), c.s, store.LedgerFilter{From: t0, To: t0.Add(month)}, func(r store.Rollup) error {
					calls += r.Calls
					return nil
				}); err != nil || calls != n {
					b.Fatalf("%d calls: %v", calls, err)
				}
			}
		})
	}
}
