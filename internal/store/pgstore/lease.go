package pgstore

// The lease protocol, as pure logic behind LeaseDB, so that the simulation
// (sim_test.go) runs exactly the code a node runs against PostgreSQL.
//
// A hard limit (a blocked quota, a spending cap, a prepaid balance) is
// kept exactly across a fleet without a database write per call: a node
// leases a block of the allowance with one conditional UPDATE, which
// succeeds only if what is settled plus what every holder leased plus the
// block stays within the limit, and then admits calls from the block in
// memory. The block shrinks as the allowance runs out (a rule of eighths:
// at most an eighth of what is left) and falls to the call's own units
// near the limit, which is then a synchronous reservation. A lease lives
// TTL after its last renewal: a node renews its leases while it runs and
// stops admitting from a lease once its own (earlier) deadline passes, so
// that it never admits from units that the database may already have
// handed back; a node that dies leaves its unused units unavailable until
// the lease expires, never admitted twice.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// Vec is an amount in each dimension a hard limit bounds: quota units,
// priced spend (a spending cap) and prepaid credits.
type Vec struct {
	Units, Spend, Credits billing.Units
}

func (v Vec) add(w Vec) Vec { return Vec{v.Units + w.Units, v.Spend + w.Spend, v.Credits + w.Credits} }
func (v Vec) sub(w Vec) Vec { return Vec{v.Units - w.Units, v.Spend - w.Spend, v.Credits - w.Credits} }

// within reports whether v fits in w in every dimension.
func (v Vec) within(w Vec) bool {
	return v.Units <= w.Units && v.Spend <= w.Spend && v.Credits <= w.Credits
}

// IsZero reports whether v is nothing in every dimension.
func (v Vec) IsZero() bool { return v == Vec{} }

// AllowanceKey names a subscription's allowance in one billing period.
type AllowanceKey struct {
	UserID, ServiceID string
	Period            int64 // period start, Unix seconds
}

// Limits are the hard limits of a product as the lease statement checks
// them: Units caps settled plus leased units in the period, Spend settled
// plus leased spend, Credits says the prepaid balance bounds the credits
// leased, at Price a unit. Which limits a product has, and how its
// spending cap becomes one, is billing's rule (Product.HardLimits).
type Limits billing.HardLimits

// Hard reports whether the limits bound anything: without one, calls need
// no lease, only counting.
func (l Limits) Hard() bool { return l.Units != nil || l.Spend != nil || l.Credits }

// Need is what units take in each dimension the limits bound.
func (l Limits) Need(units billing.Units) Vec {
	var v Vec
	if l.Units != nil {
		v.Units = units
	}
	if l.Spend != nil {
		v.Spend = billing.Mul(units, l.Price)
	}
	if l.Credits {
		v.Credits = billing.Mul(units, l.Price)
	}
	return v
}

// unitsIn is how many units the amount left in each dimension still
// allows (the least of them); ok is false when no dimension is bounded.
func (l Limits) unitsIn(left Vec) (billing.Units, bool) {
	best, ok := billing.Units(0), false
	take := func(u billing.Units) {
		if !ok || u < best {
			best, ok = u, true
		}
	}
	if l.Units != nil {
		take(max(0, left.Units))
	}
	if l.Spend != nil {
		take(billing.Div(max(0, left.Spend), l.Price))
	}
	if l.Credits {
		take(billing.Div(max(0, left.Credits), l.Price))
	}
	return best, ok
}

// Dimensions a grant can be refused in.
const (
	DimNone = iota
	DimUnits
	DimSpend
	DimCredits
)

// Grant is the outcome of one lease request.
type Grant struct {
	// OK says the request was granted. Granted alone cannot say it: a
	// call that needs nothing (an endpoint of cost 0, a unit priced 0)
	// is granted a zero Vec, and was read as refused.
	OK bool
	// Granted is what was leased: the block asked for, the call's own
	// need when the block did not fit, or nothing (refused).
	Granted Vec
	// Left is what stays unleased in each bounded dimension after the
	// grant (before it, when refused): the next block is sized from it.
	Left Vec
	// Refused names the first dimension the call's own need did not fit
	// in, when Granted is zero.
	Refused int
}

