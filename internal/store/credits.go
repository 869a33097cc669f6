package store

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// ErrBadInput says a Payments call was given something it cannot store (an
// empty id, a limit below 1, a grant of no credits): nothing was written.
var ErrBadInput = errors.New("bad input")

func badInput(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, a...))
}

// CheckPaymentRecordID says whether kind and id may name a record: both
// set, neither holding a NUL byte (the bbolt store joins them with one).
func CheckPaymentRecordID(kind, id string) error {
	if kind == "" || id == "" {
		return badInput("a payment record needs a kind and an id (got %q, %q)", kind, id)
	}
	if strings.ContainsRune(kind, 0) || strings.ContainsRune(id, 0) {
		return badInput("a payment record's kind and id hold no NUL byte")
	}
	return nil
}

// CheckListLimit says whether limit may page a listing.
func CheckListLimit(limit int) error {
	if limit <= 0 {
		return badInput("limit %d: a page holds at least one record", limit)
	}
	return nil
}

// CheckGrant says whether g may be granted: an id, a subscription, a
// positive amount, a grant time, an expiry (when set) after it, and nothing
// reversed or expired yet.
func CheckGrant(g CreditGrant) error {
	switch {
	case g.ID == "" || g.UserID == "" || g.ServiceID == "":
		return badInput("a credit grant needs an id, a user and a service")
	case g.Credits <= 0:
		return badInput("credit grant %s: credits %s, want more than 0", g.ID, g.Credits)
	case g.GrantedAt.IsZero():
		return badInput("credit grant %s: no grant time", g.ID)
	case !g.ExpiresAt.IsZero() && !g.ExpiresAt.After(g.GrantedAt):
		return badInput("credit grant %s: expires at %s, not after it was granted", g.ID, g.ExpiresAt.Format(time.RFC3339))
	case g.Reversed != 0 || g.Expired != 0 || !g.ExpiredAt.IsZero() || g.ExpiredLater != 0 || g.Deferred != 0:
		return badInput("credit grant %s: a new grant has nothing reversed or expired", g.ID)
	}
	return nil
}

// CheckReversal says whether r may be applied: an id, a grant, a positive
// amount and a time.
func CheckReversal(r CreditReversal) error {
	switch {
	case r.ID == "" || r.GrantID == "":
		return badInput("a credit reversal needs an id and a grant id")
	case r.Credits <= 0:
		return badInput("credit reversal %s: credits %s, want more than 0", r.ID, r.Credits)
	case r.At.IsZero():
		return badInput("credit reversal %s: no time", r.ID)
	}
	return nil
}

// CheckLease says whether a lease may be taken by holder for ttl.
func CheckLease(name, holder string, ttl time.Duration) error {
	if name == "" || holder == "" {
		return badInput("a lease needs a name and a holder")
	}
	if ttl <= 0 {
		return badInput("lease %s: ttl %s, want more than 0", name, ttl)
	}
	return nil
}

// Left is what the grant still gives: what it granted less what reversals
// took back, what expired and what is still to expire as the holds of its
// expiry give it back (Deferred), never below 0.
func (g CreditGrant) Left() billing.Units {
	return max(0, g.Credits-g.Reversed-g.Expired-g.Deferred)
}

// Reverse takes up to credits back from g, never more than it has left,
// and returns g after it with what it took.
func (g CreditGrant) Reverse(credits billing.Units) (CreditGrant, billing.Units) {
	took := min(max(credits, 0), g.Left())
	g.Reversed += took
	return g, took
}

