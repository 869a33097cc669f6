package boltstore

import (
	"errors"
	"strconv"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

// predecision is what predecide did with a write.
type predecision int

const (
	queued   predecision = iota // not decided: it runs in the next batch as usual
	held                        // a hold decided and told; written first in the next batch
	answered                    // a refusal, told: nothing to write
)

// predecide decides a sync call's hold while the previous batch's commit
// is being made durable, against the state that batch leaves: s.latest for
// every account a write of the batch (or a hold decided since) changed,
// else the committed state, which that account has not left. A call whose
// subscription the batch wrote waits for the next batch, as every other
// write does. Only the commit loop calls it.
func (s *Store) predecide(o *op) predecision {
	r := o.hold
	if r == nil || r.a.Free || !s.Healthy() {
		return queued
	}
	a := r.a
	skey := subKey(a.UserID, a.ServiceID)
	if s.written.hasSub(skey) {
		return queued
	}
	sub, cached, _ := s.cache.sub(skey)
	var state billing.State
	var ckey []byte
	var period int64
	decide := func(tx *bolt.Tx) error {
		if !cached {
			var err error
			if sub, err = s.readSub(tx, a.UserID, a.ServiceID); err != nil {
				return err
			}
		}
		start, _ := billing.PeriodBounds(a.Product.Period, a.Product.CalendarPeriods, sub.StartedAt, r.now)
		period = start.Unix()
		ckey = counterKey(a.UserID, a.ServiceID, period)
		if st, ok := s.latest[string(ckey)]; ok {
			state = st
			return nil
		}
		if tx == nil {
			return errNeedsRead
		}
		var c counter
		if err := getJSON(tx.Bucket(bucketCounters), ckey, &c); err != nil && err != store.ErrNotFound {
			return err
		}
		state = billing.State{
			Used: billing.Units(c.Used), Reserved: billing.Units(c.Reserved),
			Spend: billing.Units(c.Spend), ReservedSpend: billing.Units(c.ReservedSpend),
			Credits: sub.Credits, CreditsHeld: sub.CreditsHeld,
		}
		return nil
	}
	// The common case, a busy subscription, needs no read at all.
	err := errNeedsRead
	if cached {
		err = decide(nil)
	}
	if err == errNeedsRead {
		err = s.view(decide)
	}
	if err != nil {
		return queued // the next batch meets the error and reports it
	}
	dec := billing.Decide(a.Product, state, r.units)
	if !dec.Allowed {
		r.res, r.dec, r.state = store.Reservation{}, dec, state
		s.predecided.Add(1)
		o.decide()
		o.done <- nil
		return answered
	}
	state.Hold(a.Product, dec)
	s.latest[string(ckey)] = state
	s.lastHold++
	r.pre = &preHold{dec: dec, seq: s.lastHold, period: period}
	r.res = store.Reservation{ID: strconv.FormatUint(s.lastHold, 10), Account: a, Decision: dec, PeriodKey: period}
	r.dec, r.state = dec, state
	s.predecided.Add(1)
	o.decide()
	return held
}

// errNeedsRead says a decision needs the committed state.
var errNeedsRead = errors.New("needs a read")