// LeaseDB is what the lease protocol needs from the database. Every method
// is one atomic step (one statement or transaction).
type LeaseDB interface {
	// Grant leases big to holder's lease on k if every limit allows it,
	// else small, else nothing; the lease row expires ttl after now (the
	// database's clock). A row of holder's that has expired is neither
	// added to nor revived: errLeaseExpired, nothing granted.
	Grant(ctx context.Context, holder string, k AllowanceKey, lim Limits, big, small Vec, ttl time.Duration) (Grant, error)
	// Renew moves the expiry of holders' leases that have not expired yet
	// to ttl after now, and returns the holders it renewed: a lease the
	// database let expire is never revived.
	Renew(ctx context.Context, holders []string, ttl time.Duration) ([]string, error)
	// Return gives back everything the leases still hold and ends them.
	Return(ctx context.Context, leases []LeaseRef) error
	// ReturnPart gives back part of what a lease row that has not expired
	// holds (what no call of it holds or has consumed), keeping the rest
	// and the row's expiry; a row that has expired, or holds less than
	// part, is left to the sweep.
	ReturnPart(ctx context.Context, lease LeaseRef, part Vec) error
}

// LeaseRef names a lease row: its holder and allowance.
type LeaseRef struct {
	Holder string
	Key    AllowanceKey
}

// ErrRefused is what a lease says when the limits leave nothing for a call;
// the Grant says in which dimension.
var errRefused = errors.New("refused")

// errLapsed: a lease was found lapsed while leasing more (take); the
// call asks again, on a new row.
var errLapsed = errors.New("pgstore: the lease lapsed")

// errLeaseExpired is what Grant says when the holder's row has expired:
// the lease lapsed, and a lapsed lease leases nothing more.
var errLeaseExpired = errors.New("pgstore: the lease row has expired")

// LeaseConfig tunes a node's leases.
type LeaseConfig struct {
	// TTL is how long a lease outlives its last renewal in the database:
	// how long a dead node's unused units stay unavailable.
	TTL time.Duration
	// Max is the largest block leased at once, in units.
	Max billing.Units
	// RefuseFor is how long a refusal is remembered and answered without
	// asking the database again.
	RefuseFor time.Duration
	// Spawn runs a lease's refill in the background (go f()); nil runs it
	// in the call that started it.
	Spawn func(f func())
	// Busy, when set, says that settlements not yet in the database
	// consume from holder's lease row (the node's settlement log,
	// shiplog.go, or the group commit's queue, settler.go): the row is
	// not given back before they are written, or its consumed units would
	// go back to the allowance. (Settle moves a call's units out of held
	// at once; without the group commit's count a lease whose charges
	// waited more than the idle time for their commit was given back as
	// idle, found by a review.)
	Busy func(holder string) bool
}

// Leaser is one node's side of the protocol: its leases and the holds of
// its calls in flight. Safe for concurrent use.
type Leaser struct {
	db   LeaseDB
	node string // holder prefix: the node's id and incarnation
	cfg  LeaseConfig
	now  func() time.Time

	mu     sync.Mutex
	leases map[AllowanceKey]*lease
	gens   atomic.Int64 // numbers the lease rows: a holder is never reused

	// Grants counts the database round trips the leases made.
	Grants atomic.Int64
}

