package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// TestAllowBurstSequence drives one bucket (1/m, burst 2) with an injected
// clock: remaining never exceeds the burst, and wait is the time until the
// next token (refused: until the one the call needs).
func TestAllowBurstSequence(t *testing.T) {
	a := NewLimiters()
	rl := &billing.RateLimit{Requests: 1, WindowSeconds: 60, Burst: 2}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		at        time.Duration
		ok        bool
		wait      time.Duration
		remaining int
	}{
		{0, true, 60 * time.Second, 1},
		{10 * time.Second, true, 50 * time.Second, 0},
		{20 * time.Second, false, 40 * time.Second, 0},
		{60 * time.Second, true, 60 * time.Second, 0},
		{200 * time.Second, true, 60 * time.Second, 1},
		{320 * time.Second, true, 60 * time.Second, 1}, // full again, one taken
	}
	for i, s := range steps {
		ok, wait, remaining := a.Allow("key-burst-seq", "svc", rl, t0.Add(s.at))
		if ok != s.ok || remaining != s.remaining || (wait-s.wait).Abs() > time.Millisecond {
			t.Errorf("step %d at %v: ok %v wait %v remaining %d, want %v %v %d", i, s.at, ok, wait, remaining, s.ok, s.wait, s.remaining)
		}
		if remaining > rl.Burst {
			t.Errorf("step %d: remaining %d over the burst %d", i, remaining, rl.Burst)
		}
	}
}

// TestAllowDefaultBurst: without a burst the bucket holds `requests`; a
// full bucket after the call reports no wait.
func TestAllowDefaultBurst(t *testing.T) {
	a := NewLimiters()
	rl := &billing.RateLimit{Requests: 20, WindowSeconds: 1}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ok, wait, remaining := a.Allow("key-default-burst", "svc", rl, t0)
	if !ok || remaining != 19 || (wait-50*time.Millisecond).Abs() > time.Millisecond {
		t.Errorf("first call: %v %v %d", ok, wait, remaining)
	}
	ok, wait, remaining = a.Allow("key-default-burst", "svc", rl, t0.Add(time.Hour))
	if !ok || remaining != 19 {
		t.Errorf("an hour later: %v %v %d", ok, wait, remaining)
	}
	if ok, wait, remaining := a.Allow("k", "s", nil, t0); !ok || wait != 0 || remaining != -1 {
		t.Errorf("no rate limit: %v %v %d", ok, wait, remaining)
	}
}

// TestAllowRemainingIsGranted: the remaining count an allowed call reports
// is exactly how many more calls the bucket grants at that instant. A
// slack of 1e-6 tokens made it round up near a refill: on `1/d burst 2`, a
// call 50 ms before the second token was back said r=1, and a call right
// after it got 429 (1e-6 tokens of that bucket is 86 ms).
func TestAllowRemainingIsGranted(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Replays steps[:n+1] on a fresh bucket for each n, then checks at
	// the last step without disturbing the history before it.
	check := func(name string, rl *billing.RateLimit, steps []time.Duration) {
		t.Helper()
		a := NewLimiters()
		for n := range steps {
			key := fmt.Sprintf("key-granted-%s-%d", name, n)
			for _, at := range steps[:n] {
				a.Allow(key, "svc", rl, t0.Add(at))
			}
			now := t0.Add(steps[n])
			ok, _, remaining := a.Allow(key, "svc", rl, now)
			if !ok {
				continue
			}
			for j := 0; j < remaining; j++ {
				if ok, wait, _ := a.Allow(key, "svc", rl, now); !ok {
					t.Errorf("%s step %d at %v: said %d remaining, call %d refused (wait %v)", name, n, steps[n], remaining, j+1, wait)
					break
				}
			}
			if ok, _, _ := a.Allow(key, "svc", rl, now); ok {
				t.Errorf("%s step %d at %v: said %d remaining, one more was granted", name, n, steps[n], remaining)
			}
		}
	}
	day := 24 * time.Hour
	check("1/d", &billing.RateLimit{Requests: 1, WindowSeconds: 86400, Burst: 2},
		[]time.Duration{0, day - 50*time.Millisecond, 3 * day, 4*day - time.Millisecond})
	check("1/m", &billing.RateLimit{Requests: 1, WindowSeconds: 60, Burst: 2},
		[]time.Duration{0, 10 * time.Second, 60 * time.Second, 119999 * time.Millisecond, 200 * time.Second})
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, rl := range []*billing.RateLimit{
		{Requests: 20, WindowSeconds: 1}, {Requests: 100, WindowSeconds: 10, Burst: 7}, {Requests: 5000, WindowSeconds: 86400, Burst: 3},
	} {
		var steps []time.Duration
		var at time.Duration
		for range 60 {
			at += time.Duration(rnd.Int64N(int64(2 * time.Duration(rl.WindowSeconds) * time.Second / time.Duration(rl.Requests))))
			steps = append(steps, at)
		}
		check(fmt.Sprintf("%d/%ds-burst-%d", rl.Requests, rl.WindowSeconds, rl.Burst), rl, steps)
	}
}

