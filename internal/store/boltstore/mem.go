package boltstore

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The billing figures live in memory: every subscription's counters per
// period, its balance, and the holds of calls in flight. They are the
// authority while the process runs; the database holds them as of the
// settlements applied to it, and at start the store replays the
// settlement log onto it before anything is read. A decision is taken
// under the subscription's own lock, with no transaction: a call's hold
// never touches the disk, and its settlement is one record appended to the
// log.
//
// What the database holds for a subscription equals memory less the holds
// of calls in flight as soon as every settlement record touching it is
// applied. An account is loaded from the database at its first use after
// Open (everything is applied then, as the log was replayed) and stays:
// nothing that can differ from the database is ever dropped.

// memShards spreads the accounts over locks.
const memShards = 64

type memState struct {
	seed   maphash.Seed
	shards [memShards]struct {
		mu sync.Mutex
		m  map[string]*memAccount
	}
}

func newMemState() *memState {
	m := &memState{seed: maphash.MakeSeed()}
	for i := range m.shards {
		m.shards[i].m = make(map[string]*memAccount)
	}
	return m
}

// memAccount is one subscription's figures. mu guards everything in it.
type memAccount struct {
	mu        sync.Mutex
	userID    string
	serviceID string
	startedAt time.Time
	credits   billing.Units
	held      billing.Units // credits held
	updated   time.Time     // a credit change not yet applied, else zero
	periods   map[int64]*memCounter
	// holds are the sync calls' holds, by reservation number.
	holds map[uint64]struct{}
	// later is the deferred expiry of credits held at a grant's expiry,
	// nil when none (heldexpiry.go): a hold's end looks at it only then.
	later *memLater
}

// memCounter is one period's figures.
type memCounter struct {
	used, reserved, spend, reservedSpend billing.Units
	// unit is the cost unit spend is counted in, when unitSet; other the
	// spend in other units (spend.go).
	unit    string
	unitSet bool
	other   map[string]billing.Units
	// repriced is set once the held spend was computed for the product in
	// use (the database keeps the sum of the holds' costs).
	repriced bool
}

// peek returns the account when it is loaded.
func (m *memState) peek(key []byte) *memAccount {
	sh := &m.shards[maphash.Bytes(m.seed, key)%memShards]
	sh.mu.Lock()
	acc := sh.m[string(key)]
	sh.mu.Unlock()
	return acc
}

// account returns the subscription's account, loading it from the
// database at its first use; store.ErrNoAccount when there is no such
// subscription.
func (s *Store) account(userID, serviceID string) (*memAccount, error) {
	// The key is built on the stack: every hold and settlement looks its
	// account up, and only a first load keeps the key (as the map's string).
	var buf [128]byte
	key := append(append(append(buf[:0], userID...), 0), serviceID...)
	sh := &s.mem.shards[maphash.Bytes(s.mem.seed, key)%memShards]
	sh.mu.Lock()
	acc := sh.m[string(key)]
	sh.mu.Unlock()
	if acc != nil {
		return acc, nil
	}
	sub, err := s.GetSubscription(context.Background(), userID, serviceID)
	if err != nil {
		return nil, err
	}
	later, err := s.loadLater(userID, serviceID)
	if err != nil {
		return nil, err
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if acc = sh.m[string(key)]; acc != nil {
		return acc, nil
	}
	// Nothing changes the stored balance before the account exists
	// (every change goes through it), and the database is not behind for
	// an account never loaded: whichever loader comes first, it read the
	// right figures.
	acc = &memAccount{userID: userID, serviceID: serviceID, startedAt: sub.StartedAt, credits: sub.Credits,
		held: sub.CreditsHeld, periods: make(map[int64]*memCounter), holds: make(map[uint64]struct{}), later: later}
	sh.m[string(key)] = acc
	return acc, nil
}

// period returns the account's counter of the period containing now (or
// of period, when not 0), loading it from the database. acc.mu is held.
func (s *Store) period(acc *memAccount, p billing.Product, period int64, now time.Time) (int64, *memCounter, error) {
	if period == 0 {
		start, _ := billing.PeriodBounds(p.Period, p.CalendarPeriods, acc.startedAt, now)
		period = start.Unix()
	}
	if c := acc.periods[period]; c != nil {
		return period, c, nil
	}
	var rec counter
	err := s.view(func(tx *bolt.Tx) error {
		err := getJSON(tx, bucketCounters, counterKey(acc.userID, acc.serviceID, period), &rec)
		if err == store.ErrNotFound {
			return nil
		}
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	c := &memCounter{used: billing.Units(rec.Used), reserved: billing.Units(rec.Reserved),
		spend: billing.Units(rec.Spend), reservedSpend: billing.Units(rec.ReservedSpend)}
	if rec.Unit != nil {
		c.unit, c.unitSet = *rec.Unit, true
	}
	c.other = rec.otherUnits()
	acc.periods[period] = c
	return period, c, nil
}

// state is the billing state of the account in counter c, priced for p.
func (acc *memAccount) state(c *memCounter, p billing.Product) billing.State {
	if p.BillingModel != "" { // a product: its spend is counted in its cost unit
		c.inUnit(p.CostUnit())
	}
	st := billing.State{Used: c.used, Reserved: c.reserved, Spend: c.spend, ReservedSpend: c.reservedSpend,
		Credits: acc.credits, CreditsHeld: acc.held}
	if !c.repriced {
		st.Hold(p, billing.Decision{}) // compute the held spend for p
	}
	return st
}

// set stores a state back into the account and counter c.
func (acc *memAccount) set(c *memCounter, st billing.State) {
	c.used, c.reserved, c.spend, c.reservedSpend = st.Used, st.Reserved, st.Spend, st.ReservedSpend
	c.repriced = true
	acc.credits, acc.held = st.Credits, st.CreditsHeld
}

// overlay puts the account's balance on a subscription read from the
// database, which may be behind it.
func (s *Store) overlay(sub store.Subscription) store.Subscription {
	if s.mem == nil { // an unusable store
		return sub
	}
	acc := s.mem.peek(subKey(sub.UserID, sub.ServiceID))
	if acc == nil {
		return sub
	}
	acc.mu.Lock()
	sub.Credits, sub.CreditsHeld = acc.credits, acc.held
	if !acc.updated.IsZero() && acc.updated.After(sub.UpdatedAt) {
		sub.UpdatedAt = acc.updated
	}
	acc.mu.Unlock()
	return sub
}
