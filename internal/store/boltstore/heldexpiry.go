package boltstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// Credits held at a grant's expiry (store.ExpireGrantsHeld): the part of
// an expiring grant the expiry did not remove only because calls in
// flight and open jobs held it is deferred, and expires as those holds
// end and give back what they did not charge (store.HeldStack).
//
// Which holds predate the expiry: holds are numbered by holdSeq under
// their account's lock (Reserve, CreateJobReserved), and the expiry takes
// a number of the same sequence under that lock, its cutoff: a hold
// numbered below it existed at the expiry. A sync call's hold lives in
// memory, a job's is stored under its number and survives a restart.
//
// A subscription's deferred expiry is a pool: its number (gen), cutoff,
// what the holds before the cutoff still hold, and that by the age of the
// credits (store.HeldStack): the grants waiting on them (their Deferred),
// under each what does not expire (its below), and the slack above. In
// memory it is memAccount.later; in the file, the pool record
// (bucketHeldExpiry) and the grants. Every
// change to it rides in the settlement record of the hold that ended (or
// of the expiry), as a laterChange of deltas, so the records apply in any
// order they were appended in; a pool's start and close name its gen, so
// a change to a pool closed meanwhile changes no other pool.
//
// A restart drops the sync calls' holds (their calls never answered, so
// nothing was charged): at Open, what the pools counted as held and no
// stored job hold holds any more was given back (settleDroppedHolds).

var bucketHeldExpiry = []byte("credit_held_expiry") // user \0 service -> laterRecord

func init() { allBuckets = append(allBuckets, bucketHeldExpiry) }

// memLater is a subscription's deferred expiry in memory; its account's
// mu guards it.
type memLater struct {
	gen    uint64
	cutoff uint64        // holds numbered below it predate the expiry
	held   billing.Units // what those holds still hold (credits)
	slack  billing.Units // what they hold above the grants that does not expire
	grants []laterGrant  // oldest first
}

type laterGrant struct {
	id, source string
	deferred   billing.Units
	below      billing.Units // what the holds hold under it that does not expire
}

// stack is l's held credits by age.
func (l *memLater) stack() store.HeldStack {
	st := store.HeldStack{Top: l.slack, Layers: make([]store.HeldLayer, len(l.grants))}
	for i, g := range l.grants {
		st.Layers[i] = store.HeldLayer{ID: g.id, Below: g.below, Deferred: g.deferred}
	}
	return st
}

func (l *memLater) clone() *memLater {
	c := *l
	c.grants = append([]laterGrant(nil), l.grants...)
	return &c
}

// laterRecord is a pool as stored.
type laterRecord struct {
	Gen    uint64   `json:"gen"`
	Cutoff uint64   `json:"cutoff"`
	Held   amount   `json:"held"`
	Slack  amount   `json:"slack"`
	Grants []string `json:"grants"`
	// Below is what the holds hold under each of Grants that does not
	// expire (store.HeldStack); absent in a pool from before it: all of
	// its slack is above the grants.
	Below []amount `json:"below,omitempty"`
}

// laterMove moves Credits of a grant's Deferred: to Expired (and
// ExpiredLater) in Expire, out as charged in Spend. In Below it is what
// the grant's below changes by (what it is, in a Start).
type laterMove struct {
	ID      string `json:"id"`
	Credits amount `json:"credits"`
}

// laterChange is a change to a pool, in a settlement record's grant part.
// Start: the pool starts (or, joined by a later expiry, starts again)
// with these figures, Below each grant's below. Else Held, Slack and
// each grant's Below are added, Cutoff raises the pool's, Grants join it;
// Close removes it. Expire and Spend change the grants whatever the pool.
type laterChange struct {
	UserID    string      `json:"userId"`
	ServiceID string      `json:"serviceId"`
	Gen       uint64      `json:"gen"`
	Start     bool        `json:"start,omitempty"`
	Cutoff    uint64      `json:"cutoff,omitempty"`
	Held      amount      `json:"held,omitempty"`
	Slack     amount      `json:"slack,omitempty"`
	Grants    []string    `json:"grants,omitempty"`
	Below     []laterMove `json:"below,omitempty"`
	Close     bool        `json:"close,omitempty"`
	Expire    []laterMove `json:"expire,omitempty"`
	Spend     []laterMove `json:"spend,omitempty"`
}

