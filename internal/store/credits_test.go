package store

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// TestExpireGrants holds the expiry rule to concrete numbers.
func TestExpireGrants(t *testing.T) {
	t0 := time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC)
	due := t0.Add(time.Hour)
	w := billing.Whole
	g := func(id string, credits int64, at time.Duration, expires bool) CreditGrant {
		c := CreditGrant{ID: id, Credits: w(credits), GrantedAt: t0.Add(at)}
		if expires {
			c.ExpiresAt = due
		}
		return c
	}
	for _, tc := range []struct {
		name    string
		balance int64
		grants  []CreditGrant
		expired map[string]int64 // grant id -> credits expired
		after   int64
	}{
		{"nothing spent", 100, []CreditGrant{g("A", 100, 0, true)}, map[string]int64{"A": 100}, 0},
		{"part spent", 40, []CreditGrant{g("A", 100, 0, true)}, map[string]int64{"A": 40}, 0},
		{"a newer grant is spent last", 80, []CreditGrant{g("A", 100, 0, true), g("B", 50, time.Minute, false)},
			map[string]int64{"A": 30}, 50},
		{"an older grant is spent first", 80, []CreditGrant{g("A", 100, 0, false), g("B", 50, time.Minute, true)},
			map[string]int64{"B": 50}, 30},
		{"the newer grant spent into", 30, []CreditGrant{g("A", 100, 0, true), g("B", 50, time.Minute, false)},
			map[string]int64{"A": 0}, 30},
		{"credits beyond the grants never expire", 130, []CreditGrant{g("A", 100, 0, true)}, map[string]int64{"A": 100}, 30},
		{"two due, oldest first", 120, []CreditGrant{g("B", 50, time.Minute, true), g("A", 100, 0, true)},
			map[string]int64{"A": 70, "B": 50}, 0},
		{"overdrawn", -5, []CreditGrant{g("A", 100, 0, true)}, map[string]int64{"A": 0}, -5},
		{"reversed part is not left", 100, []CreditGrant{{ID: "A", Credits: w(100), Reversed: w(60), GrantedAt: t0, ExpiresAt: due}},
			map[string]int64{"A": 40}, 60},
		{"same time, by id", 15, []CreditGrant{g("b", 10, 0, false), g("a", 10, 0, true)}, map[string]int64{"a": 5}, 10},
		{"expired before", 50, []CreditGrant{{ID: "A", Credits: w(100), GrantedAt: t0, ExpiresAt: due, Expired: w(50), ExpiredAt: due}},
			map[string]int64{}, 50},
		{"not due yet", 50, []CreditGrant{{ID: "A", Credits: w(100), GrantedAt: t0, ExpiresAt: due.Add(time.Nanosecond)}},
			map[string]int64{}, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, after := ExpireGrants(w(tc.balance), tc.grants, due)
			if after != w(tc.after) {
				t.Errorf("balance after %s, want %d", after, tc.after)
			}
			if len(got) != len(tc.expired) {
				t.Fatalf("expired %+v, want %v", got, tc.expired)
			}
			for i, e := range got {
				if want, ok := tc.expired[e.ID]; !ok || e.Expired != w(want) || !e.ExpiredAt.Equal(due) {
					t.Errorf("expired %s: %s at %s, want %d", e.ID, e.Expired, e.ExpiredAt, want)
				}
				if i > 0 && OlderGrant(got[i-1], e) >= 0 {
					t.Errorf("not oldest first: %s before %s", got[i-1].ID, e.ID)
				}
			}
		})
	}
}

