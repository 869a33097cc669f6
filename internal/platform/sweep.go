package platform

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// SubscriptionSweepInterval is how often scheduled changes of plan are
// applied and ended subscriptions tidied (ops.SweepSubscriptions): a
// downgrade applies within this long of its period's end.
var SubscriptionSweepInterval = time.Minute

// sweepSubscriptions runs the sweep at start and every interval until
// stop is closed. Every node of a fleet runs it; the sweep is idempotent.
func (a *App) sweepSubscriptions(stop <-chan struct{}) {
	t := time.NewTicker(SubscriptionSweepInterval)
	defer t.Stop()
	for {
		a.RunSubscriptionSweep(context.Background())
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// RunSubscriptionSweep sweeps the subscriptions once, at the app's clock.
func (a *App) RunSubscriptionSweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, SubscriptionSweepInterval)
	defer cancel()
	res, err := a.ops.SweepSubscriptions(ctx, a.Now())
	if err != nil {
		a.logger.Error("subscription sweep", zap.Error(err))
	}
	if res.Applied > 0 || res.Ended > 0 {
		a.logger.Info("subscription sweep", zap.Int("changes_applied", res.Applied), zap.Int("subscriptions_ended", res.Ended))
	}
	if a.pay != nil {
		// A Stripe subscription that ended by its end alone (a past-due
		// grace run out) hands its gateway subscription over to the
		// user's other live one (docs/payments.md, "Two live Stripe
		// subscriptions"); idempotent, so every node runs it.
		n, err := a.pay.SweepHandOvers(ctx)
		if err != nil {
			a.logger.Error("subscription sweep: Stripe hand-overs", zap.Error(err))
		}
		if n > 0 {
			a.logger.Info("subscription sweep", zap.Int("stripe_hand_overs", n))
		}
	}
}