// applyLater writes a pool change in the applier's transaction.
func applyLater(tx *bolt.Tx, c *laterChange) error {
	key := subKey(c.UserID, c.ServiceID)
	if c.Start {
		rec := laterRecord{Gen: c.Gen, Cutoff: c.Cutoff, Held: c.Held, Slack: c.Slack, Grants: c.Grants}
		rec.addBelow(c.Below)
		if err := putJSON(tx, bucketHeldExpiry, key, rec); err != nil {
			return err
		}
	} else {
		var rec laterRecord
		err := getJSON(tx, bucketHeldExpiry, key, &rec)
		switch {
		case err == store.ErrNotFound:
		case err != nil:
			return err
		case rec.Gen != c.Gen:
			// A change to a pool that closed (and another started) before
			// its record was appended: nothing of the pool's.
		case c.Close:
			if err := tx.Bucket(bucketHeldExpiry).Delete(key); err != nil {
				return err
			}
		default:
			rec.Held += c.Held
			rec.Slack += c.Slack
			rec.Cutoff = max(rec.Cutoff, c.Cutoff)
			rec.Grants = append(rec.Grants, c.Grants...)
			rec.addBelow(c.Below)
			if err := putJSON(tx, bucketHeldExpiry, key, rec); err != nil {
				return err
			}
		}
	}
	move := func(m laterMove, expire bool) error {
		var g grantRecord
		if err := getJSON(tx, bucketGrants, []byte(m.ID), &g); err == store.ErrNotFound {
			return nil
		} else if err != nil {
			return err
		}
		n := min(m.Credits, max(g.Deferred, 0))
		g.Deferred -= n
		if expire {
			g.Expired += n
			g.ExpiredLater += n
		}
		return putJSON(tx, bucketGrants, []byte(m.ID), g)
	}
	for _, m := range c.Expire {
		if err := move(m, true); err != nil {
			return err
		}
	}
	for _, m := range c.Spend {
		if err := move(m, false); err != nil {
			return err
		}
	}
	return nil
}

// addBelow adds what each move says to the below of its grant.
func (rec *laterRecord) addBelow(ms []laterMove) {
	if len(ms) == 0 {
		return
	}
	for len(rec.Below) < len(rec.Grants) {
		rec.Below = append(rec.Below, 0)
	}
	for _, m := range ms {
		if i := slices.Index(rec.Grants, m.ID); i >= 0 {
			rec.Below[i] += m.Credits
		}
	}
}

// loadLater reads a subscription's pool from the file, nil when none.
func (s *Store) loadLater(userID, serviceID string) (*memLater, error) {
	var l *memLater
	err := s.view(func(tx *bolt.Tx) error {
		l = nil
		var rec laterRecord
		if err := getJSON(tx, bucketHeldExpiry, subKey(userID, serviceID), &rec); err == store.ErrNotFound {
			return nil
		} else if err != nil {
			return err
		}
		l = &memLater{gen: rec.Gen, cutoff: rec.Cutoff, held: billing.Units(rec.Held), slack: billing.Units(rec.Slack)}
		var lost billing.Units // the below of a grant not found, kept in the stack
		for i, id := range rec.Grants {
			var below billing.Units
			if i < len(rec.Below) {
				below = billing.Units(rec.Below[i])
			}
			g, err := readGrant(tx, id)
			if err == store.ErrNotFound {
				lost += below
				continue
			} else if err != nil {
				return err
			}
			l.grants = append(l.grants, laterGrant{id: g.ID, source: g.Source, deferred: g.Deferred, below: below + lost})
			lost = 0
		}
		l.slack += lost
		return nil
	})
	return l, err
}

// holdEnded is called, under acc.mu, when the hold numbered id ends: it
// held h credits and its settlement charged c of them. When the hold
// predates the account's deferred expiry, what it charged is spent and
// what it gives back (h - c) expires as giveBack says: it returns the
// credits to take
// off the balance (the caller takes them, with an opCredit in its
// record), the grant part of the record (nil: nothing to record), and
// how to take it all back if the record is refused.
func (acc *memAccount) holdEnded(id uint64, h, c billing.Units) (billing.Units, *grantChange, func()) {
	l := acc.later
	if l == nil || id >= l.cutoff || h <= 0 {
		return 0, nil, nil
	}
	c = min(max(c, 0), h)
	return acc.giveBack(h, c, h-c)
}

