package platform

import (
	"testing"
	"time"

	"github.com/platformgw/gateway/billing"
)

// TestAllowBurstSequence drives one bucket (1/m, burst 2) with an injected
// clock: remaining never exceeds the burst, and wait is the time until the
// next token (refused: until the one the call needs).
func TestAllowBurstSequence(t *testing.T) {
	a := &App{limiters: newLimiterSet()}
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
	a := &App{limiters: newLimiterSet()}
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
