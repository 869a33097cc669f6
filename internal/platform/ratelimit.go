package platform

import (
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/engine"
)

// limiterPool shares the rate limiters' buckets across config reloads, as
// stores shares the store file: Caddy provisions the new config before it
// cleans up the old one, so the buckets outlive a reload (which must not
// hand every key a fresh burst) and are dropped once no config uses them.
// The callers' hold estimates (engine.Claims) live and go with them: a
// reload must not put every hold back at its endpoint's cost.
var limiterPool = caddy.NewUsagePool()

// limiterPoolKey names the one set of buckets of the process: every
// config, whatever its store, limits the same keys.
const limiterPoolKey = "rate-limiters"

type pooledLimiters struct {
	*engine.Limiters
	claims *engine.Claims
}

func (pooledLimiters) Destruct() error { return nil }

// newLimiterSet takes a reference to the shared buckets; releaseLimiters
// (from Cleanup) drops it.
func newLimiterSet() (*engine.Limiters, *engine.Claims) {
	v, _, _ := limiterPool.LoadOrNew(limiterPoolKey, func() (caddy.Destructor, error) {
		return pooledLimiters{engine.NewLimiters(), engine.NewClaims()}, nil
	})
	p := v.(pooledLimiters)
	return p.Limiters, p.claims
}

func (a *App) releaseLimiters() {
	if a.limiters != nil {
		limiterPool.Delete(limiterPoolKey)
		a.limiters, a.claims = nil, nil
	}
}

// Allow takes one token from the bucket of a key on a service
// (engine.Limiters.Allow).
func (a *App) Allow(keyID, serviceID string, rl *billing.RateLimit, t time.Time) (ok bool, wait time.Duration, remaining int) {
	return a.limiters.Allow(keyID, serviceID, rl, t)
}
