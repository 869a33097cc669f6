package platformgw

import (
	"math"
	"math/bits"
	"net/http"
	"net/textproto"
	"strconv"
	"time"

	"github.com/platformgw/gateway/internal/billing"
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
	window := int64(rl.Window() / time.Second)
	burst := int64(rl.Capacity())
	a.rateQ = burst
	a.rateWin = window
	if rl.Requests > 0 {
		a.rateWin = max(refillSeconds(burst, window, int64(rl.Requests)), 1)
	}
	a.rateLeft = min(int64(max(remaining, 0)), burst)
	a.rateResetSec = billing.CeilSeconds(wait)
}

// refillSeconds is burst × window / requests rounded up, saturating at
// math.MaxInt64: the product of a huge burst and a long window wrapped.
func refillSeconds(burst, window, requests int64) int64 {
	hi, lo := bits.Mul64(uint64(burst), uint64(window))
	lo, carry := bits.Add64(lo, uint64(requests-1), 0)
	hi += carry
	if hi >= uint64(requests) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(requests))
	return int64(min(q, math.MaxInt64))
}

func (a *allowance) setQuota(p *billing.Product, st billing.State, start, end, now time.Time) {
	if p == nil || p.Quota == nil {
		return
	}
	a.set, a.hasQuota = true, true
	a.quota = int64(*p.Quota / billing.Scale)
	a.quotaLeft = int64(st.QuotaLeft(*p.Quota) / billing.Scale)
	a.quotaWindow = int64(end.Sub(start) / time.Second)
	a.quotaResetSec = max(billing.CeilSeconds(end.Sub(now)), 1)
}

// resetAfter is how long until the binding limit resets.
func (a *allowance) resetAfter() time.Duration {
	if a.hasQuota {
		return time.Duration(a.quotaResetSec) * time.Second
	}
	return time.Duration(a.rateResetSec) * time.Second
}

// The allowance headers' names as net/http's Header.Set spells them
// (Ratelimit-Policy, X-Ratelimit-Limit): write sets them in the map
// directly, where Set canonicalised (allocated) each name on every call.
var (
	rateLimitPolicyKey    = textproto.CanonicalMIMEHeaderKey("RateLimit-Policy")
	rateLimitKey          = textproto.CanonicalMIMEHeaderKey("RateLimit")
	rateLimitLimitKey     = textproto.CanonicalMIMEHeaderKey("X-RateLimit-Limit")
	rateLimitRemainingKey = textproto.CanonicalMIMEHeaderKey("X-RateLimit-Remaining")
	rateLimitResetKey     = textproto.CanonicalMIMEHeaderKey("X-RateLimit-Reset")
)

// write sets the allowance headers on h. The five values are built in one
// buffer and share one string and one backing array: two allocations.
func (a *allowance) write(h http.Header) {
	if !a.set {
		return
	}
	var buf [320]byte // 5 × up to 20 digits and the fixed text
	b := buf[:0]
	if a.hasQuota {
		b = append(b, `"quota";q=`...)
		b = strconv.AppendInt(b, a.quota, 10)
		b = append(b, `;w=`...)
		b = strconv.AppendInt(b, a.quotaWindow, 10)
	}
	if a.hasRate {
		if a.hasQuota {
			b = append(b, ", "...)
		}
		b = append(b, `"rate";q=`...)
		b = strconv.AppendInt(b, a.rateQ, 10)
		b = append(b, `;w=`...)
		b = strconv.AppendInt(b, a.rateWin, 10)
	}
	policyEnd := len(b)
	if a.hasQuota {
		b = append(b, `"quota";r=`...)
		b = strconv.AppendInt(b, a.quotaLeft, 10)
		b = append(b, `;t=`...)
		b = strconv.AppendInt(b, a.quotaResetSec, 10)
	}
	if a.hasRate {
		if a.hasQuota {
			b = append(b, ", "...)
		}
		b = append(b, `"rate";r=`...)
		b = strconv.AppendInt(b, a.rateLeft, 10)
		b = append(b, `;t=`...)
		b = strconv.AppendInt(b, a.rateResetSec, 10)
	}
	stateEnd := len(b)
	// The older headers describe the quota when there is one.
	limit, left, reset := a.rateQ, a.rateLeft, a.rateResetSec
	if a.hasQuota {
		limit, left, reset = a.quota, a.quotaLeft, a.quotaResetSec
	}
	b = strconv.AppendInt(b, limit, 10)
	limitEnd := len(b)
	b = strconv.AppendInt(b, left, 10)
	leftEnd := len(b)
	b = strconv.AppendInt(b, reset, 10)
	s := string(b)
	v := &[5]string{s[:policyEnd], s[policyEnd:stateEnd], s[stateEnd:limitEnd], s[limitEnd:leftEnd], s[leftEnd:]}
	h[rateLimitPolicyKey] = v[0:1:1]
	h[rateLimitKey] = v[1:2:2]
	h[rateLimitLimitKey] = v[2:3:3]
	h[rateLimitRemainingKey] = v[3:4:4]
	h[rateLimitResetKey] = v[4:5:5]
}
