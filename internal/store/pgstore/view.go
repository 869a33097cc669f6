package pgstore

import (
	"context"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The state a node shows (State, and what Reserve returns) is the one the
// bbolt store shows: what is settled, and as held what the calls in flight
// and the open jobs hold. The database counts a node's whole lease as
// leased, unused units included; the node knows its own lease and holds,
// so it shows its calls' holds instead of its lease. Other nodes' leases
// it cannot see into: their unused units count as held (docs/fleet.md).

// holdSums is what a node's calls in flight hold, per allowance, in the
// words of billing.State (Reserved, ReservedSpend, CreditsHeld).
type holdSums struct {
	by map[AllowanceKey]billing.State // by value: a call's hold allocates nothing
}

func (s *Store) addHold(k AllowanceKey, p billing.Product, d billing.Decision) {
	s.knownMu.Lock()
	defer s.knownMu.Unlock()
	st := s.holdSums.by[k]
	st.Reserved += d.Units
	st.ReservedSpend += d.Cost
	if p.BillingModel == billing.Prepaid {
		st.CreditsHeld += d.Cost
	}
	s.holdSums.by[k] = st
}

func (s *Store) dropHold(k AllowanceKey, p billing.Product, d billing.Decision) {
	s.knownMu.Lock()
	defer s.knownMu.Unlock()
	st, ok := s.holdSums.by[k]
	if !ok {
		return
	}
	st.Reserved = max(0, st.Reserved-d.Units)
	st.ReservedSpend = max(0, st.ReservedSpend-d.Cost)
	if p.BillingModel == billing.Prepaid {
		st.CreditsHeld = max(0, st.CreditsHeld-d.Cost)
	}
	if st == (billing.State{}) {
		delete(s.holdSums.by, k)
	} else {
		s.holdSums.by[k] = st
	}
}

// view is the state shown for allowance k of product p, from the row as
// the database holds it.
func (s *Store) view(k AllowanceKey, p billing.Product, r row) billing.State {
	mine := s.leaser.Mine(k)
	s.knownMu.Lock()
	held := s.holdSums.by[k] // zero when nothing is held
	s.knownMu.Unlock()
	st := billing.State{Used: r.used, Spend: r.spendIn(p.CostUnit()), Credits: r.credits}
	st.Reserved = max(0, r.leased-mine.Units) + held.Reserved
	st.ReservedSpend = max(0, r.leasedSpend-mine.Spend) + held.ReservedSpend
	st.CreditsHeld = max(0, r.creditsHeld-mine.Credits) + held.CreditsHeld
	if p.BillingModel == billing.Subscription && p.Quota != nil && p.OverageAllowed() {
		// What the holds will cost together, settled in any order
		// (billing's repricing of a SUBSCRIPTION quota's overage; a
		// blocked quota prices nothing past it).
		past := func(u billing.Units) billing.Units { return max(0, u-*p.Quota) }
		st.ReservedSpend = billing.Mul(past(st.Used+st.Reserved)-past(st.Used), p.Price)
	}
	return st
}

// known is the row of k as this node last saw it (after a grant, a
// settlement commit or a read), read now when it has not seen it.
func (s *Store) knownRow(ctx context.Context, k AllowanceKey) (row, error) {
	s.knownMu.Lock()
	r, ok := s.knownRows[k]
	s.knownMu.Unlock()
	if ok {
		return r, nil
	}
	r, err := scanRow(s.pool.QueryRow(ctx, stateSQL, k.UserID, k.ServiceID, k.Period))
	if err != nil {
		return r, s.fail(err)
	}
	if !r.hasSub {
		return r, store.ErrNoAccount
	}
	s.learn(k, r)
	return r, nil
}

func (s *Store) learn(k AllowanceKey, r row) {
	s.knownMu.Lock()
	defer s.knownMu.Unlock()
	if len(s.knownRows) >= cacheMax {
		clear(s.knownRows)
	}
	s.knownRows[k] = r
}

// forget drops what is known of a subscription's rows (its balance or
// product changed).
func (s *Store) forget(userID, serviceID string) {
	s.knownMu.Lock()
	defer s.knownMu.Unlock()
	for k := range s.knownRows {
		if k.UserID == userID && k.ServiceID == serviceID {
			delete(s.knownRows, k)
		}
	}
}

// heldOf sums what this node's calls in flight hold on a subscription,
// every period.
func (s *Store) heldOf(userID, serviceID string) billing.State {
	s.knownMu.Lock()
	defer s.knownMu.Unlock()
	var sum billing.State
	for k, h := range s.holdSums.by {
		if k.UserID == userID && k.ServiceID == serviceID {
			sum.Reserved += h.Reserved
			sum.ReservedSpend += h.ReservedSpend
			sum.CreditsHeld += h.CreditsHeld
		}
	}
	return sum
}
