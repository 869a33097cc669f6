package store

import (
	"context"
	"fmt"

	"github.com/platformgw/gateway/internal/billing"
)

// Checks both stores make before they touch anything, the same way.

// CheckUnits refuses a negative quantity before it reaches a counter:
// billing arithmetic takes it at face value, so a negative hold or charge
// widened the quota (and refunded credits) for every other call.
func CheckUnits(u billing.Units) error {
	if u < 0 {
		return fmt.Errorf("negative quantity %s: %w", u, billing.ErrInvalidUnits)
	}
	return nil
}

// CtxErr is ctx.Err(), nil for a nil context: a store checks it before it
// starts a change, so that a caller who gave up is not served. (Once a
// boltstore write is queued it is waited for whatever the context says:
// its effect is unknown until it is durable.)
func CtxErr(ctx context.Context) error {
	if ctx == nil {
		return nil
	}
	return ctx.Err()
}

// PricingState is the state that usage reported after the fact (a report,
// a job's completion) is priced against: the quota actually consumed, not
// the holds of the calls in flight (billing.DecideCharge says why). Such
// usage is charged past the limits, so the holds need not be counted.
func PricingState(s billing.State) billing.State {
	s.Reserved = 0
	return s
}
