package platformgw

import (
	"net/http"
	"strconv"
	"time"

	"github.com/platformgw/gateway/billing"
)

// allowance is what the caller may still do, sent on every invoke response
// as the IETF httpapi RateLimit-Policy / RateLimit fields and the older
// X-RateLimit-* headers (which describe the quota when there is one, else
// the rate limit; X-RateLimit-Reset is in seconds from now).
type allowance struct {
	set bool

	hasQuota                   bool
	quota, quotaLeft           int64 // whole units, remaining rounded down
	quotaWindow, quotaResetSec int64

	hasRate                  bool
	rateQ, rateLeft, rateWin int64
	rateResetSec             int64
}

// rate describes the token bucket of a rate limit in the draft's terms
// (docs/wire-contract.md has a worked example): the quota q is the bucket's
// capacity (the burst), the window w the seconds the bucket takes to refill
// from empty (burst × window / requests, rounded up, so q/w never promises
// more than the sustained rate), r the whole tokens left and t the seconds
// until the next token is added (0 when the bucket is full). r never
// exceeds q; with the default burst (= requests) q and w are the
// configured requests and window.
func (a *allowance) rate(rl *billing.RateLimit, remaining int, wait time.Duration) {
	if rl == nil {
		return
	}
	a.set, a.hasRate = true, true
	window := int64(max(rl.WindowSeconds, 1))
	burst := int64(rl.Burst)
	if burst <= 0 {
		burst = int64(rl.Requests)
	}
	a.rateQ = burst
	a.rateWin = window
	if rl.Requests > 0 {
		req := int64(rl.Requests)
		a.rateWin = max((burst*window+req-1)/req, 1)
	}
	a.rateLeft = min(int64(max(remaining, 0)), burst)
	a.rateResetSec = ceilSeconds(wait)
}

func (a *allowance) setQuota(p *billing.Product, st billing.State, start, end, now time.Time) {
	if p == nil || p.Quota == nil {
		return
	}
	a.set, a.hasQuota = true, true
	a.quota = int64(*p.Quota / billing.Scale)
	a.quotaLeft = int64(max(0, *p.Quota-st.Used-st.Reserved) / billing.Scale)
	a.quotaWindow = int64(end.Sub(start) / time.Second)
	a.quotaResetSec = max(ceilSeconds(end.Sub(now)), 1)
}

// resetAfter is how long until the binding limit resets.
func (a *allowance) resetAfter() time.Duration {
	if a.hasQuota {
		return time.Duration(a.quotaResetSec) * time.Second
	}
	return time.Duration(a.rateResetSec) * time.Second
}

func (a *allowance) write(h http.Header) {
	if !a.set {
		return
	}
	i := strconv.FormatInt
	var policy, state string
	if a.hasQuota {
		policy = `"quota";q=` + i(a.quota, 10) + `;w=` + i(a.quotaWindow, 10)
		state = `"quota";r=` + i(a.quotaLeft, 10) + `;t=` + i(a.quotaResetSec, 10)
	}
	if a.hasRate {
		if policy != "" {
			policy += ", "
			state += ", "
		}
		policy += `"rate";q=` + i(a.rateQ, 10) + `;w=` + i(a.rateWin, 10)
		state += `"rate";r=` + i(a.rateLeft, 10) + `;t=` + i(a.rateResetSec, 10)
	}
	h.Set("RateLimit-Policy", policy)
	h.Set("RateLimit", state)
	if a.hasQuota {
		h.Set("X-RateLimit-Limit", i(a.quota, 10))
		h.Set("X-RateLimit-Remaining", i(a.quotaLeft, 10))
		h.Set("X-RateLimit-Reset", i(a.quotaResetSec, 10))
	} else {
		h.Set("X-RateLimit-Limit", i(a.rateQ, 10))
		h.Set("X-RateLimit-Remaining", i(a.rateLeft, 10))
		h.Set("X-RateLimit-Reset", i(a.rateResetSec, 10))
	}
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
