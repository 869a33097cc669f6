package payments

import (
	"context"
	"encoding/json"
	"errors"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/store"
)

// handOverSweepPage is how many links the hand-over sweep reads at once.
const handOverSweepPage = 500

// SweepHandOvers makes the hand-overs owed that no event made: a Stripe
// subscription holding a gateway subscription that stopped granting
// access by its end alone, with nothing written then (a past-due holder
// whose grace ran out, and no event of it since: Stripe left it past
// due after its last retry, or its next retry is days away), while
// another live one of the user is listed to take it over (handOver).
// Without it the caller, paying for the other, had no access until an
// event of either came, up to a period away.
//
// It reads every link (stripe_subscription_of) and, for each whose
// holder's state as it last set it grants no access now and that lists
// others, hands over as the holder's own event would: in the customer's
// turn, under the lease of the one taking over, its record swapped, and
// only while handOver finds it still owed. So it is idempotent and any
// number of nodes may run it at once (the platform runs it with the
// subscription sweep, every minute on every node): a hand-over made is
// found made. It returns how many hand-overs this call made; one that
// fails is logged and left to the next sweep (or the holder's next
// event), and the errors are returned, joined, after the rest are done.
func (s *Service) SweepHandOvers(ctx context.Context) (int, error) {
	pay, err := s.Payments()
	if err != nil {
		return 0, err
	}
	made := 0
	var failed error
	after := ""
	for {
		recs, more, err := pay.ListPaymentRecords(ctx, KindSubscriptionOf, after, handOverSweepPage)
		if err != nil {
			return made, err
		}
		for _, r := range recs {
			after = r.ID
			var link linkRecord
			if json.Unmarshal(r.Body, &link) != nil || link.SubscriptionID == "" || len(link.Others) == 0 ||
				link.Applied == nil || s.appliedLive(link.Applied) {
				continue
			}
			rec, found, err := s.getSubRecord(ctx, pay, link.SubscriptionID)
			if err != nil || !found || rec.CustomerID == "" || rec.UserID == "" || rec.ServiceID == "" ||
				r.ID != rec.ServiceID+"/"+rec.UserID {
				continue
			}
			handed, err := s.sweepHandOver(ctx, pay, link.SubscriptionID, rec.CustomerID, ident{User: rec.UserID, Service: rec.ServiceID})
			if err != nil {
				s.log.Warn("the sweep could not hand a gateway subscription over; the next sweep tries again",
					zap.String("ended", link.SubscriptionID), zap.String("user_id", rec.UserID),
					zap.String("service_id", rec.ServiceID), zap.Error(err))
				failed = errors.Join(failed, err)
				if ctx.Err() != nil {
					return made, ctx.Err()
				}
				continue
			}
			if handed {
				made++
			}
		}
		if !more || len(recs) == 0 {
			return made, failed
		}
	}
}

// sweepHandOver is handOverTo in the turn of customer, as the holder's
// event would take it.
func (s *Service) sweepHandOver(ctx context.Context, pay store.Payments, ended, customer string, id ident) (bool, error) {
	defer subTurns.Lock(customer)()
	return s.handOverTo(ctx, pay, ended, customer, id)
}
