package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// The subscription sweep. Access already ends exactly at a subscription's
// EndsAt, at the call (subscription.Resolve); what cannot be expressed by
// an end is a change of plan scheduled for the period's end, and that is
// what the sweep is for: the platform runs it at start and every minute,
// so a downgrade applies within a minute of the period's end whether or
// not the caller comes back (the caller keeps the pricier plan for that
// minute: in their favour for the plan, nothing goes unbilled). It also
// tidies the stored status of a subscription past its end to its
// EndStatus, so listings say what the call already decides.

// SweepActor is the audit actor of the sweep's tidying.
const SweepActor = "platform (subscription ended)"

// SweepResult counts what one sweep did.
type SweepResult struct {
	Applied, Ended int
}

// SweepSubscriptions applies every scheduled change due at now
// (ApplyDueChange, idempotent across a fleet) and sets the status of
// every subscription past its end to its EndStatus, keeping the end. It
// goes on past a failure and returns the failures joined.
func (o *Ops) SweepSubscriptions(ctx context.Context, now time.Time) (SweepResult, error) {
	var out SweepResult
	var errs []error
	changes, err := o.PendingChanges(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, ch := range changes {
		if now.Before(ch.From) {
			continue
		}
		if _, err := o.ApplyDueChange(ctx, ch.UserID, ch.ServiceID, now); err != nil {
			if !IsNoScheduledChange(err) {
				errs = append(errs, fmt.Errorf("apply the change of %s on %s to %s: %w", ch.UserID, ch.ServiceID, ch.ProductID, err))
			}
			continue
		}
		out.Applied++
	}
	cursor := ""
	for {
		page, next, err := o.rt.Store().ListSubscriptions(ctx, "", cursor, MaxPageLimit)
		if err != nil {
			errs = append(errs, fmt.Errorf("list subscriptions: %w", err))
			break
		}
		for _, sub := range page {
			if !subscription.Ended(sub, now) || subscription.Status(sub.Status) == subscription.EffectiveStatus(sub, now) {
				continue
			}
			if err := o.endSubscription(ctx, sub, now); err != nil {
				errs = append(errs, err)
				continue
			}
			out.Ended++
		}
		if next == "" {
			break
		}
		cursor = next
	}
	return out, errors.Join(errs...)
}

// endSubscription sets sub's status to its EndStatus, reading it again
// first so that a change made since the listing (an operator's status,
// which clears the end) is not overwritten.
func (o *Ops) endSubscription(ctx context.Context, sub store.Subscription, now time.Time) error {
	cur, err := o.rt.Store().GetSubscription(ctx, sub.UserID, sub.ServiceID)
	if err != nil {
		return fmt.Errorf("read the subscription of %s to %s: %w", sub.UserID, sub.ServiceID, err)
	}
	st := subscription.EffectiveStatus(cur, now)
	if !subscription.Ended(cur, now) || subscription.Status(cur.Status) == st {
		return nil
	}
	if ch, err := o.PutSubscriptionUntil(ctx, SweepActor, cur.UserID, cur.ServiceID, cur.ProductID, string(st), EndOf(cur)); ch.UserID == "" {
		return fmt.Errorf("end the subscription of %s to %s: %w", cur.UserID, cur.ServiceID, err)
	}
	return nil
}
