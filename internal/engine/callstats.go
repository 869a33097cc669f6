package engine

import (
	"sync"
	"time"
)

// Recent call figures for the operator console's overview: calls per
// second, the share of 4xx, 429 and 5xx answers and the latency the
// gateway adds (the time of a call outside its backend), over the last
// minute. A ring of one-second slots under a mutex held for a few
// increments: no allocation and no map per call.

// statsWindow is how many seconds the figures cover.
const statsWindow = 60

// latencyBounds are the upper bounds of the added-latency buckets; a
// percentile is reported as the bound of its bucket.
var latencyBounds = [...]time.Duration{
	50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	time.Second,
}

type callSlot struct {
	sec                     int64
	calls, c4xx, c429, c5xx uint64
	lat                     [len(latencyBounds) + 1]uint64
}

// Calls keeps the figures of the last statsWindow seconds. The zero value
// is ready; the platform app shares one across reloads.
type Calls struct {
	mu    sync.Mutex
	slots [statsWindow]callSlot
}

// ObserveCall counts an invoke call's answer and the latency the gateway
// added to it; platform_gateway calls it once per invoke call.
func (rt *Runtime) ObserveCall(status int, added time.Duration) {
	if rt.Calls != nil {
		rt.Calls.observe(time.Now().Unix(), status, added)
	}
}

func (s *Calls) observe(sec int64, status int, added time.Duration) {
	b := len(latencyBounds)
	for i, ub := range latencyBounds {
		if added <= ub {
			b = i
			break
		}
	}
	s.mu.Lock()
	sl := &s.slots[sec%statsWindow]
	if sl.sec != sec {
		*sl = callSlot{sec: sec}
	}
	sl.calls++
	switch {
	case status == 429:
		sl.c429++
		sl.c4xx++
	case status >= 500:
		sl.c5xx++
	case status >= 400:
		sl.c4xx++
	}
	sl.lat[b]++
	s.mu.Unlock()
}

// CallStats are the figures of the last minute.
type CallStats struct {
	Window    time.Duration
	Calls     uint64
	PerSecond float64
	// Shares of all calls, 0 to 1; 4xx includes 429.
	Share4xx, Share429, Share5xx float64
	// P50 and P99 of the added latency, as bucket bounds; zero with no
	// calls, and -1 when above the largest bound.
	P50, P99 time.Duration
}

// Recent returns the figures of the last minute.
func (s *Calls) Recent() CallStats { return s.snapshot(time.Now().Unix()) }

func (s *Calls) snapshot(now int64) CallStats {
	var sum callSlot
	s.mu.Lock()
	for _, sl := range s.slots {
		if sl.sec > now-statsWindow && sl.sec <= now {
			sum.calls += sl.calls
			sum.c4xx += sl.c4xx
			sum.c429 += sl.c429
			sum.c5xx += sl.c5xx
			for i, n := range sl.lat {
				sum.lat[i] += n
			}
		}
	}
	s.mu.Unlock()
	out := CallStats{Window: statsWindow * time.Second, Calls: sum.calls}
	if sum.calls == 0 {
		return out
	}
	n := float64(sum.calls)
	out.PerSecond = n / statsWindow
	out.Share4xx, out.Share429, out.Share5xx = float64(sum.c4xx)/n, float64(sum.c429)/n, float64(sum.c5xx)/n
	out.P50, out.P99 = percentile(sum.lat[:], sum.calls, 50), percentile(sum.lat[:], sum.calls, 99)
	return out
}

func percentile(lat []uint64, total uint64, p uint64) time.Duration {
	want := (total*p + 99) / 100
	var seen uint64
	for i, c := range lat {
		seen += c
		if seen >= want {
			if i == len(latencyBounds) {
				return -1
			}
			return latencyBounds[i]
		}
	}
	return -1
}
