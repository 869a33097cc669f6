package portal

import (
	"reflect"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestExpiringOf: what of the balance each expiring grant removes at its
// time if nothing more is spent, by the store's rule (credits are spent
// oldest grant first), one expiry after another.
func TestExpiringOf(t *testing.T) {
	t0 := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	t1, t2 := t0.AddDate(0, 1, 0), t0.AddDate(0, 2, 0)
	w := billing.Whole
	grants := []store.CreditGrant{
		{ID: "a", Credits: w(100), GrantedAt: t0, ExpiresAt: t1},
		{ID: "b", Credits: w(50), GrantedAt: t0.Add(time.Hour), ExpiresAt: t2},
		{ID: "c", Credits: w(30), GrantedAt: t0.Add(2 * time.Hour)},
		{ID: "old", Credits: w(10), GrantedAt: t0.Add(-time.Hour), ExpiresAt: t0, ExpiredAt: t0, Expired: w(10)},
	}
	// 30 spent: a has 70 left, b all of its 50.
	got := expiringOf(w(150), grants)
	want := []expiringCredits{{w(70), t1}, {w(50), t2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("expiringOf(150) = %+v, want %+v", got, want)
	}
	// 130 spent: the 50 left are c's 30 and 20 of b, so a expires
	// nothing and b 20.
	if got := expiringOf(w(50), grants); !reflect.DeepEqual(got, []expiringCredits{{w(20), t2}}) {
		t.Errorf("expiringOf(50) = %+v", got)
	}
	// Below zero nothing expires.
	if got := expiringOf(-w(5), grants); len(got) != 0 {
		t.Errorf("expiringOf(-5) = %+v", got)
	}
}