// endHeld is holdEnded applied to a settlement being built: what
// expires comes off st's balance, with an opCredit added to ops. It
// returns ops, the record's grant part (nil: nothing to record) and the
// undo of the deferred expiry's change if the record is refused.
func (acc *memAccount) endHeld(st *billing.State, ops []acctOp, id uint64, h, c billing.Units) ([]acctOp, *grantChange, func()) {
	x, later, undo := acc.holdEnded(id, h, c)
	if later != nil {
		st.Credits -= x
		if x > 0 {
			ops = append(ops, acctOp{kind: opCredit, units: -x})
		}
	}
	return ops, later, undo
}

// giveBack is holdEnded for holds of h credits that charged c of them and
// gave back r: credits are spent oldest first, so what they charged is
// taken from the bottom of the pool's stack (store.HeldStack.Charge: of
// the deferred credits it takes, spent) and what they gave back from its
// top (GiveBack: of the deferred credits it takes, expired).
func (acc *memAccount) giveBack(h, c, r billing.Units) (billing.Units, *grantChange, func()) {
	l := acc.later
	prev := l.clone()
	st, spent := l.stack().Charge(c)
	st, exp, x := st.GiveBack(r)
	ch := &laterChange{UserID: acc.userID, ServiceID: acc.serviceID, Gen: l.gen, Held: amount(-h),
		Slack: amount(st.Top - l.slack)}
	l.held -= h
	l.slack = st.Top
	now := time.Now().UTC()
	gc := &grantChange{Later: ch}
	for i := range l.grants {
		g := &l.grants[i]
		if d := st.Layers[i].Below - g.below; d != 0 {
			g.below += d
			ch.Below = append(ch.Below, laterMove{ID: g.id, Credits: amount(d)})
		}
		if spent[i] > 0 {
			g.deferred -= spent[i]
			ch.Spend = append(ch.Spend, laterMove{ID: g.id, Credits: amount(spent[i])})
		}
		if exp[i] > 0 {
			g.deferred -= exp[i]
			ch.Expire = append(ch.Expire, laterMove{ID: g.id, Credits: amount(exp[i])})
			gc.Audit = append(gc.Audit, laterAudit(acc, g, now, exp[i]))
		}
	}
	if l.held <= 0 {
		// Every hold the expiry waited for has ended: what is still
		// deferred was charged.
		ch.Close = true
		for _, g := range l.grants {
			if g.deferred > 0 {
				ch.Spend = append(ch.Spend, laterMove{ID: g.id, Credits: amount(g.deferred)})
			}
		}
		acc.later = nil
	}
	undo := func() { // under acc.mu
		if acc.later == l || acc.later == nil && ch.Close {
			*l = *prev
			acc.later = l
		}
	}
	return x, gc, undo
}

func laterAudit(acc *memAccount, g *laterGrant, at time.Time, x billing.Units) store.AuditEntry {
	actor := g.source
	if actor == "" {
		actor = "payments"
	}
	return store.AuditEntry{Time: at, Actor: actor, Action: "credits.expire", UserID: acc.userID, ServiceID: acc.serviceID,
		Detail: fmt.Sprintf("expired %s credits held at the expiry and given back unspent (grant %s)", x, g.id)}
}

// prepaidCost is what a hold of d under p holds of the balance.
func prepaidCost(p billing.Product, d billing.Decision) billing.Units {
	if p.BillingModel != billing.Prepaid {
		return 0
	}
	return max(d.Cost, 0)
}

