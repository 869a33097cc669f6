package store

import (
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
