package engine

import (
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

// TestClaimsHoldFollowsCalls: a call holds the endpoint's cost until the
// caller's calls there are charged more; then what they were charged
// for, rising to a larger call at once and falling an eighth of the way
// to a smaller one, never below the cost. Another caller, service or
// endpoint is not affected.
func TestClaimsHoldFollowsCalls(t *testing.T) {
	c := NewClaims()
	cost := billing.Whole(2)
	steps := []struct {
		claim, want billing.Units
	}{
		{0, billing.Whole(2)},
		{billing.Whole(1), billing.Whole(2)},   // below the cost: the cost
		{billing.Whole(10), billing.Whole(10)}, // a larger call: at once
		{billing.Whole(2), billing.Whole(9)},   // 10 - (10-2)/8
		{billing.Whole(2), 8_125_000},          // 9 - 7/8
		{billing.Whole(40), billing.Whole(40)},
	}
	for i, s := range steps {
		if s.claim > 0 {
			c.Note("u", "svc", "ep", cost, s.claim)
		}
		if got := c.Hold("u", "svc", "ep", cost); got != s.want {
			t.Errorf("step %d: after a claim of %s the hold is %s, want %s", i, s.claim, got, s.want)
		}
	}
	for _, other := range [][3]string{{"v", "svc", "ep"}, {"u", "svc2", "ep"}, {"u", "svc", "ep2"}} {
		if got := c.Hold(other[0], other[1], other[2], cost); got != cost {
			t.Errorf("%v holds %s: another caller's claims leaked", other, got)
		}
	}
	for range 200 {
		c.Note("u", "svc", "ep", cost, billing.Whole(1))
	}
	if got := c.Hold("u", "svc", "ep", cost); got != cost {
		t.Errorf("after many small calls the hold is %s, want the cost %s", got, cost)
	}
	// Calls within the cost keep no entry; a nil table holds the cost.
	c.Note("w", "svc", "ep", cost, cost)
	if len(c.m) != 1 {
		t.Errorf("%d entries, want only the caller whose calls passed the cost", len(c.m))
	}
	var none *Claims
	none.Note("u", "svc", "ep", cost, billing.Whole(9))
	if none.Hold("u", "svc", "ep", cost) != cost {
		t.Error("a nil table holds more than the cost")
	}
}

// TestClaimsBounded: the table never grows past maxClaims; when full it
// starts again.
func TestClaimsBounded(t *testing.T) {
	defer func(n int) { maxClaims = n }(maxClaims)
	maxClaims = 3
	c := NewClaims()
	for _, u := range []string{"a", "b", "c", "d"} {
		c.Note(u, "s", "e", 1, 5)
	}
	if len(c.m) != 1 || c.Hold("d", "s", "e", 1) != 5 || c.Hold("a", "s", "e", 1) != 1 {
		t.Errorf("after a fourth caller on a table of 3: %d entries", len(c.m))
	}
}
