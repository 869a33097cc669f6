package platform

import (
	"context"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// What the admin API computes and other handlers show too (the caller
// portal): the same figures, from one place. Key creation is CreateKey
// (operations.go), audited.

// Summarize reads the billing period of sub that contains at, under the
// product of the running catalog.
func (a *App) Summarize(ctx context.Context, sub store.Subscription, at time.Time) (PeriodSummary, error) {
	return summarize(ctx, a, sub, at)
}

// KeyStatus is how a key is shown: active, expired or revoked at now.
func KeyStatus(k store.KeyRecord, now time.Time) string { return string(k.Status(now)) }