// lease is a node's lease on one allowance. gen numbers its lease row
// (the holder is node/gen, never reused): after a lease lapsed (the
// database unreachable past the deadline) a node starts a fresh row
// rather than count on units the database may have handed back meanwhile.
type lease struct {
	mu        sync.Mutex // held while a grant is in flight
	lim       Limits
	gen       int64
	holder    string // written under mu and Leaser.mu both: Renew reads it under Leaser.mu alone
	free      Vec    // leased, not held by any call
	held      Vec    // held by calls in flight, of this gen
	deadline  time.Time
	left      Vec           // unleased in the database after the last grant
	sized     bool          // left is known
	block     billing.Units // the last block asked for
	granted   time.Time     // when the last block was granted
	refilling bool          // a refill (topUp) is in flight
	refill    Vec           // what it asks for, counted as the node's meanwhile
	lastUse   time.Time
	refused   Grant
	refusedT  time.Time // when refused was learnt
	// refusedNeed is what the refused call needed: a call needing less
	// still asks.
	refusedNeed Vec
	dead        bool // returned; a new lease replaces it
	// stale: credits were taken from the subscription since the lease
	// was granted (a refund, a lost dispute, an expiry, an operator's
	// correction, told by LISTEN/NOTIFY): the next call asks the database
	// again (Invalidate).
	stale bool
}

// Hold is a call's claim on a lease.
type Hold struct {
	Key    AllowanceKey
	Holder string // the lease row the units came from
	Need   Vec
	Units  billing.Units
	gen    int64
}

// NewLeaser makes the protocol of one node. now is its clock (monotonic
// readings: only differences are used).
func NewLeaser(db LeaseDB, node string, cfg LeaseConfig, now func() time.Time) *Leaser {
	if cfg.TTL <= 0 {
		cfg.TTL = 30 * time.Second
	}
	if cfg.Max <= 0 {
		cfg.Max = billing.Whole(100)
	}
	if now == nil {
		now = time.Now
	}
	return &Leaser{db: db, node: node, cfg: cfg, now: now, leases: make(map[AllowanceKey]*lease)}
}

func (l *Leaser) holderOf(gen int64) string {
	return l.node + "/" + itoa(gen)
}

func itoa(n int64) string {
	var b [20]byte
	i := len(b)
	if n == 0 {
		return "0"
	}
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

// safeDeadline is when a lease renewed (or granted) by a request sent at
// sent stops being used: a tenth of the TTL before the database's expiry,
// which is at least TTL after sent.
func (l *Leaser) safeDeadline(sent time.Time) time.Time {
	return sent.Add(l.cfg.TTL - l.cfg.TTL/10)
}

func (l *Leaser) get(k AllowanceKey, lim Limits) *lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	le := l.leases[k]
	if le == nil || le.dead {
		le = &lease{lim: lim, gen: l.gens.Add(1)}
		le.holder = l.holderOf(le.gen)
		l.leases[k] = le
	}
	return le
}

// Take holds units for a call on allowance k: from the node's lease when
// it covers them, else by leasing a block (or the call's own units) from
// the database. A refusal is errRefused with the Grant saying why.
func (l *Leaser) Take(ctx context.Context, k AllowanceKey, lim Limits, units billing.Units) (Hold, Grant, error) {
	need := lim.Need(units)
	for {
		le := l.get(k, lim)
		le.mu.Lock()
		if le.dead { // returned while we waited
			le.mu.Unlock()
			continue
		}
		h, g, err := l.take(ctx, le, k, lim, units, need)
		le.mu.Unlock()
		if err == errLapsed {
			continue // once: the lease's next row is a new one
		}
		return h, g, err
	}
}