// TestAllowOutOfOrderTimes: calls reach the bucket out of the order of
// their times (each call's time is read when it arrives, before the key
// and subscription lookups, so a call that arrived first can reach the
// bucket last). A call older than the bucket's last one used to move the
// bucket's clock back, and the next call was credited that interval a
// second time: on `10/s`, ten calls at 1 s, one at 0.5 s (refused), and
// five more at 1 s were granted. Over a second of 32 concurrent callers
// with up to 3 ms between arriving and reaching the bucket, `100/s burst 1`
// granted some 600 calls.
func TestAllowOutOfOrderTimes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rl := &billing.RateLimit{Requests: 10, WindowSeconds: 1}
	a := NewLimiters()
	for i := range 10 {
		if ok, _, _ := a.Allow("key-out-of-order", "svc", rl, t0.Add(time.Second)); !ok {
			t.Fatalf("call %d of the burst refused", i+1)
		}
	}
	if ok, _, _ := a.Allow("key-out-of-order", "svc", rl, t0.Add(500*time.Millisecond)); ok {
		t.Errorf("a call older than the drained bucket's last was granted")
	}
	if ok, wait, remaining := a.Allow("key-out-of-order", "svc", rl, t0.Add(time.Second)); ok {
		t.Errorf("the drained bucket granted a call (remaining %d): a straggler moved its clock back", remaining)
	} else if (wait - 100*time.Millisecond).Abs() > time.Millisecond {
		t.Errorf("wait %v, want 100ms", wait)
	}

	// An older call that is granted must not move the clock back either.
	rl = &billing.RateLimit{Requests: 1, WindowSeconds: 1, Burst: 2}
	if ok, _, _ := a.Allow("key-out-of-order-2", "svc", rl, t0.Add(10*time.Second)); !ok {
		t.Fatal("first call refused")
	}
	if ok, _, _ := a.Allow("key-out-of-order-2", "svc", rl, t0.Add(9*time.Second)); !ok {
		t.Fatal("second call of the burst refused")
	}
	if ok, _, remaining := a.Allow("key-out-of-order-2", "svc", rl, t0.Add(10*time.Second)); ok {
		t.Errorf("the drained bucket granted a call at 10 s (remaining %d)", remaining)
	}
}

// TestAllowHugeBurst: a burst as large as an int (the Caddyfile takes
// any) reports a full bucket as full. The whole tokens left, a float64
// of 2^63, converted to a negative int: the first call said remaining
// -2^63 and a negative wait, and the caller was shown r=0.
func TestAllowHugeBurst(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewLimiters()
	for _, burst := range []int{1 << 53, 1 << 62, math.MaxInt64} {
		rl := &billing.RateLimit{Requests: 1, WindowSeconds: 1, Burst: burst}
		ok, wait, remaining := a.Allow(fmt.Sprint("key-huge-", burst), "svc", rl, t0)
		if !ok || wait < 0 || remaining < burst/2 {
			t.Errorf("burst %d, first call: ok %v, wait %v, remaining %d", burst, ok, wait, remaining)
		}
	}
}

// TestAllowClockSteppedBack: times without a monotonic reading (the
// portal's limits read the clock in UTC) go back when the system clock is
// stepped back. A bucket that took every older call as made at its latest
// would refill only once the clock had caught up again: an hour's step
// locked a drained bucket for an hour. A call that much older is taken as
// the clock stepped back, and the bucket refills from it.
func TestAllowClockSteppedBack(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	rl := &billing.RateLimit{Requests: 1, WindowSeconds: 60}
	a := NewLimiters()
	if ok, _, _ := a.Allow("key-clock-step", "svc", rl, t0); !ok {
		t.Fatal("first call refused")
	}
	back := t0.Add(-time.Hour)
	if ok, _, _ := a.Allow("key-clock-step", "svc", rl, back); ok {
		t.Error("the drained bucket granted a call as the clock stepped back")
	}
	if ok, wait, _ := a.Allow("key-clock-step", "svc", rl, back.Add(61*time.Second)); !ok {
		t.Errorf("a minute after the clock stepped back an hour, still refused (wait %v)", wait)
	}
}

