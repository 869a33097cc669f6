package pgstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// The lease protocol's simulation: the Leaser of lease.go, exactly as a
// node runs it, against simDB, a model of the statements of leasesql.go
// and settle.go (the same conditions, one map instead of tables), on a
// virtual clock. 100 nodes serve 10,000 subscriptions (quotas and prepaid
// balances, traffic skewed to a few); nodes are killed at random (their
// calls in flight lost, their leases left to expire) and come back as new
// incarnations. It checks and reports:
//   - over-serving: acknowledged units past a subscription's limit (must
//     be 0), and that the database's counters equal what was acknowledged;
//   - units stranded in dead nodes' leases until they expired;
//   - database round trips per call.
//
// go test -run TestLeaseSimulation -v ./internal/store/pgstore/ prints the report.

// simAllow is an allowance row with its subscription's balance.
type simAllow struct {
	used, leased         billing.Units
	credits, creditsHeld billing.Units
}

type simLease struct {
	v       Vec
	expires time.Time
}

// simDB is the database of the simulation. Single-threaded: the
// simulation runs one step at a time.
type simDB struct {
	now    func() time.Time
	allow  map[AllowanceKey]*simAllow
	leases map[string]map[AllowanceKey]*simLease // by holder
	trips  int64
}

func (d *simDB) row(k AllowanceKey) *simAllow {
	a := d.allow[k]
	if a == nil {
		a = &simAllow{}
		d.allow[k] = a
	}
	return a
}

func (d *simDB) fits(a *simAllow, lim Limits, v Vec) bool {
	return (lim.Units == nil || v.Units == 0 || a.used+a.leased+v.Units <= *lim.Units) &&
		(!lim.Credits || a.credits-a.creditsHeld >= v.Credits)
}

func (d *simDB) left(a *simAllow, lim Limits) Vec {
	var v Vec
	if lim.Units != nil {
		v.Units = *lim.Units - a.used - a.leased
	}
	if lim.Credits {
		v.Credits = a.credits - a.creditsHeld
	}
	return v
}

// Grant is grantSQL.
func (d *simDB) Grant(_ context.Context, holder string, k AllowanceKey, lim Limits, big, small Vec, ttl time.Duration) (Grant, error) {
	d.trips++
	if l := d.leases[holder][k]; l != nil && !l.expires.After(d.now()) {
		return Grant{}, errLeaseExpired // never added to, never revived
	}
	a := d.row(k)
	var g Vec
	switch {
	case d.fits(a, lim, big):
		g = big
	case d.fits(a, lim, small):
		g = small
	default:
		left := d.left(a, lim)
		return Grant{Left: left, Refused: refusedIn(small, left)}, nil
	}
	a.leased += g.Units
	a.creditsHeld += g.Credits
	byKey := d.leases[holder]
	if byKey == nil {
		byKey = map[AllowanceKey]*simLease{}
		d.leases[holder] = byKey
	}
	l := byKey[k]
	if l == nil {
		l = &simLease{}
		byKey[k] = l
	}
	l.v = l.v.add(g)
	l.expires = d.now().Add(ttl)
	return Grant{OK: true, Granted: g, Left: d.left(a, lim)}, nil
}

// Renew is pgLeases.Renew: expired rows are never revived.
func (d *simDB) Renew(_ context.Context, holders []string, ttl time.Duration) ([]string, error) {
	d.trips++
	var out []string
	for _, h := range holders {
		renewed := false
		for _, l := range d.leases[h] {
			if l.expires.After(d.now()) {
				l.expires = d.now().Add(ttl)
				renewed = true
			}
		}
		if renewed {
			out = append(out, h)
		}
	}
	return out, nil
}

// Return is returnSQL.
func (d *simDB) Return(_ context.Context, refs []LeaseRef) error {
	d.trips++
	for _, r := range refs {
		d.give(r)
	}
	return nil
}

// ReturnPart is returnPartSQL.
func (d *simDB) ReturnPart(_ context.Context, r LeaseRef, part Vec) error {
	d.trips++
	l := d.leases[r.Holder][r.Key]
	if l == nil || !l.expires.After(d.now()) || !part.within(l.v) {
		return nil
	}
	a := d.row(r.Key)
	l.v = l.v.sub(part)
	a.leased -= part.Units
	a.creditsHeld -= part.Credits
	return nil
}