func (l *Leaser) take(ctx context.Context, le *lease, k AllowanceKey, lim Limits, units billing.Units, need Vec) (Hold, Grant, error) {
	now := l.now()
	// Units leased under other limits (a product changed, a quota lowered
	// by a reload) are not this call's to take: the lease starts again
	// under the new ones, as a lapsed one does. Kept, a node went on
	// admitting calls from a block leased under a larger quota, up to a
	// block past the new one.
	changed := !sameLimits(le.lim, lim) || le.stale
	if changed {
		le.refusedT = time.Time{} // a refusal under the old limits says nothing now
	}
	le.stale = false
	changed = changed && !le.deadline.IsZero()
	le.lim = lim
	valid := now.Before(le.deadline) && !changed
	if valid && need.within(le.free) {
		le.free = le.free.sub(need)
		le.held = le.held.add(need)
		le.lastUse = now
		l.topUp(le, k, lim, units, now)
		return Hold{Key: k, Holder: le.holder, Need: need, Units: units, gen: le.gen}, Grant{}, nil
	}
	if !le.refusedT.IsZero() && now.Sub(le.refusedT) < l.cfg.RefuseFor && le.refusedNeed.within(need) {
		// Refused a moment ago for as much or less: still refused.
		return Hold{}, le.refused, errRefused
	}
	if !valid && !le.deadline.IsZero() {
		// The lease lapsed (renewals failed), or its limits or its
		// subscription changed: its row is given up and a fresh one
		// started; calls still holding its units settle against the old
		// row. A row that settlements not yet written consume from is
		// left to expire, and so is the row of a lease that has not
		// lapsed while calls hold units of it: given back, those units
		// would be leased again while the calls still spend them.
		if !l.busy(le.holder) && (!changed || le.held.IsZero()) {
			if err := l.db.Return(ctx, []LeaseRef{{le.holder, k}}); err != nil {
				l.Grants.Add(1)
				return Hold{}, Grant{}, err
			}
			l.Grants.Add(1)
		} else if changed && !le.free.IsZero() && now.Before(le.deadline) {
			// The row stays for the calls that hold or consumed units
			// of it, but what none of them has is given back now: kept
			// until the row expired (lease_ttl), the leftover of a block
			// leased under the old limits held the last units of a
			// quota, or the last credits of a balance, from the new
			// lease, whose calls were refused meanwhile where the
			// embedded store served them. Not given back (an error), it
			// comes back when the row expires, as before.
			l.db.ReturnPart(ctx, LeaseRef{le.holder, k}, le.free)
			l.Grants.Add(1)
		}
		le.gen = l.gens.Add(1)
		l.mu.Lock() // Renew reads holder under l.mu alone (le.mu.TryLock failed)
		le.holder = l.holderOf(le.gen)
		l.mu.Unlock()
		le.free, le.held = Vec{}, Vec{}
		le.deadline = time.Time{}
	}
	big := need
	block := l.blockSize(le, lim, units, now)
	if block > units {
		big = lim.Need(block)
	}
	sent := l.now()
	g, err := l.db.Grant(ctx, le.holder, k, lim, big, need, l.cfg.TTL)
	l.Grants.Add(1)
	if err != nil {
		if errors.Is(err, errLeaseExpired) && !le.deadline.IsZero() {
			// The database let the row expire before the node's deadline
			// (a clock that ran slow, a request held up): the lease has
			// lapsed, and the call asks again on a new row (Take).
			le.deadline = sent
			return Hold{}, Grant{}, errLapsed
		}
		return Hold{}, Grant{}, err
	}
	le.left, le.sized = g.Left, true
	if g.Granted == big {
		le.block, le.granted = block, l.now()
	}
	if !g.OK {
		le.refused, le.refusedT, le.refusedNeed = g, l.now(), need
		return Hold{}, g, errRefused
	}
	le.refusedT = time.Time{}
	if !valid {
		le.free = Vec{}
	}
	le.free = le.free.add(g.Granted).sub(need)
	le.held = le.held.add(need)
	le.deadline = l.safeDeadline(sent)
	le.lastUse = l.now()
	return Hold{Key: k, Holder: le.holder, Need: need, Units: units, gen: le.gen}, g, nil
}

