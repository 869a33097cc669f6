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
//
// The buckets of keys (Allow) and those of client networks (AllowClient:
// the portal's sign-in attempts, made before anyone is known) are two
// sets, each with its own lock and bound: anyone who can reach the portal
// can make client buckets, and a flood of them neither slows nor evicts a
// key's bucket.
type Limiters struct {
	keys, clients bucketSet
}

// bucketSet is a bounded set of buckets. Past max, each new bucket
// examines the next sweepBatch buckets of all, a ring, and drops those
// idle (full again): the cost of making room is a few buckets per new
// one, not the whole set under the lock, and every bucket is examined
// once every len(all)/sweepBatch new ones. Still at max after that, a
// new key's bucket is added past it (keys: every caller with a key keeps
// their own limit) or, in a set with shared, is its limit's one
// overflow bucket, which every new client past the bound shares (clients:
// a flood of addresses is limited as one).
type bucketSet struct {
	mu       sync.Mutex
	max      int
	shared   bool
	m        map[limiterKey]*bucket
	all      []*bucket
	next     int                           // where the next sweep starts in all
	overflow map[billing.RateLimit]*bucket // shared: limit -> the bucket of the clients past max
	examined int                           // buckets the sweeps examined (tests)
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
	// gone is set (under mu) when a sweep drops the bucket: a call that
	// found it in the set before then looks again, rather than take a
	// token from a bucket no later call sees.
	gone bool
	at   int // index in its set's all
	key  limiterKey
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
func NewLimiters() *Limiters {
	return &Limiters{
		keys:    bucketSet{max: maxLimiters, m: make(map[limiterKey]*bucket)},
		clients: bucketSet{max: maxClientLimiters, shared: true, m: make(map[limiterKey]*bucket)},
	}
}

const (
	// maxLimiters bounds the keys' buckets past which idle ones are
	// dropped. Only callers with a key make them, so past it they are
	// added anyway.
	maxLimiters = 1 << 20
	// maxClientLimiters bounds the client networks' buckets: past it, a
	// new network shares its limit's overflow bucket.
	maxClientLimiters = 1 << 16
	// sweepBatch is how many buckets a new bucket past the bound examines.
	sweepBatch = 8
)

// get is the bucket of k, made if there is none (rl is k's limit).
func (s *bucketSet) get(k limiterKey, rl *billing.RateLimit, t time.Time) *bucket {
	s.mu.Lock()
	b := s.m[k]
	if b == nil {
		b = s.add(k, rl, t)
	}
	s.mu.Unlock()
	return b
}

// add makes the bucket of k, making room first (s.mu held).
func (s *bucketSet) add(k limiterKey, rl *billing.RateLimit, t time.Time) *bucket {
	if len(s.m) >= s.max {
		s.sweep(t)
	}
	if len(s.m) >= s.max && s.shared {
		b := s.overflow[k.limit]
		if b == nil {
			if s.overflow == nil {
				s.overflow = make(map[billing.RateLimit]*bucket)
			}
			b = newBucket(rl)
			s.overflow[k.limit] = b
		}
		return b
	}
	b := newBucket(rl)
	b.key, b.at = k, len(s.all)
	s.all = append(s.all, b)
	s.m[k] = b
	return b
}

func newBucket(rl *billing.RateLimit) *bucket {
	return &bucket{lim: rate.NewLimiter(rate.Limit(float64(rl.Requests)/rl.Window().Seconds()), rl.Capacity())}
}

// sweep examines the next sweepBatch buckets and drops the idle ones
// (s.mu held).
func (s *bucketSet) sweep(t time.Time) {
	for range sweepBatch {
		if len(s.all) == 0 {
			return
		}
		if s.next >= len(s.all) {
			s.next = 0
		}
		b := s.all[s.next]
		s.examined++
		if !b.drop(t) {
			s.next++
			continue
		}
		// The last bucket takes b's place, and is examined next.
		last := s.all[len(s.all)-1]
		last.at = b.at
		s.all[b.at] = last
		s.all[len(s.all)-1] = nil
		s.all = s.all[:len(s.all)-1]
		delete(s.m, b.key)
	}
}

// drop marks b gone if it is idle: full at t, and no call in it.
func (b *bucket) drop(t time.Time) bool {
	if !b.mu.TryLock() {
		return false
	}
	defer b.mu.Unlock()
	b.gone = b.lim.TokensAt(t) >= float64(b.lim.Burst())
	return b.gone
}

// Allow takes one token from the bucket of a key on a service. Refused, it
// says how long until a token is back. Allowed, it says how many whole
// tokens are left (never more than the burst) and how long until the next
// one is added (0 when the bucket is full): what the RateLimit header's r
// and t report.
func (s *Limiters) Allow(keyID, serviceID string, rl *billing.RateLimit, t time.Time) (ok bool, wait time.Duration, remaining int) {
	return s.keys.allow(keyID, serviceID, rl, t)
}

// AllowClient takes one token from the bucket of a client network: the
// caller's address, or its network (a /64) when one client holds them
// all. These buckets are bounded apart from the keys': past the bound,
// new networks share one bucket (bucketSet).
func (s *Limiters) AllowClient(network string, rl *billing.RateLimit, t time.Time) (ok bool, wait time.Duration, remaining int) {
	return s.clients.allow(network, "", rl, t)
}

func (s *bucketSet) allow(keyID, serviceID string, rl *billing.RateLimit, t time.Time) (ok bool, wait time.Duration, remaining int) {
	if rl == nil {
		return true, 0, -1
	}
	k := limiterKey{keyID: keyID, serviceID: serviceID, limit: *rl}
	return s.take(s.get(k, rl, t), k, rl, t)
}

// take is allow on b, the bucket get gave for k, or on the one that
// replaced it if a sweep dropped b since.
func (s *bucketSet) take(b *bucket, k limiterKey, rl *billing.RateLimit, t time.Time) (ok bool, wait time.Duration, remaining int) {
	burst := rl.Capacity()
	b.mu.Lock()
	for b.gone {
		b.mu.Unlock()
		b = s.get(k, rl, t)
		b.mu.Lock()
	}
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

// AllowClient takes one token from the bucket of a client network
// (Limiters.AllowClient).
func (rt *Runtime) AllowClient(network string, rl *billing.RateLimit, t time.Time) (ok bool, wait time.Duration, remaining int) {
	return rt.Limiters.AllowClient(network, rl, t)
}
