package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// BenchmarkScanSealed streams a million sealed sync-call rows (the export
// path: decompress, decode, filter, hand over) and reports rows a second.
//
//	go test -run '^$' -bench ScanSealed -benchmem ./internal/store/ledger
func BenchmarkScanSealed(b *testing.B) {
	const n = 1_000_000
	l := open(b, b.TempDir(), Options{})
	defer l.Close()
	es := make([]store.LedgerEntry, 0, 10000)
	var pos uint64
	for i := range n {
		es = append(es, syncEntry(uint64(i+1), t0.Add(time.Duration(i)*time.Millisecond)))
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
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		rows := 0
		var units int64
		if err := l.Scan(context.Background(), store.LedgerFilter{}, func(e store.LedgerEntry) error {
			rows++
			units += int64(e.Units)
			return nil
		}); err != nil || rows != n {
			b.Fatalf("scanned %d rows: %v", rows, err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(0, "ns/op")
}