// TestExpireGrantsHeld holds the expiry with credits held, and what the
// holds then charge and give back, to the examples of docs/operations.md:
// whatever order the holds end in, what expires in all is the expiring
// grant's part of what they held less what they charged, never more than
// they gave back.
func TestExpireGrantsHeld(t *testing.T) {
	t0 := time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC)
	due := t0.Add(time.Hour)
	w := billing.Whole
	a := CreditGrant{ID: "A", Credits: w(100), GrantedAt: t0, ExpiresAt: due}
	b := CreditGrant{ID: "B", Credits: w(50), GrantedAt: t0.Add(time.Minute)}
	for _, tc := range []struct {
		name                     string
		balance, held            int64
		grants                   []CreditGrant
		expired, deferred, slack int64
		holds                    [][2]int64 // each hold's credits and what it charged, in the order they end
		later                    int64      // what expires as they end
	}{
		{"one grant, all held, a job fails", 100, 100, []CreditGrant{a}, 0, 100, 0, [][2]int64{{100, 0}}, 100},
		{"one grant, a job completes with fewer units", 100, 30, []CreditGrant{a}, 70, 30, 0, [][2]int64{{30, 10}}, 20},
		{"one grant, held calls charge all", 100, 30, []CreditGrant{a}, 70, 30, 0, [][2]int64{{10, 10}, {20, 20}}, 0},
		{"B newer: 70 spent, 80 held", 80, 80, []CreditGrant{a, b}, 0, 30, 50, [][2]int64{{50, 0}, {30, 0}}, 30},
		{"B newer: the charge takes A's first", 80, 80, []CreditGrant{a, b}, 0, 30, 50, [][2]int64{{50, 50}, {30, 0}}, 0},
		{"B newer: the charge ends last", 80, 80, []CreditGrant{a, b}, 0, 30, 50, [][2]int64{{30, 0}, {50, 10}}, 20},
		{"B newer: part charged, part back", 80, 80, []CreditGrant{a, b}, 0, 30, 50, [][2]int64{{40, 25}, {40, 0}}, 5},
		{"nothing held", 100, 0, []CreditGrant{a}, 100, 0, 0, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, after, st := ExpireGrantsHeld(w(tc.balance), w(tc.held), tc.grants, due)
			var ga CreditGrant
			for _, g := range got {
				if g.ID == "A" {
					ga = g
				}
			}
			if slack := st.Slack(); ga.Expired != w(tc.expired) || ga.Deferred != w(tc.deferred) || slack != w(tc.slack) ||
				after != w(tc.balance-tc.expired) || st.Total() != w(tc.held) {
				t.Fatalf("ExpireGrantsHeld = A %+v, balance %s, stack %+v; want %d expired, %d deferred, slack %d, balance %d",
					ga, after, st, tc.expired, tc.deferred, tc.slack, tc.balance-tc.expired)
			}
			var later billing.Units
			for _, h := range tc.holds {
				st, _ = st.Charge(w(h[1]))
				r := w(h[0] - h[1])
				before := st
				var x billing.Units
				st, _, x = st.GiveBack(r)
				if x > r || x > before.Total()-before.Slack() {
					t.Fatalf("GiveBack(%+v, %s) = %s: more than given back or deferred", before, r, x)
				}
				later += x
			}
			if later != w(tc.later) {
				t.Errorf("expired as the holds ended: %s, want %d", later, tc.later)
			}
		})
	}
}

// TestExpireGrantsHeldOrder: what holds from before an expiry charge is
// taken oldest grant first, grants that do not expire included, and what
// they give back expires as far as it is of the grants due (the example
// of docs/operations.md): A 100 and B 100 due, C 50 without expiry older
// than B, all 250 held. The stack is A 100, C 50, B 100; a charge of 150
// spends A and C, B's 100 expire when the rest comes back.
func TestExpireGrantsHeldOrder(t *testing.T) {
	t0 := time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC)
	due := t0.Add(time.Hour)
	w := billing.Whole
	grants := []CreditGrant{
		{ID: "A", Credits: w(100), GrantedAt: t0, ExpiresAt: due},
		{ID: "C", Credits: w(50), GrantedAt: t0.Add(time.Minute)},
		{ID: "B", Credits: w(100), GrantedAt: t0.Add(2 * time.Minute), ExpiresAt: due},
	}
	got, after, st := ExpireGrantsHeld(w(250), w(250), grants, due)
	want := HeldStack{Layers: []HeldLayer{{ID: "A", Deferred: w(100)}, {ID: "B", Below: w(50), Deferred: w(100)}}}
	if len(got) != 2 || after != w(250) || !reflect.DeepEqual(st, want) {
		t.Fatalf("ExpireGrantsHeld = %+v, %s, %+v; want A and B deferred, stack %+v", got, after, st, want)
	}
	for _, tc := range []struct {
		name               string
		holds              [][2]int64 // each hold's credits and what it charged, in the order they end
		spentA, expA, expB int64
	}{
		{"charges 150", [][2]int64{{250, 150}}, 100, 0, 100},
		{"gives back first, then charges", [][2]int64{{100, 0}, {150, 150}}, 100, 0, 100},
		{"charges 50", [][2]int64{{250, 50}}, 50, 50, 100},
		{"gives back all", [][2]int64{{250, 0}}, 0, 100, 100},
		{"charges all", [][2]int64{{250, 250}}, 100, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := st
			var spentA, exp [2]billing.Units
			for _, h := range tc.holds {
				var took, x []billing.Units
				s, took = s.Charge(w(h[1]))
				s, x, _ = s.GiveBack(w(h[0] - h[1]))
				spentA[0] += took[0]
				exp[0], exp[1] = exp[0]+x[0], exp[1]+x[1]
			}
			if spentA[0] != w(tc.spentA) || exp[0] != w(tc.expA) || exp[1] != w(tc.expB) || s.Total() != 0 {
				t.Errorf("A spent %s, expired %s; B expired %s; left %+v; want %d, %d; %d; nothing",
					spentA[0], exp[0], exp[1], s, tc.spentA, tc.expA, tc.expB)
			}
		})
	}
}

