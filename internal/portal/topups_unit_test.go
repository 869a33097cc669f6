package portal

import (
	"reflect"
	"strings"
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

// TestPlansShowHeldExpiring: credits a grant's expiry left to calls still
// running (Deferred) are shown in words on the plans page, before the
// expiries to come; none, no sentence.
func TestPlansShowHeldExpiring(t *testing.T) {
	t0 := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	w := billing.Whole
	grants := []store.CreditGrant{
		{ID: "a", Credits: w(100), GrantedAt: t0, ExpiresAt: t0.AddDate(0, 1, 0), ExpiredAt: t0.AddDate(0, 1, 0), Expired: w(80), Deferred: w(12)},
		{ID: "b", Credits: w(50), GrantedAt: t0.Add(time.Hour), ExpiresAt: t0.AddDate(0, 2, 0)},
	}
	if got := heldExpiringOf(grants); got != w(12) {
		t.Errorf("heldExpiringOf = %s, want 12", got)
	}
	pages, err := parsePages()
	if err != nil {
		t.Fatal(err)
	}
	render := func(v *creditsView) string {
		t.Helper()
		var b strings.Builder
		if err := pages.ExecuteTemplate(&b, "plans", page{Title: "Plans", Plans: &plansView{ServiceID: "echo", Credits: v}}); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	// Balance 62: 12 held at a's expiry, b's 50.
	v := &creditsView{ProductID: "credits", Balance: w(62), Expiring: expiringOf(w(62), grants), HeldExpiring: heldExpiringOf(grants)}
	html := render(v)
	held := `<p class="expiry" id="held-expiry">12 credits expire when the calls holding them finish, less what those calls use.</p>`
	later := `<p class="expiry">50 credits expire on 1 Mar 2027.</p>`
	if i, j := strings.Index(html, held), strings.Index(html, later); i < 0 || j < i {
		t.Errorf("plans page: held sentence at %d, b's expiry at %d; want both, held first:\n%s", i, j, html)
	}
	v.HeldExpiring = 0
	if html := render(v); strings.Contains(html, "held-expiry") {
		t.Errorf("plans page with nothing held at an expiry says it:\n%s", html)
	}
}