func (d *simDB) give(r LeaseRef) {
	l := d.leases[r.Holder][r.Key]
	if l == nil {
		return
	}
	a := d.row(r.Key)
	a.leased -= l.v.Units
	a.creditsHeld -= l.v.Credits
	delete(d.leases[r.Holder], r.Key)
	if len(d.leases[r.Holder]) == 0 {
		delete(d.leases, r.Holder)
	}
}

// sweep is sweepExpired: one query, then one statement for them all.
func (d *simDB) sweep() {
	d.trips++
	var exp []LeaseRef
	for h, byKey := range d.leases {
		for k, l := range byKey {
			if !l.expires.After(d.now()) {
				exp = append(exp, LeaseRef{h, k})
			}
		}
	}
	if len(exp) > 0 {
		d.trips++
		d.Return(context.Background(), exp)
		d.trips--
	}
}

// settle is one settlement of a batch (settle.go): the lease row pays for
// what it covers; otherwise the charge is capped against the limits. It
// returns the units charged.
func (d *simDB) settle(holder string, k AllowanceKey, lim Limits, consume Vec, covered bool, units billing.Units) billing.Units {
	a := d.row(k)
	if l := d.leases[holder][k]; l != nil && consume.within(l.v) {
		l.v = l.v.sub(consume)
		a.leased -= consume.Units
		a.creditsHeld -= consume.Credits
	} else {
		covered = false
	}
	if !covered {
		for units > 0 && !d.fits(a, lim, lim.Need(units)) {
			units -= billing.Scale
		}
	}
	a.used += units
	a.credits -= billing.Mul(units, lim.Price)
	return units
}

// stranded is what dead incarnations' leases hold (a holder is the
// incarnation/lease number).
func (d *simDB) stranded(dead map[string]bool) billing.Units {
	var u billing.Units
	for h, byKey := range d.leases {
		if dead[h[:strings.LastIndexByte(h, '/')]] {
			for _, l := range byKey {
				u += l.v.Units + l.v.Credits
			}
		}
	}
	return u
}

type simSub struct {
	k       AllowanceKey
	lim     Limits
	limit   billing.Units // quota units, or credits at a price of 1
	acked   billing.Units
	charged billing.Units
}

type simCall struct {
	sub  *simSub
	hold Hold
}

type simNode struct {
	id      string
	leaser  *Leaser
	pending []simCall
	alive   bool
	back    time.Time // when a dead node comes back
	incarn  int
}

type simReport struct {
	calls, served, refused  int64
	refusedAtLimit          int64 // refused with the settled units at the limit
	overServed              billing.Units
	mismatch                int
	deaths                  int
	strandedMax             billing.Units
	strandedAvg             float64
	leftAfterExpiry         billing.Units
	roundTrips              int64
	settleTrips             int64
	shortCharged            int64
	exhausted, subsWithCall int
}

func (r simReport) String() string {
	return fmt.Sprintf("calls %d (served %d, refused %d of which %d with the limit reached by settled units, the rest while units were leased to other nodes), subscriptions exhausted %d of %d called; over-served units %d; "+
		"counter mismatches %d; node deaths %d; stranded units in dead leases: max %.0f, mean %.1f, after expiry %d; "+
		"calls charged short %d; database round trips %d = %.4f per call (%.4f for settlement commits, %.4f for leases)",
		r.calls, r.served, r.refused, r.refusedAtLimit, r.exhausted, r.subsWithCall, r.overServed/billing.Scale, r.mismatch, r.deaths,
		float64(r.strandedMax)/float64(billing.Scale), r.strandedAvg/float64(billing.Scale), r.leftAfterExpiry/billing.Scale,
		r.shortCharged, r.roundTrips, float64(r.roundTrips)/float64(max(r.calls, 1)),
		float64(r.settleTrips)/float64(max(r.calls, 1)), float64(r.roundTrips-r.settleTrips)/float64(max(r.calls, 1)))
}