// topUp leases the next block ahead, while half of the current one is
// still free, so that a busy lease's callers never wait for its refill
// (le.mu held). Only a busy lease does: one whose blocks grew to eight
// calls or more. Near the limit, where the next block would be the call's
// own units, it does nothing: those calls reserve synchronously.
func (l *Leaser) topUp(le *lease, k AllowanceKey, lim Limits, units billing.Units, now time.Time) {
	if le.refilling || units <= 0 || le.block < 8*units {
		return // not busy: the block has not grown past a few calls
	}
	if free, ok := lim.unitsIn(le.free); !ok || free >= le.block/2 {
		return
	}
	block := l.blockSize(le, lim, units, now)
	if block <= units {
		return
	}
	le.refilling = true
	holder, gen, big := le.holder, le.gen, lim.Need(block)
	le.refill = big
	refill := func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL/10)
		defer cancel()
		le.mu.Lock()
		sent := l.now()
		if !sent.Before(le.deadline) || le.gen != gen || le.dead {
			// Lapsed (or ended) before the refill was sent: a lapsed
			// lease leases nothing more (Settle).
			le.refilling, le.refill = false, Vec{}
			le.mu.Unlock()
			return
		}
		le.mu.Unlock()
		g, err := l.db.Grant(ctx, holder, k, lim, big, big, l.cfg.TTL)
		l.Grants.Add(1)
		le.mu.Lock()
		defer le.mu.Unlock()
		le.refilling, le.refill = false, Vec{}
		if errors.Is(err, errLeaseExpired) && le.gen == gen && sent.Before(le.deadline) {
			le.deadline = sent // lapsed: see take
		}
		if err != nil {
			return // the next call that finds the lease short leases itself
		}
		le.left, le.sized = g.Left, true
		if !g.OK || le.gen != gen || le.dead {
			// Refused, or the lease ended meanwhile: units granted to a
			// row no one renews come back when it expires.
			return
		}
		le.free = le.free.add(g.Granted)
		le.block, le.granted = block, l.now()
		if dl := l.safeDeadline(sent); sent.Before(le.deadline) && le.deadline.Before(dl) {
			le.deadline = dl
		}
	}
	if l.cfg.Spawn == nil {
		le.mu.Unlock() // run inline (the simulation), as the goroutine would
		refill()
		le.mu.Lock()
		return
	}
	l.cfg.Spawn(refill)
}

// blockSize is how many units to lease for a call of units. Demand sets
// it like a TCP window: a first lease is small (two calls), and each
// block used up within a second doubles the next, up to Max; a lease that
// lasted longer asks for the same again. Supply caps it: at
// most an eighth of what the database had left at the last grant, so that
// near the limit blocks shrink to the call's own units (a synchronous
// reservation) and the nodes share what is left. Blocks are whole
// multiples of the call's units.
func (l *Leaser) blockSize(le *lease, lim Limits, units billing.Units, now time.Time) billing.Units {
	block := min(l.cfg.Max, 2*max(units, billing.Scale))
	if le.block > 0 {
		block = le.block
		if now.Sub(le.granted) < time.Second {
			block = min(l.cfg.Max, 2*le.block)
		}
	}
	if le.sized {
		if left, ok := lim.unitsIn(le.left); ok {
			block = min(block, left/8)
		}
	}
	if units > 0 {
		block = block / units * units
	}
	return block
}