// settleDroppedHolds runs at Open, once the log is replayed and the
// commit loop runs: for every deferred expiry, what its holds held and no
// stored job hold holds now was dropped by the restart (the sync calls'
// holds, given back whole), and is given back; the hold numbering resumes
// past every pool's cutoff.
func (s *Store) settleDroppedHolds() error {
	type pool struct {
		userID, serviceID string
		gen               uint64
		surviving         billing.Units
	}
	var pools []pool
	err := s.view(func(tx *bolt.Tx) error {
		pools = nil
		return tx.Bucket(bucketHeldExpiry).ForEach(func(k, v []byte) error {
			var rec laterRecord
			if err := decodeJSON(bucketHeldExpiry, k, v, &rec); err != nil {
				return err
			}
			i := bytes.IndexByte(k, 0)
			if i < 0 {
				return recordError(bucketHeldExpiry, k, "key has no service")
			}
			p := pool{userID: string(k[:i]), serviceID: string(k[i+1:]), gen: rec.Gen}
			if rec.Cutoff > s.holdSeq.Load() {
				s.holdSeq.Store(rec.Cutoff)
			}
			c := tx.Bucket(bucketReservations).Cursor()
			for hk, hv := c.First(); len(hk) == 8 && binary.BigEndian.Uint64(hk) < rec.Cutoff; hk, hv = c.Next() {
				var r reservation
				if err := decodeJSON(bucketReservations, hk, hv, &r); err != nil {
					return err
				}
				if r.JobID != "" && r.UserID == p.userID && r.ServiceID == p.serviceID {
					p.surviving += prepaidCost(r.Product, r.Decision.decision())
				}
			}
			pools = append(pools, p)
			return nil
		})
	})
	if err != nil {
		return err
	}
	for _, p := range pools {
		acc, err := s.account(p.userID, p.serviceID)
		if err == store.ErrNoAccount {
			continue
		}
		if err != nil {
			return err
		}
		_, err = s.commitCreditWith(acc, p.userID, p.serviceID, func(_, _ billing.Units) (billing.Units, *grantChange, func()) {
			l := acc.later
			if l == nil || l.gen != p.gen || l.held <= p.surviving {
				return 0, nil, nil
			}
			dropped := l.held - p.surviving
			x, gc, undo := acc.giveBack(dropped, 0, dropped)
			return -x, gc, undo
		})
		if err != nil {
			return fmt.Errorf("settle the holds a restart dropped for %s/%s: %w", p.userID, p.serviceID, err)
		}
	}
	return nil
}

// expireHeld decides a subscription's expiry (ExpireCredits), under
// acc.mu (acc nil: no subscription, nothing held): what the grants due
// have left of the free balance expires now, what is held of them is
// deferred to the holds open now. A deferred expiry still open is kept
// out of this one (its deferred credits are held, and stay deferred);
// when this one defers credits too it joins it: every hold open now
// predates the new expiry, so its cutoff moves to now and the pool starts
// again with the stack of both (store.ExpireGrantsHeld places them by
// age), under the same number.
func (s *Store) expireHeld(acc *memAccount, grants []store.CreditGrant, credits, held billing.Units, now time.Time,
	out *[]store.CreditGrant) (billing.Units, *grantChange, func()) {
	var orig *memLater
	if acc != nil {
		orig = acc.later
	}
	// The open pool's deferred credits as memory has them (the file's
	// grants may not have every hold's end applied yet); none otherwise.
	pending := map[string]billing.Units{}
	if orig != nil {
		for _, g := range orig.grants {
			pending[g.id] = g.deferred
		}
	}
	gs := make([]store.CreditGrant, len(grants))
	for i, g := range grants {
		if !g.ExpiredAt.IsZero() {
			g.Deferred = pending[g.ID]
		}
		gs[i] = g
	}
	expired, after, st := store.ExpireGrantsHeld(credits, held, gs, now)
	if len(expired) == 0 {
		return 0, nil, nil
	}
	*out = expired
	c := &grantChange{}
	var deferred billing.Units
	for _, g := range expired {
		c.Grants = append(c.Grants, toGrantRecord(g))
		detail := fmt.Sprintf("expired %s credits left of %s (grant %s)", g.Expired, g.Credits, g.ID)
		if g.Deferred > 0 {
			detail += fmt.Sprintf("; %s more held at the expiry expire as the holds give them back unspent", g.Deferred)
			deferred += g.Deferred
		}
		c.Audit = append(c.Audit, grantAudit(g, now, "credits.expire", detail))
	}
	delta := after - credits
	if acc == nil || deferred == 0 {
		// Nothing deferred: a pool open stays as it is.
		return delta, c, nil
	}
	sources := map[string]string{}
	for _, g := range grants {
		sources[g.ID] = g.Source
	}
	gen := s.holdSeq.Add(1)
	cutoff := gen
	if orig != nil {
		gen = orig.gen
	}
	nl := &memLater{gen: gen, cutoff: cutoff, held: held, slack: st.Top}
	ch := &laterChange{UserID: acc.userID, ServiceID: acc.serviceID, Gen: gen, Start: true, Cutoff: cutoff,
		Held: amount(held), Slack: amount(st.Top)}
	for _, l := range st.Layers {
		nl.grants = append(nl.grants, laterGrant{id: l.ID, source: sources[l.ID], deferred: l.Deferred, below: l.Below})
		ch.Grants = append(ch.Grants, l.ID)
		if l.Below != 0 {
			ch.Below = append(ch.Below, laterMove{ID: l.ID, Credits: amount(l.Below)})
		}
	}
	acc.later = nl
	c.Later = ch
	return delta, c, func() { acc.later = orig }
}