// simConfig shapes a simulation: callsPerTick calls a millisecond spread
// over the nodes, a node's settlements committed every commitTicks (a
// group commit takes a couple of milliseconds), a node killed every
// deathEvery ticks on average.
type simConfig struct {
	nodes, subs, callsPerTick, ticks, commitTicks, deathEvery int
	// hotPercent of the subscriptions take hotTraffic percent of the calls.
	hotPercent, hotTraffic int
	seed                   uint64
}

func runSimulation(c simConfig) simReport {
	nodes, subs, callsPerTick, ticks, seed := c.nodes, c.subs, c.callsPerTick, c.ticks, c.seed
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	clock := time.Unix(1_800_000_000, 0)
	now := func() time.Time { return clock }
	db := &simDB{now: now, allow: map[AllowanceKey]*simAllow{}, leases: map[string]map[AllowanceKey]*simLease{}}
	cfg := LeaseConfig{TTL: 30 * time.Second, Max: billing.Whole(100), RefuseFor: 100 * time.Millisecond}
	const tick = time.Millisecond

	all := make([]*simSub, subs)
	for i := range all {
		s := &simSub{k: AllowanceKey{UserID: fmt.Sprintf("u%05d", i), ServiceID: "svc", Period: 1}}
		if i%2 == 0 {
			s.limit = billing.Whole(int64(20 + rng.IntN(2000)))
			s.lim = Limits{Units: &s.limit}
		} else {
			s.limit = billing.Whole(int64(20 + rng.IntN(2000)))
			s.lim = Limits{Credits: true, Price: billing.Scale}
			db.row(s.k).credits = s.limit
		}
		all[i] = s
	}
	hot := max(1, subs*c.hotPercent/100)
	pick := func() *simSub {
		if rng.IntN(100) < c.hotTraffic {
			return all[rng.IntN(hot)]
		}
		return all[rng.IntN(subs)]
	}
	ns := make([]*simNode, nodes)
	dead := map[string]bool{}
	for i := range ns {
		n := &simNode{id: fmt.Sprintf("node%03d", i), alive: true}
		n.leaser = NewLeaser(db, n.id+"/0", cfg, now)
		ns[i] = n
	}
	var rep simReport
	ctx := context.Background()
	var strandedSum float64
	var strandedSamples int
	called := map[*simSub]bool{}
	flush := func(n *simNode) {
		if len(n.pending) == 0 {
			return
		}
		db.trips++ // one group commit for the node's batch
		rep.settleTrips++
		for _, c := range n.pending {
			charge := c.sub.lim.Need(billing.Scale)
			consume, covered, _ := n.leaser.Settle(ctx, c.hold, c.sub.lim, charge)
			got := db.settle(c.hold.Holder, c.sub.k, c.sub.lim, consume, covered, billing.Scale)
			c.sub.charged += got
			if got == billing.Scale {
				c.sub.acked += got
			} else {
				rep.shortCharged++
			}
		}
		n.pending = n.pending[:0]
	}
	for t := 0; t < ticks; t++ {
		clock = clock.Add(tick)
		for range callsPerTick {
			n := ns[rng.IntN(nodes)]
			if !n.alive {
				continue
			}
			s := pick()
			called[s] = true
			rep.calls++
			h, _, err := n.leaser.Take(ctx, s.k, s.lim, billing.Scale)
			if err != nil {
				rep.refused++
				if a := db.row(s.k); !db.fits(&simAllow{used: a.used, credits: a.credits}, s.lim, s.lim.Need(billing.Scale)) {
					rep.refusedAtLimit++
				}
				continue
			}
			rep.served++
			n.pending = append(n.pending, simCall{s, h})
		}
		// Each node commits what its calls settled meanwhile.
		if t%c.commitTicks == 0 {
			for _, n := range ns {
				if n.alive {
					flush(n)
				}
			}
		}
		// Deaths, back 1-20 s later.
		if rng.IntN(c.deathEvery) == 0 {
			n := ns[rng.IntN(nodes)]
			if n.alive {
				n.alive = false
				n.pending = nil // in flight: never acknowledged
				dead[n.leaser.node] = true
				n.back = clock.Add(time.Duration(1+rng.IntN(20)) * time.Second)
				rep.deaths++
			}
		}
		for _, n := range ns {
			if !n.alive && !clock.Before(n.back) {
				n.alive = true
				n.incarn++
				n.leaser = NewLeaser(db, fmt.Sprintf("%s/%d", n.id, n.incarn), cfg, now)
			}
		}
		// Every node renews its leases (returning those idle for two
		// seconds) every second, as maintain does; some node sweeps
		// expired leases as often.
		if t%int(time.Second/tick) == 0 {
			for _, n := range ns {
				if n.alive {
					n.leaser.Renew(ctx, 2*time.Second)
				}
			}
			db.sweep()
			st := db.stranded(dead)
			strandedSum += float64(st)
			strandedSamples++
			rep.strandedMax = max(rep.strandedMax, st)
		}
	}
	for _, n := range ns {
		if n.alive {
			flush(n)
			rep.roundTrips += n.leaser.Grants.Load()
		}
	}
	// Dead incarnations' counters are gone with them; the database counted
	// every request anyway.
	rep.roundTrips = db.trips
	// Past every lease's expiry, the sweep gives back everything the dead
	// left; live nodes close.
	for _, n := range ns {
		if n.alive {
			n.leaser.ReturnAll(ctx)
		}
	}
	clock = clock.Add(2 * cfg.TTL)
	db.sweep()
	rep.leftAfterExpiry = db.stranded(dead)
	if strandedSamples > 0 {
		rep.strandedAvg = strandedSum / float64(strandedSamples)
	}
	keys := make([]*simSub, 0, len(all))
	keys = append(keys, all...)
	sort.Slice(keys, func(i, j int) bool { return keys[i].k.UserID < keys[j].k.UserID })
	for _, s := range keys {
		if s.acked > s.limit {
			rep.overServed += s.acked - s.limit
		}
		a := db.row(s.k)
		if a.used != s.charged || a.leased != 0 || a.creditsHeld != 0 {
			rep.mismatch++
		}
		if called[s] {
			rep.subsWithCall++
			if a.used == s.limit {
				rep.exhausted++
			}
		}
	}
	return rep
}