// Settle ends hold h, which consumed charge (what the call is charged in
// each dimension). It returns what the charge takes from the lease row
// (consume, to be written with the charge) and whether the whole charge
// is covered: a charge beyond the hold is taken from the lease's free
// units, or leased for it; what cannot be covered is capped by the caller
// against the database (capped).
func (l *Leaser) Settle(ctx context.Context, h Hold, lim Limits, charge Vec) (consume Vec, covered bool, err error) {
	l.mu.Lock()
	le := l.leases[h.Key]
	l.mu.Unlock()
	if le == nil {
		return Vec{}, false, nil
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	current := le.gen == h.gen && !le.dead
	if charge.within(h.Need) {
		if current {
			le.held = le.held.sub(h.Need)
			le.free = le.free.add(h.Need.sub(charge))
			le.lastUse = l.now()
		}
		return charge, true, nil
	}
	if !current {
		return h.Need, false, nil
	}
	now := l.now()
	le.held = le.held.sub(h.Need)
	le.lastUse = now // its charge is not written yet: not idle (Renew)
	extra := charge.sub(h.Need)
	if now.Before(le.deadline) {
		if extra.within(le.free) {
			le.free = le.free.sub(extra)
			return charge, true, nil
		}
		var g Grant
		g, err = l.db.Grant(ctx, le.holder, h.Key, lim, extra, extra, l.cfg.TTL)
		l.Grants.Add(1)
		if err == nil && g.OK {
			return charge, true, nil
		}
		if errors.Is(err, errLeaseExpired) {
			le.deadline = now // lapsed: see take
		}
	}
	// A lapsed lease leases nothing more: its row may have expired and
	// been swept (its units handed back), and a grant on its holder would
	// make a fresh row for it, which the next renewal would find alive.
	// (It did: the node admitted calls again from free units the database
	// had given to others.)
	// What the hold and the lease have is consumed; the rest is capped.
	consume = h.Need
	le.free, consume = Vec{}, consume.add(le.free)
	return consume, false, err
}

// Release gives a hold's units back to its lease unused (a charge that
// could not be written, a call that charged nothing).
func (l *Leaser) Release(h Hold) {
	l.mu.Lock()
	le := l.leases[h.Key]
	l.mu.Unlock()
	if le == nil {
		return
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.gen == h.gen && !le.dead {
		le.held = le.held.sub(h.Need)
		le.free = le.free.add(h.Need)
	}
}

func (l *Leaser) busy(holder string) bool {
	return l.cfg.Busy != nil && l.cfg.Busy(holder)
}

// Renew extends every live lease of the node; leases idle for idle with
// nothing held are returned instead, so that their units serve other nodes.
// It returns how many leases it returned.
func (l *Leaser) Renew(ctx context.Context, idle time.Duration) (int, error) {
	now := l.now()
	var holders []string
	var idleOnes []ret
	l.mu.Lock()
	for k, le := range l.leases {
		if !le.mu.TryLock() {
			holders = append(holders, le.holder) // a grant in flight: keep it
			continue
		}
		switch {
		case le.dead:
		case le.held.IsZero() && now.Sub(le.lastUse) >= idle && !l.busy(le.holder):
			le.dead = true
			idleOnes = append(idleOnes, ret{k, le})
			delete(l.leases, k)
		case !le.deadline.IsZero():
			holders = append(holders, le.holder)
		}
		le.mu.Unlock()
	}
	l.mu.Unlock()
	firstErr := l.returnLeases(ctx, idleOnes)
	if len(holders) == 0 {
		return len(idleOnes), firstErr
	}
	sent := l.now()
	l.Grants.Add(1)
	renewed, err := l.db.Renew(ctx, holders, l.cfg.TTL)
	if err != nil {
		return len(idleOnes), err
	}
	ok := make(map[string]bool, len(renewed))
	for _, h := range renewed {
		ok[h] = true
	}
	dl := l.safeDeadline(sent)
	l.mu.Lock()
	for _, le := range l.leases {
		if le.mu.TryLock() {
			// A lease whose deadline had passed when the renewal was sent
			// stays lapsed for good, even if its row was found alive: the
			// database may have handed its units back meanwhile (a row
			// found alive then was not the one the node leased: a grant
			// after the sweep had made it, found by a review). Its row,
			// if alive, is renewed for the charges of its calls; the next
			// call starts a new lease.
			if ok[le.holder] && sent.Before(le.deadline) && le.deadline.Before(dl) {
				le.deadline = dl
			}
			le.mu.Unlock()
		}
	}
	l.mu.Unlock()
	return len(idleOnes), firstErr
}

type ret struct {
	k  AllowanceKey
	le *lease
}

// returnLeases gives leases back in one request. A lease that could not
// be given back expires by itself.
func (l *Leaser) returnLeases(ctx context.Context, rs []ret) error {
	if len(rs) == 0 {
		return nil
	}
	refs := make([]LeaseRef, len(rs))
	for i, r := range rs {
		refs[i] = LeaseRef{r.le.holder, r.k}
	}
	l.Grants.Add(1)
	return l.db.Return(ctx, refs)
}

// GiveBack gives the node's lease on k back, as an idle one is (Renew),
// when no call holds units of it, no refill is in flight and no charge not
// yet written consumes from it: another node's job completion past its
// hold asks for the units it does not use (askLeasesBack). It reports
// whether it gave it back.
func (l *Leaser) GiveBack(ctx context.Context, k AllowanceKey) (bool, error) {
	l.mu.Lock()
	le := l.leases[k]
	if le == nil || !le.mu.TryLock() {
		l.mu.Unlock()
		return false, nil // none, or a grant in flight: in use
	}
	ok := !le.dead && !le.deadline.IsZero() && le.held.IsZero() && !le.refilling && !l.busy(le.holder)
	if ok {
		le.dead = true
		delete(l.leases, k)
	}
	le.mu.Unlock()
	l.mu.Unlock()
	if !ok {
		return false, nil
	}
	return true, l.returnLeases(ctx, []ret{{k, le}})
}

// ReturnAll gives every lease back (Close): units held by calls still in
// flight go back too, and their charges are capped when they settle.
func (l *Leaser) ReturnAll(ctx context.Context) error {
	l.mu.Lock()
	all := l.leases
	l.leases = make(map[AllowanceKey]*lease)
	l.mu.Unlock()
	var rs []ret
	for k, le := range all {
		le.mu.Lock()
		le.dead = true
		if !le.deadline.IsZero() && !l.busy(le.holder) {
			rs = append(rs, ret{k, le})
		}
		le.mu.Unlock()
	}
	return l.returnLeases(ctx, rs)
}

// Mine is what the node's lease on k holds in the database as far as the
// node knows: its free units and its calls' holds.
func (l *Leaser) Mine(k AllowanceKey) Vec {
	l.mu.Lock()
	le := l.leases[k]
	l.mu.Unlock()
	if le == nil {
		return Vec{}
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.free.add(le.held).add(le.refill)
}

// MineOf sums Mine over every period of a subscription.
func (l *Leaser) MineOf(userID, serviceID string) Vec {
	l.mu.Lock()
	var keys []AllowanceKey
	for k := range l.leases {
		if k.UserID == userID && k.ServiceID == serviceID {
			keys = append(keys, k)
		}
	}
	l.mu.Unlock()
	var sum Vec
	for _, k := range keys {
		sum = sum.add(l.Mine(k))
	}
	return sum
}

// Free is what the node's lease on k has leased and not held (tests and
// the simulation).
func (l *Leaser) Free(k AllowanceKey) Vec {
	l.mu.Lock()
	le := l.leases[k]
	l.mu.Unlock()
	if le == nil {
		return Vec{}
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	if !l.now().Before(le.deadline) {
		return Vec{}
	}
	return le.free
}

// sameLimits reports whether a and b bound the same quantities alike.
func sameLimits(a, b Limits) bool {
	eq := func(x, y *billing.Units) bool { return x == nil && y == nil || x != nil && y != nil && *x == *y }
	return eq(a.Units, b.Units) && eq(a.Spend, b.Spend) && eq(a.OverageCap, b.OverageCap) && a.Credits == b.Credits && a.Price == b.Price &&
		a.Unit == b.Unit
}

// Invalidate makes this node's leases of the subscription's allowances
// ask the database at their next call, instead of admitting it from what
// they leased: credits were taken from the subscription (a refund or a
// lost dispute, which may take its balance below zero, an expiry, an
// operator's correction). A lease is a part of the allowance taken out
// as it was when it was granted; kept after such a change, a node went on
// serving calls from credits leased before a refund that took the
// balance below zero, where every call must be refused. (A change of
// plan is seen by the limits a call brings: take.)
func (l *Leaser) Invalidate(userID, serviceID string) {
	l.invalidate(func(k AllowanceKey) bool { return k.UserID == userID && k.ServiceID == serviceID })
}

// InvalidateAll is Invalidate for every lease of this node (changes were
// missed: the notification connection was down).
func (l *Leaser) InvalidateAll() { l.invalidate(func(AllowanceKey) bool { return true }) }

func (l *Leaser) invalidate(match func(AllowanceKey) bool) {
	l.mu.Lock()
	var les []*lease
	for k, le := range l.leases {
		if match(k) {
			les = append(les, le)
		}
	}
	l.mu.Unlock()
	for _, le := range les {
		le.mu.Lock() // after a grant in flight, whose answer may predate the change
		le.stale = true
		le.mu.Unlock()
	}
}

// Spare is free units of a node's lease taken out for a charge that the
// database decides rather than the lease (a job's completion past its
// hold, endJob): no call is admitted from them meanwhile, the charge's
// transaction shrinks the lease row (Holder) by Need, and PutBack gives
// back what it did not take from the row.
type Spare struct {
	Key    AllowanceKey
	Holder string
	Need   Vec
	gen    int64
}

func (l *Leaser) lookup(k AllowanceKey) *lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leases[k]
}

// spareUnits is how many of le's free units a charge under lim may take
// (le.mu held): none from a lease that ended, lapsed, is stale or was
// leased under other limits, from which take admits no call either.
func (l *Leaser) spareUnits(le *lease, lim Limits) billing.Units {
	if le.dead || le.stale || !sameLimits(le.lim, lim) || !l.now().Before(le.deadline) {
		return 0
	}
	n, ok := lim.unitsIn(le.free)
	if !ok {
		return 0
	}
	return n
}

// MayHaveFree reports whether the node's lease on k may have free units
// for a charge under lim. It never waits: a caller in a transaction must
// not wait for a grant in flight, which may be waiting for the rows the
// transaction locked; when a grant holds the lease it answers true.
func (l *Leaser) MayHaveFree(k AllowanceKey, lim Limits) bool {
	le := l.lookup(k)
	if le == nil {
		return false
	}
	if !le.mu.TryLock() {
		return true
	}
	defer le.mu.Unlock()
	return l.spareUnits(le, lim) > 0
}

// TakeFree takes up to units of the free units of the node's lease on k
// out of the lease, for a charge under lim (see Spare). It waits for a
// grant in flight: never call it inside a transaction.
func (l *Leaser) TakeFree(k AllowanceKey, lim Limits, units billing.Units) Spare {
	le := l.lookup(k)
	if le == nil || units <= 0 {
		return Spare{}
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	n := min(units, l.spareUnits(le, lim))
	need := lim.Need(n)
	if n <= 0 || need.IsZero() || !need.within(le.free) {
		return Spare{}
	}
	le.free = le.free.sub(need)
	le.lastUse = l.now() // not idle while its charge is written (Renew)
	return Spare{Key: k, Holder: le.holder, Need: need, gen: le.gen}
}

// PutBack gives v of sp, which its charge did not take from the lease row,
// back to the lease's free units: only to the lease sp was taken from, if
// it has not ended (a new row, or a lease given back, never gets units
// its row does not hold). A lease that lapsed meanwhile takes them back
// too: take admits nothing from a lapsed lease's free units, and a
// settlement of one of its calls consumes them from its row, which holds
// them.
func (l *Leaser) PutBack(sp Spare, v Vec) {
	if v.IsZero() {
		return
	}
	le := l.lookup(sp.Key)
	if le == nil {
		return
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.gen == sp.gen && !le.dead {
		le.free = le.free.add(v)
	}
}