// TestLimitersFloodSweepBounded: past its bound, the set made room for a
// new bucket by examining every bucket in it, under the lock every call
// takes. Full of buckets none of which is idle (a flood of keys each with
// a token out), every new bucket examined them all again: at the bound of
// 2^20 a new key took close to a second (BenchmarkLimitersNewKeyWhenFull)
// and an existing key's call waited seconds behind the scans
// (BenchmarkLimitersAllowDuringFlood). A new bucket examines a few
// buckets at most, still limits like any other, and idle buckets still
// make room.
func TestLimitersFloodSweepBounded(t *testing.T) {
	const bound = 1000
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	busy := &billing.RateLimit{Requests: 1, WindowSeconds: 86400, Burst: 2}
	a := NewLimiters()
	a.keys.max = bound
	for i := range bound {
		a.Allow(fmt.Sprint("flood-", i), "svc", busy, t0)
	}
	examined := a.keys.examined
	for i := range bound {
		key := fmt.Sprint("new-", i)
		for j := range 2 {
			if ok, _, _ := a.Allow(key, "svc", busy, t0); !ok {
				t.Fatalf("new key %d, call %d of its burst refused", i, j+1)
			}
		}
		if ok, _, _ := a.Allow(key, "svc", busy, t0); ok {
			t.Fatalf("new key %d: a third call on a burst of 2 was granted", i)
		}
	}
	if per := (a.keys.examined - examined) / bound; per > 32 {
		t.Errorf("each new bucket examined %d buckets of a full set (bound %d)", per, bound)
	}
	// Two days on, every bucket is full again: new ones take their room.
	later := t0.Add(48 * time.Hour)
	for i := range bound {
		a.Allow(fmt.Sprint("later-", i), "svc", busy, later)
	}
	old := 0
	for k := range a.keys.m {
		if !strings.HasPrefix(k.keyID, "later-") {
			old++
		}
	}
	if old > 0 {
		t.Errorf("%d idle buckets left after %d new ones past the bound", old, bound)
	}
}

// TestAllowClientFloodBounded: the portal's sign-in buckets, one per
// client network, are made by anyone who reaches it. They are a set of
// their own, bounded: a flood of networks neither grows the keys' set nor
// examines it, past its bound new networks share one bucket (limited as
// one client, not unlimited), and once the flood's buckets are idle
// again a new network has its own.
func TestAllowClientFloodBounded(t *testing.T) {
	const bound, flood = 100, 5000
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	signIn := &billing.RateLimit{Requests: 10, WindowSeconds: 60}
	invoke := &billing.RateLimit{Requests: 1, WindowSeconds: 60, Burst: 2}
	a := NewLimiters()
	a.clients.max = bound
	if ok, _, _ := a.Allow("key-beside-flood", "svc", invoke, t0); !ok {
		t.Fatal("the key's first call refused")
	}
	granted := 0
	for i := range flood {
		if ok, _, _ := a.AllowClient(fmt.Sprintf("2001:db8:%x::/64", i), signIn, t0); ok {
			granted++
		}
	}
	if granted > bound+signIn.Capacity() {
		t.Errorf("%d networks past a bound of %d: %d attempts granted, want at most %d",
			flood, bound, granted, bound+signIn.Capacity())
	}
	if n := len(a.clients.m); n > bound {
		t.Errorf("%d client buckets, bound %d", n, bound)
	}
	if len(a.keys.m) != 1 || a.keys.examined != 0 {
		t.Errorf("the client flood reached the keys' set: %d buckets, %d examined", len(a.keys.m), a.keys.examined)
	}
	if ok, _, _ := a.Allow("key-beside-flood", "svc", invoke, t0); !ok {
		t.Error("the key's second call of its burst refused")
	}
	if ok, _, _ := a.Allow("key-beside-flood", "svc", invoke, t0); ok {
		t.Error("the key's third call on a burst of 2 granted")
	}
	// A minute on, the flood's buckets are full again: a new network
	// has a bucket of its own, its whole burst.
	later := t0.Add(time.Minute)
	for i := range signIn.Capacity() {
		if ok, _, _ := a.AllowClient("2001:db8:ffff::/64", signIn, later); !ok {
			t.Fatalf("a network after the flood: attempt %d refused", i+1)
		}
	}
}

// TestAllowSweptBucketNotUsed: a call that found a bucket in the set just
// before a sweep dropped it (it was full: idle) took its token from the
// dropped bucket, which no later call sees: the key's next calls had a
// fresh full bucket, one call more than its burst.
func TestAllowSweptBucketNotUsed(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rl := &billing.RateLimit{Requests: 1, WindowSeconds: 86400, Burst: 2}
	a := NewLimiters()
	a.keys.max = 1
	k := limiterKey{keyID: "key-swept", serviceID: "svc", limit: *rl}
	b := a.keys.get(k, rl, t0) // the call has its bucket, not yet a token
	a.Allow("key-sweeper", "svc", rl, t0)
	if _, ok := a.keys.m[k]; ok {
		t.Fatal("the sweep kept the idle bucket")
	}
	granted := 0
	if ok, _, _ := a.keys.take(b, k, rl, t0); ok {
		granted++
	}
	for range 3 {
		if ok, _, _ := a.Allow("key-swept", "svc", rl, t0); ok {
			granted++
		}
	}
	if granted != 2 {
		t.Errorf("%d calls granted at one instant on a burst of 2", granted)
	}
}
