package ledger

import (
	"fmt"
	"testing"
	"time"

	"github.com/platformgw/gateway/store"
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