// OlderGrant orders grants oldest first: by GrantedAt, then by ID.
func OlderGrant(a, b CreditGrant) int {
	if c := a.GrantedAt.Compare(b.GrantedAt); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// ExpireGrants is the expiry rule, one subscription at a time: given its
// balance and its grants (any order), it returns the grants due at now
// (ExpiresAt <= now, not expired yet) with Expired and ExpiredAt set, oldest
// first, and the balance after removing what they had left.
//
// Credits are spent oldest grant first, so the balance is made of the
// newest grants: what is left of an expiring grant is
//
//	clamp(balance - (what the live grants granted after it have left), 0, its Left)
//
// taken in order, oldest first, each from the balance the one before left.
// A live grant is one not expired yet; "after" is GrantedAt order, ties by
// ID. Credits not from any grant (a balance from before grants, operator
// AddCredits) are the part of the balance the live grants do not explain;
// once spending has gone below what the grants have left, the store cannot
// tell them apart, so they count as spent before any grant. Credits that
// must outlast an expiring grant are granted (GrantCredits with no
// ExpiresAt), not added. A negative balance expires nothing.
//
// For example: grant A of 100 expiring at T, then grant B of 50 with no
// expiry, then 70 spent: the balance is 80, B has 50 left, so A has
// clamp(80-50, 0, 100) = 30 left; at T, 30 expire and the balance is 50.
func ExpireGrants(balance billing.Units, grants []CreditGrant, now time.Time) ([]CreditGrant, billing.Units) {
	live, newer := liveByAge(grants)
	var out []CreditGrant
	for i, g := range live {
		if g.ExpiresAt.IsZero() || g.ExpiresAt.After(now) {
			continue
		}
		left := min(above(balance, newer[i+1]), g.Left())
		g.Expired += left
		g.ExpiredAt = now.UTC()
		balance -= left
		out = append(out, g)
	}
	return out, balance
}

// above is what b has above n (n >= 0), never below 0: b - n without
// wrapping when b is near the least a balance holds (reports past the
// limits saturate it there), which would make a huge free balance of it.
func above(b, n billing.Units) billing.Units {
	if b <= n {
		return 0
	}
	return b - n
}

// ExpireGrantsHeld is the expiry rule with credits held (calls in flight,
// open jobs, blocks leased to nodes): held credits count as spent, so the
// grants due expire (Expired) what they have left of the free balance
// (balance - held), as ExpireGrants says. What they would have left of
// the whole balance beyond that was not removed only because it was held:
// it is Deferred, to expire later as far as the holds open now give it
// back unspent (HeldStack). It returns the grants due, oldest first, the
// balance after (the free balance after, plus held) and what the holds
// hold by the age of the credits (HeldStack): the deferred credits of each
// grant due, and under and above them the credits of the grants that do
// not expire then and those not from a grant (the slack).
//
// grants may hold those of a deferred expiry still open (ExpiredAt set,
// Deferred > 0), whose holds held counts: every hold open now predates
// this expiry too, so their deferred credits stay deferred, held, and
// take their place in the stack by their grant's age; the rest of held
// is placed as above.
//
// For example: grant A of 100 expiring, then grant B of 50 with no
// expiry, 70 spent and 80 held by open jobs: the free balance is 0, so
// nothing expires at once; of the whole balance A has 80-50 = 30 left, so
// 30 are deferred, and over them are B's 50. Jobs failing give back 80:
// the first 50 are B's, the next 30 expire.
func ExpireGrantsHeld(balance, held billing.Units, grants []CreditGrant, now time.Time) ([]CreditGrant, billing.Units, HeldStack) {
	held = max(held, 0)
	var owed billing.Units
	var pending []CreditGrant
	for _, g := range grants {
		if !g.ExpiredAt.IsZero() && g.Deferred > 0 {
			pending = append(pending, g)
			owed = billing.SatAdd(owed, g.Deferred)
		}
	}
	// The balance may be at the least a balance holds (reports past the
	// limits saturate it): what is taken off it saturates there too, so
	// a balance at or below what is held has nothing free to expire,
	// rather than wrapping to a huge free balance that expires every
	// grant due in full (ExpireCreditsSaturated of the contract suite).
	total := balance
	owed = min(owed, held)
	balance, held = billing.SatAdd(balance, -owed), held-owed
	free := billing.SatAdd(balance, -held)
	out, after := ExpireGrants(free, grants, now)
	// What the grants due remove: 0 unless free > 0, then at most free.
	expired := free - after
	if held == 0 && len(pending) == 0 {
		return out, total - expired, HeldStack{}
	}
	// The same grants due, in the same order, from the whole balance.
	whole, _ := ExpireGrants(balance, grants, now)
	room := held
	deferred := map[string]billing.Units{}
	for i := range out {
		d := min(max(whole[i].Expired-out[i].Expired, 0), room)
		out[i].Deferred += d
		room -= d
		deferred[out[i].ID] = d
	}
	// What each live grant has of the held credits: its part of the
	// whole balance less its part of the free one (ExpireGrants' rule,
	// the balance made of the newest grants); the rest of held is credits
	// not from a grant, the oldest.
	live, newer := liveByAge(grants)
	part := func(i int, b billing.Units) billing.Units { return min(above(b, newer[i+1]), live[i].Left()) }
	type layer struct {
		g        CreditGrant
		held     billing.Units
		deferred bool
	}
	layers := make([]layer, 0, len(live)+len(pending))
	nongrant := held
	for i, g := range live {
		h := part(i, balance) - part(i, free)
		d, due := deferred[g.ID]
		if due {
			h = d
		}
		nongrant = billing.SatAdd(nongrant, -h)
		layers = append(layers, layer{g, h, due && d > 0})
	}
	for _, g := range pending {
		layers = append(layers, layer{g, g.Deferred, true})
	}
	slices.SortStableFunc(layers, func(a, b layer) int { return OlderGrant(a.g, b.g) })
	st := HeldStack{}
	below := max(nongrant, 0)
	for _, l := range layers {
		if !l.deferred {
			below = billing.SatAdd(below, l.held)
			continue
		}
		st.Layers = append(st.Layers, HeldLayer{ID: l.g.ID, Below: below, Deferred: l.held})
		below = 0
	}
	st.Top = below
	return out, total - expired, st
}

// liveByAge is the grants of grants not expired yet, oldest first, and
// newer[i], what the live grants after the i-th have left (saturating).
func liveByAge(grants []CreditGrant) ([]CreditGrant, []billing.Units) {
	live := make([]CreditGrant, 0, len(grants))
	for _, g := range grants {
		if g.ExpiredAt.IsZero() {
			live = append(live, g)
		}
	}
	slices.SortFunc(live, OlderGrant)
	newer := make([]billing.Units, len(live)+1)
	for i := len(live) - 1; i >= 0; i-- {
		newer[i] = billing.SatAdd(newer[i+1], live[i].Left())
	}
	return live, newer
}

// HeldLayer is one grant's part of a HeldStack: Deferred, what the holds
// hold of the grant's expired credits, and Below, what they hold under
// it (older) that does not expire.
type HeldLayer struct {
	ID       string
	Below    billing.Units
	Deferred billing.Units
}

// HeldStack is what the holds open at a deferred expiry still hold, by the
// age of the credits, oldest first: each expired grant's deferred credits
// with what does not expire under them (credits not from a grant, older
// grants not due), then Top, what does not expire above the newest.
// Credits are spent oldest first, so what the holds charge is taken from
// the bottom (Charge) and what they give back from the top (GiveBack):
// of it, the deferred credits expire, the rest stays in the balance.
type HeldStack struct {
	Layers []HeldLayer
	Top    billing.Units
}

// Total is what the stack holds.
func (s HeldStack) Total() billing.Units {
	t := s.Top
	for _, l := range s.Layers {
		t += l.Below + l.Deferred
	}
	return t
}

// Slack is what the stack holds that does not expire.
func (s HeldStack) Slack() billing.Units {
	t := s.Top
	for _, l := range s.Layers {
		t += l.Below
	}
	return t
}

// Charge takes c off the bottom of s (holds charged it: spent), never more
// than s holds. It returns the stack after and what it took of each
// layer's Deferred.
func (s HeldStack) Charge(c billing.Units) (HeldStack, []billing.Units) {
	c = max(c, 0)
	out := HeldStack{Layers: slices.Clone(s.Layers), Top: s.Top}
	took := make([]billing.Units, len(out.Layers))
	for i := range out.Layers {
		l := &out.Layers[i]
		n := min(c, max(l.Below, 0))
		l.Below -= n
		c -= n
		took[i] = min(c, max(l.Deferred, 0))
		l.Deferred -= took[i]
		c -= took[i]
	}
	out.Top -= min(c, max(out.Top, 0))
	return out, took
}

// GiveBack takes r off the top of s (holds gave it back unspent), never
// more than s holds. It returns the stack after, what expires of each
// layer's Deferred, and their sum: never more than r nor than is
// deferred.
func (s HeldStack) GiveBack(r billing.Units) (HeldStack, []billing.Units, billing.Units) {
	r = max(r, 0)
	out := HeldStack{Layers: slices.Clone(s.Layers), Top: s.Top}
	exp := make([]billing.Units, len(out.Layers))
	n := min(r, max(out.Top, 0))
	out.Top -= n
	r -= n
	var sum billing.Units
	for i := len(out.Layers) - 1; i >= 0; i-- {
		l := &out.Layers[i]
		exp[i] = min(r, max(l.Deferred, 0))
		l.Deferred -= exp[i]
		r -= exp[i]
		sum += exp[i]
		n := min(r, max(l.Below, 0))
		l.Below -= n
		r -= n
	}
	return out, exp, sum
}