// TestExpireGrantsSaturated: the free balance is found without wrapping
// at the int64 edges. A balance at the least a balance holds (reports
// past the limits saturate it) less a hold, or less what newer grants
// have left (their sum past what a quantity holds), wrapped to a huge
// free balance: the grant due expired all it had left, which the store
// then refused as out of range (ExpireCreditsSaturated of the contract
// suite).
func TestExpireGrantsSaturated(t *testing.T) {
	t0 := time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC)
	due := t0.Add(time.Hour)
	const minU, maxU = billing.Units(math.MinInt64), billing.Units(math.MaxInt64)
	a := CreditGrant{ID: "A", Credits: 100, GrantedAt: t0, ExpiresAt: due}
	b := CreditGrant{ID: "B", Credits: 50, GrantedAt: t0.Add(time.Minute)}
	huge := func(id string) CreditGrant {
		return CreditGrant{ID: id, Credits: maxU/2 + 1, GrantedAt: t0.Add(2 * time.Minute)}
	}
	pending := func(id string) CreditGrant {
		return CreditGrant{ID: id, Credits: 1, Deferred: 1, GrantedAt: t0.Add(-time.Hour), ExpiresAt: t0, ExpiredAt: t0}
	}
	for _, tc := range []struct {
		name                    string
		balance, held           billing.Units
		grants                  []CreditGrant
		expired, deferred, left billing.Units // A's expired and deferred, the balance after
	}{
		{"the floor", minU, 0, []CreditGrant{a}, 0, 0, minU},
		{"the floor, a newer grant", minU, 0, []CreditGrant{a, b}, 0, 0, minU},
		{"the floor, a hold of 2", minU, 2, []CreditGrant{a}, 0, 0, minU},
		{"the floor, a hold and a newer grant", minU, 2, []CreditGrant{a, b}, 0, 0, minU},
		{"the floor, the most held", minU, maxU, []CreditGrant{a, b}, 0, 0, minU},
		{"just above the floor, a hold", minU + 1, 1, []CreditGrant{a}, 0, 0, minU + 1},
		{"the floor, deferred expiries holding all that is held", minU, 2, []CreditGrant{a, pending("P"), pending("Q")}, 0, 0, minU},
		{"-1, newer grants past what a quantity holds", -1, 0, []CreditGrant{a, huge("C"), huge("D")}, 0, 0, -1},
		{"-1, held, newer grants past what a quantity holds", -1, 1, []CreditGrant{a, huge("C"), huge("D")}, 0, 0, -1},
		{"the most, nothing held", maxU, 0, []CreditGrant{a}, 100, 0, maxU - 100},
		{"the most, all held", maxU, maxU, []CreditGrant{a}, 0, 100, maxU},
		{"the most, newer grants past what a quantity holds", maxU, 0, []CreditGrant{a, huge("C"), huge("D")}, 0, 0, maxU},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.held == 0 {
				got, after := ExpireGrants(tc.balance, tc.grants, due)
				if len(got) != 1 || got[0].ID != "A" || got[0].Expired != tc.expired || after != tc.left {
					t.Errorf("ExpireGrants = %+v, balance %d; want A expiring %d, balance %d", got, after, tc.expired, tc.left)
				}
			}
			got, after, st := ExpireGrantsHeld(tc.balance, tc.held, tc.grants, due)
			var ga CreditGrant
			for _, g := range got {
				if g.ID == "A" {
					ga = g
				}
			}
			if ga.ID != "A" || ga.Expired != tc.expired || ga.Deferred != tc.deferred || after != tc.left {
				t.Errorf("ExpireGrantsHeld = A %+v, balance %d; want %d expired, %d deferred, balance %d",
					ga, after, tc.expired, tc.deferred, tc.left)
			}
			if tot := st.Total(); tc.held != 0 && tot != tc.held {
				t.Errorf("the stack holds %d, want %d (%+v)", tot, tc.held, st)
			}
		})
	}
}
