package engine

import (
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/platformgw/gateway/internal/billing"
)

// Limiters holds one token bucket per key and service. The platform app
// keeps one in a caddy.UsagePool shared by every config, so a reload does
// not hand every key a fresh burst.
type Limiters struct {
	mu sync.Mutex
	m  map[limiterKey]*bucket
}

// bucket is one token bucket and the latest time a call reached it. Calls
// reach it out of the order of their times (a call's time is read before
// its key and subscription are looked up), and rate.Limiter takes an older
// time as its new clock: the next call would be credited the interval
// between the two a second time. A call older than the latest counts as
// made at the latest, unless it is older by more than clockStep.
type bucket struct {
	mu   sync.Mutex
	lim  *rate.Limiter
	last time.Time
}

type limiterKey struct {
	keyID, serviceID string
	limit            billing.RateLimit
}

// clockStep is how much older than a bucket's latest call a call must be
// to be taken as the clock stepped back rather than as a call that took
// that long to reach the bucket (its key and subscription lookups). Times
// without a monotonic reading (the portal's, read in UTC) go back with
// the system clock; taken as made at the latest, they left a drained
// bucket empty until the clock caught up again.
const clockStep = time.Minute

// NewLimiters is an empty set of buckets.
func NewLimiters() *Limiters { return &Limiters{m: make(map[limiterKey]*bucket)} }

// maxLimiters bounds memory: past it, idle buckets (full again) are dropped.
const maxLimiters = 1 << 20

// Allow takes one token from the bucket of a key on a service. Refused, it
// says how long until a token is back. Allowed, it says how many whole
// tokens are left (never more than the burst) and how long until the next
// one is added (0 when the bucket is full): what the RateLimit header's r
// and t report.
func (s *Limiters) Allow(keyID, serviceID string, rl *billing.RateLimit, t time.Time) (ok bool, wait time.Duration, remaining int) {
	if rl == nil {
		return true, 0, -1
	}
	window, burst := rl.Window(), rl.Capacity()
	k := limiterKey{keyID: keyID, serviceID: serviceID, limit: *rl}
	s.mu.Lock()
	b := s.m[k]
	if b == nil {
		if len(s.m) >= maxLimiters {
			for key, l := range s.m {
				if l.lim.TokensAt(t) >= float64(l.lim.Burst()) {
					delete(s.m, key)
				}
			}
		}
		b = &bucket{lim: rate.NewLimiter(rate.Limit(float64(rl.Requests)/window.Seconds()), burst)}
		s.m[k] = b
	}
	s.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.Before(b.last) && b.last.Sub(t) <= clockStep {
		t = b.last
	} else {
		b.last = t
	}
	lim := b.lim
	r := lim.ReserveN(t, 1)
	if d := r.DelayFrom(t); d > 0 {
		r.CancelAt(t)
		return false, d, 0
	}
	// Whole tokens the bucket would grant now. It grants a call whose
	// missing fraction of a token would take under a nanosecond to refill
	// (the wait truncates to 0), so that much slack counts, and no more: a
	// fixed 1e-6 tokens is 86 ms of a `1/d` bucket, and r=1 was reported
	// with the next call refused.
	// A bucket at its burst is full whatever its size (a float64 of 2^63
	// tokens does not convert to an int).
	tokens := lim.TokensAt(t)
	granted := tokens + float64(lim.Limit())*1e-9
	if granted >= float64(burst) {
		return true, 0, burst
	}
	remaining = int(granted)
	if lim.Limit() <= 0 {
		return true, 0, remaining
	}
	need := float64(remaining+1) - tokens
	return true, time.Duration(need / float64(lim.Limit()) * float64(time.Second)), remaining
}

// Allow takes one token from the bucket of a key on a service
// (Limiters.Allow).
func (rt *Runtime) Allow(keyID, serviceID string, rl *billing.RateLimit, t time.Time) (ok bool, wait time.Duration, remaining int) {
	return rt.Limiters.Allow(keyID, serviceID, rl, t)
}
