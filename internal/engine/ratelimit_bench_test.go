package engine

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// BenchmarkLimitersAllow is the invoke path's cost per call: one token
// from the existing bucket of a key on a service.
func BenchmarkLimitersAllow(b *testing.B) {
	a := NewLimiters()
	rl := &billing.RateLimit{Requests: 1 << 30, WindowSeconds: 1}
	t0 := time.Now()
	a.Allow("key-bench", "svc", rl, t0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		a.Allow("key-bench", "svc", rl, t0.Add(time.Duration(i)))
	}
}

// fullOfBusyBuckets is a set of buckets at its bound, none of them idle
// (each has a token out that takes a day to come back): a flood.
func fullOfBusyBuckets(b *testing.B) (*Limiters, *billing.RateLimit, time.Time) {
	b.Helper()
	a := NewLimiters()
	rl := &billing.RateLimit{Requests: 1, WindowSeconds: 86400, Burst: 2}
	t0 := time.Now()
	for i := range maxLimiters {
		a.Allow("flood-"+strconv.Itoa(i), "svc", rl, t0)
	}
	return a, rl, t0
}

// BenchmarkLimitersNewKeyWhenFull is the cost of a new bucket once the
// set is at its bound and nothing in it is idle.
func BenchmarkLimitersNewKeyWhenFull(b *testing.B) {
	a, rl, t0 := fullOfBusyBuckets(b)
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = "new-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		a.Allow(keys[i], "svc", rl, t0)
	}
}

// BenchmarkLimitersAllowDuringFlood is an existing key's call while new
// keys keep arriving at a set at its bound with nothing idle: what the
// invoke path waits for under the set's lock.
func BenchmarkLimitersAllowDuringFlood(b *testing.B) {
	a, rl, t0 := fullOfBusyBuckets(b)
	own := &billing.RateLimit{Requests: 1 << 30, WindowSeconds: 1}
	a.Allow("key-bench", "svc", own, t0)
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; !stop.Load(); i++ {
			a.Allow("new-"+strconv.Itoa(i), "svc", rl, t0)
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		a.Allow("key-bench", "svc", own, t0.Add(time.Duration(i)))
	}
	b.StopTimer()
	stop.Store(true)
	<-done
}
