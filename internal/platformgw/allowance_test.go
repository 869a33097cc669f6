package platformgw

import (
	"net/http"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// TestAllowanceRateHeaders: the token bucket in RateLimit-Policy,
// RateLimit and X-RateLimit-*: q is the burst, w the seconds to refill it,
// r never above q, t the seconds until the next token.
func TestAllowanceRateHeaders(t *testing.T) {
	cases := []struct {
		name                              string
		rl                                billing.RateLimit
		remaining                         int
		wait                              time.Duration
		policy, state, limit, left, reset string
	}{
		{"1/m burst 2, one call made", billing.RateLimit{Requests: 1, WindowSeconds: 60, Burst: 2}, 1, 60 * time.Second,
			`"rate";q=2;w=120`, `"rate";r=1;t=60`, "2", "1", "60"},
		{"1/m burst 2, empty", billing.RateLimit{Requests: 1, WindowSeconds: 60, Burst: 2}, 0, 49500 * time.Millisecond,
			`"rate";q=2;w=120`, `"rate";r=0;t=50`, "2", "0", "50"},
		{"20/s burst 40", billing.RateLimit{Requests: 20, WindowSeconds: 1, Burst: 40}, 39, 50 * time.Millisecond,
			`"rate";q=40;w=2`, `"rate";r=39;t=1`, "40", "39", "1"},
		{"default burst", billing.RateLimit{Requests: 20, WindowSeconds: 1}, 19, 50 * time.Millisecond,
			`"rate";q=20;w=1`, `"rate";r=19;t=1`, "20", "19", "1"},
		{"full bucket", billing.RateLimit{Requests: 5, WindowSeconds: 10}, 5, 0,
			`"rate";q=5;w=10`, `"rate";r=5;t=0`, "5", "5", "0"},
		{"w rounds up: 3/s burst 4", billing.RateLimit{Requests: 3, WindowSeconds: 1, Burst: 4}, 3, 300 * time.Millisecond,
			`"rate";q=4;w=2`, `"rate";r=3;t=1`, "4", "3", "1"},
		// burst × window past int64 (a Caddyfile takes any burst): w
		// saturates; it wrapped to a negative number.
		{"w saturates: 1/d burst 2^50", billing.RateLimit{Requests: 1, WindowSeconds: 86400, Burst: 1 << 50}, 1 << 50, 0,
			`"rate";q=1125899906842624;w=9223372036854775807`, `"rate";r=1125899906842624;t=0`, "1125899906842624", "1125899906842624", "0"},
		{"remaining clamped to q", billing.RateLimit{Requests: 1, WindowSeconds: 60, Burst: 2}, 7, 0,
			`"rate";q=2;w=120`, `"rate";r=2;t=0`, "2", "2", "0"},
	}
	for _, tc := range cases {
		var a allowance
		a.rate(&tc.rl, tc.remaining, tc.wait)
		h := http.Header{}
		a.write(h)
		got := []string{h.Get("RateLimit-Policy"), h.Get("RateLimit"), h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset")}
		want := []string{tc.policy, tc.state, tc.limit, tc.left, tc.reset}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%s: got %q, want %q", tc.name, got, want)
				break
			}
		}
	}
}