// TestLeaseSimulation runs three shapes of traffic over 100 nodes and
// 10,000 subscriptions: thin (20,000 calls/s for the fleet, 200 a node; a
// fifth of the subscriptions take four fifths of the calls), dense
// (200,000 calls/s, same skew) and hot (200,000 calls/s, nine tenths of
// them on 100 subscriptions). The sizes shrink fourfold with -short; set
// PGSTORE_SIM=full for the sizes docs/fleet.md reports.
func TestLeaseSimulation(t *testing.T) {
	scale := 4
	if testing.Short() {
		scale = 16
	}
	if os.Getenv("PGSTORE_SIM") == "full" {
		scale = 1
	}
	for _, c := range []struct {
		name string
		cfg  simConfig
	}{
		{"thin", simConfig{nodes: 100, subs: 10_000, callsPerTick: 20, ticks: 40_000 / scale, commitTicks: 2,
			deathEvery: 1000 / scale, hotPercent: 20, hotTraffic: 80, seed: 1}},
		{"dense", simConfig{nodes: 100, subs: 10_000, callsPerTick: 200, ticks: 4_000 / scale, commitTicks: 2,
			deathEvery: 200 / scale, hotPercent: 20, hotTraffic: 80, seed: 2}},
		{"hot", simConfig{nodes: 100, subs: 10_000, callsPerTick: 200, ticks: 4_000 / scale, commitTicks: 2,
			deathEvery: 200 / scale, hotPercent: 1, hotTraffic: 90, seed: 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := runSimulation(c.cfg)
			t.Log(rep)
			if rep.overServed != 0 {
				t.Errorf("over-served %s units", rep.overServed)
			}
			if rep.mismatch != 0 {
				t.Errorf("%d allowances whose counters differ from what was charged, or still leased after expiry", rep.mismatch)
			}
			if rep.leftAfterExpiry != 0 {
				t.Errorf("%s units still stranded after every lease expired", rep.leftAfterExpiry)
			}
			if rep.shortCharged != 0 {
				t.Errorf("%d calls charged less than they were admitted for", rep.shortCharged)
			}
			if rep.deaths == 0 {
				t.Errorf("the simulation killed no node: %v", rep)
			}
		})
	}
}
