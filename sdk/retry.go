package sdk

import (
	"math/rand/v2"
	"time"
)

// RetryPolicy bounds how a Client retries a request that failed for a
// reason that may pass: a network error (including a connection dropped
// after the server recorded the request), 429, 502, 503 or 504. Other
// answers, 4xx above all, are returned at once. Every attempt of a usage
// report carries the same Idempotency-Key, so a retry never counts twice.
type RetryPolicy struct {
	// MaxAttempts is the most attempts of one request, the first
	// included (default 4; 1 means no retry).
	MaxAttempts int
	// BaseDelay is the wait before the first retry (default 250 ms); it
	// doubles with each further one, up to MaxDelay (default 10 s). Each
	// wait is jittered into [d/2, d) so clients that failed together do
	// not retry together.
	BaseDelay, MaxDelay time.Duration
	// MaxRetryAfter is the longest Retry-After a Client waits out on a
	// 429 (default 1 minute). A longer one is returned as an *APIError
	// with RetryAfter set, for the caller to schedule.
	MaxRetryAfter time.Duration
}

// DefaultRetryPolicy is the policy of a Client without WithRetry.
var DefaultRetryPolicy = RetryPolicy{
	MaxAttempts:   4,
	BaseDelay:     250 * time.Millisecond,
	MaxDelay:      10 * time.Second,
	MaxRetryAfter: time.Minute,
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy
	if p.MaxAttempts > 0 {
		d.MaxAttempts = p.MaxAttempts
	}
	if p.BaseDelay > 0 {
		d.BaseDelay = p.BaseDelay
	}
	if p.MaxDelay > 0 {
		d.MaxDelay = p.MaxDelay
	}
	if p.MaxRetryAfter > 0 {
		d.MaxRetryAfter = p.MaxRetryAfter
	}
	if d.MaxDelay < d.BaseDelay {
		d.MaxDelay = d.BaseDelay
	}
	return d
}

// backoff is the jittered wait after the given failed attempt (1-based).
func (p RetryPolicy) backoff(attempt int) time.Duration {
	d := p.BaseDelay
	for i := 1; i < attempt && d < p.MaxDelay; i++ {
		d *= 2
	}
	d = min(d, p.MaxDelay)
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + rand.N(half)
}
