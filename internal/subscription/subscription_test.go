package subscription

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

func TestGrantsAccess(t *testing.T) {
	for _, tc := range []struct {
		status string
		valid  bool
		grants bool
	}{
		{"ACTIVE", true, true},
		{"TRIAL", true, true},
		{"CANCELLING", true, true},
		{"CANCELLING_PENDING", true, true},
		{"EXPIRED", true, false},
		{"CANCELLED", true, false},
		{"SUSPENDED", true, false},
		{"active", true, true}, // any letter case
		{"Trial", true, true},
		{"suspended", true, false},
		{"", false, false},
		{"PENDING", false, false},
		{" ACTIVE", false, false}, // not trimmed: the store holds exact values
		{"ACTIVE_", false, false},
	} {
		if got := GrantsAccess(tc.status); got != tc.grants {
			t.Errorf("GrantsAccess(%q) = %v, want %v", tc.status, got, tc.grants)
		}
		st, ok := ParseStatus(tc.status)
		if ok != tc.valid {
			t.Errorf("ParseStatus(%q) valid = %v, want %v", tc.status, ok, tc.valid)
		}
		if ok && st.GrantsAccess() != tc.grants {
			t.Errorf("%s.GrantsAccess() = %v, want %v", st, st.GrantsAccess(), tc.grants)
		}
	}
}

func TestStatuses(t *testing.T) {
	want := []string{"ACTIVE", "TRIAL", "CANCELLING", "CANCELLING_PENDING", "EXPIRED", "CANCELLED", "SUSPENDED"}
	if got := StatusNames(); !slices.Equal(got, want) {
		t.Errorf("StatusNames() = %v, want %v", got, want)
	}
	all := Statuses()
	all[0] = "MUTATED"
	if Statuses()[0] != Active {
		t.Error("Statuses returns the package's own slice")
	}
	// The statuses that grant access come first: operators read the list
	// in that order.
	for i, s := range Statuses() {
		if s.GrantsAccess() != (i < 4) {
			t.Errorf("status %d %s: grants access %v", i, s, s.GrantsAccess())
		}
	}
}

func testService(t *testing.T) *catalog.Service {
	t.Helper()
	svc := &catalog.Service{
		ID:        "svc",
		Backend:   "http://127.0.0.1:1",
		Secrets:   []string{"0123456789abcdef0123"},
		Owners:    []string{"u-owner"},
		Endpoints: []*catalog.Endpoint{{ID: "echo"}},
		Products: []*billing.Product{{ID: "basic", BillingModel: billing.Subscription,
			MeasurementType: billing.PerRequest}},
	}
	c, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Service("svc")
	return s
}

func TestResolve(t *testing.T) {
	svc := testService(t)
	basic, _ := svc.Product("basic")
	lookupFailed := errors.New("disk on fire")
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	end := now.Add(time.Hour)
	subs := map[string]store.Subscription{
		"u-trial-ends": {UserID: "u-trial-ends", ServiceID: "svc", ProductID: "basic", Status: "TRIAL",
			EndsAt: end, EndStatus: "EXPIRED"},
		"u-cancelling": {UserID: "u-cancelling", ServiceID: "svc", ProductID: "basic", Status: "CANCELLING",
			EndsAt: end, EndStatus: "CANCELLED"},
		// An end decides even over a status that grants access.
		"u-active-ends": {UserID: "u-active-ends", ServiceID: "svc", ProductID: "basic", Status: "ACTIVE",
			EndsAt: end, EndStatus: "cancelled"},
		"u-active":   {UserID: "u-active", ServiceID: "svc", ProductID: "basic", Status: "ACTIVE"},
		"u-trial":    {UserID: "u-trial", ServiceID: "svc", ProductID: "basic", Status: "trial"},
		"u-pending":  {UserID: "u-pending", ServiceID: "svc", ProductID: "basic", Status: "CANCELLING_PENDING"},
		"u-expired":  {UserID: "u-expired", ServiceID: "svc", ProductID: "basic", Status: "EXPIRED"},
		"u-suspend":  {UserID: "u-suspend", ServiceID: "svc", ProductID: "basic", Status: "suspended"},
		"u-gone":     {UserID: "u-gone", ServiceID: "svc", ProductID: "retired", Status: "ACTIVE"},
		"u-gone-off": {UserID: "u-gone-off", ServiceID: "svc", ProductID: "retired", Status: "CANCELLED"},
	}
	lookup := func(_ context.Context, userID, serviceID string) (store.Subscription, error) {
		if serviceID != "svc" {
			t.Errorf("looked up service %q", serviceID)
		}
		switch userID {
		case "u-broken":
			return store.Subscription{}, lookupFailed
		case "u-notfound":
			return store.Subscription{}, store.ErrNotFound
		}
		s, ok := subs[userID]
		if !ok {
			return store.Subscription{}, store.ErrNoAccount
		}
		return s, nil
	}
	for _, tc := range []struct {
		user      string
		at        time.Time // now when zero
		recorded  bool      // ResolveRecorded: the status is not checked
		reason    Reason
		message   string
		product   string // "" for an owner
		status    Status
		lookupErr bool
	}{
		{user: "u-owner", status: Active},
		{user: "u-owner", recorded: true, status: Active},
		{user: "u-active", product: "basic", status: Active},
		{user: "u-trial", product: "basic", status: Trial},
		{user: "u-pending", product: "basic", status: CancellingPending},
		{user: "u-nobody", reason: NoSubscription, message: "no subscription to service svc"},
		{user: "u-notfound", reason: NoSubscription, message: "no subscription to service svc"},
		{user: "u-nobody", recorded: true, reason: NoSubscription, message: "no subscription to service svc"},
		{user: "u-expired", reason: Inactive, message: "the subscription is EXPIRED"},
		{user: "u-suspend", reason: Inactive, message: "the subscription is SUSPENDED"},
		{user: "u-expired", recorded: true, product: "basic", status: Expired},
		{user: "u-gone", reason: ProductGone, message: `the subscription's product "retired" is no longer offered`},
		{user: "u-gone", recorded: true, reason: ProductGone, message: `the subscription's product "retired" is no longer offered`},
		// The status is judged before the product.
		{user: "u-gone-off", reason: Inactive, message: "the subscription is CANCELLED"},
		// A subscription with an end grants access up to it, none from it.
		{user: "u-trial-ends", at: end.Add(-time.Nanosecond), product: "basic", status: Trial},
		{user: "u-trial-ends", at: end, reason: Inactive, message: "the subscription is EXPIRED"},
		{user: "u-cancelling", at: end.Add(-time.Nanosecond), product: "basic", status: Cancelling},
		{user: "u-cancelling", at: end, reason: Inactive, message: "the subscription is CANCELLED"},
		{user: "u-cancelling", at: end.Add(time.Hour), reason: Inactive, message: "the subscription is CANCELLED"},
		{user: "u-active-ends", at: end, reason: Inactive, message: "the subscription is CANCELLED"},
		// Usage is recorded whenever it happened, and the backend is told
		// the status at that time.
		{user: "u-cancelling", at: end.Add(-time.Second), recorded: true, product: "basic", status: Cancelling},
		{user: "u-cancelling", at: end, recorded: true, product: "basic", status: Cancelled},
		{user: "u-broken", lookupErr: true},
		{user: "u-broken", recorded: true, lookupErr: true},
	} {
		resolve := Resolve
		if tc.recorded {
			resolve = ResolveRecorded
		}
		at := tc.at
		if at.IsZero() {
			at = now
		}
		a, err := resolve(context.Background(), svc, tc.user, at, lookup)
		name := tc.user
		if !tc.at.IsZero() {
			name += " at " + tc.at.Sub(end).String() + " from the end"
		}
		if tc.recorded {
			name += " (recorded)"
		}
		var refusal *Error
		switch {
		case tc.lookupErr:
			if !errors.Is(err, lookupFailed) || errors.As(err, &refusal) {
				t.Errorf("%s: err %v, want the lookup's error, not a refusal", name, err)
			}
		case tc.reason != 0:
			if !errors.As(err, &refusal) || refusal.Reason != tc.reason || err.Error() != tc.message {
				t.Errorf("%s: err %v, want reason %d %q", name, err, tc.reason, tc.message)
			}
		case err != nil:
			t.Errorf("%s: %v", name, err)
		case tc.product == "":
			if !a.Owner() || !a.Account.Free || a.Account.UserID != tc.user || a.Account.ServiceID != "svc" || a.Status() != tc.status {
				t.Errorf("%s: owner access %+v", name, a)
			}
		default:
			// A trial is served on its free terms (TrialTerms), any
			// other status on the product's own.
			want := *basic
			if tc.status == Trial {
				want = TrialTerms(want)
			}
			if a.Owner() || a.Account.Free || a.Product == nil || *a.Product != want || a.Account.Product != want || a.Account.Product.ID != tc.product ||
				a.Account.UserID != tc.user || a.Account.ServiceID != "svc" || a.Status() != tc.status ||
				a.Subscription.UserID != tc.user {
				t.Errorf("%s: access %+v", name, a)
			}
		}
	}
}

func TestEffectiveStatus(t *testing.T) {
	end := time.Date(2026, 12, 26, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		sub  store.Subscription
		at   time.Time
		want Status
	}{
		{store.Subscription{Status: "active"}, end, Active},
		{store.Subscription{Status: "TRIAL", EndsAt: end, EndStatus: "EXPIRED"}, end.Add(-time.Nanosecond), Trial},
		{store.Subscription{Status: "TRIAL", EndsAt: end, EndStatus: "EXPIRED"}, end, Expired},
		{store.Subscription{Status: "CANCELLING", EndsAt: end, EndStatus: "cancelled"}, end.Add(time.Hour), Cancelled},
	} {
		if got := EffectiveStatus(tc.sub, tc.at); got != tc.want {
			t.Errorf("EffectiveStatus(%+v, %s) = %s, want %s", tc.sub, tc.at, got, tc.want)
		}
	}
	for s, want := range map[string]bool{"CANCELLED": true, "expired": true, "SUSPENDED": true, "ACTIVE": false, "TRIAL": false, "": false} {
		if EndStatusValid(s) != want {
			t.Errorf("EndStatusValid(%q) = %t", s, !want)
		}
	}
}

// TestTrialTerms: a trial is free whatever the billing model (no unit
// costs money or credits) and its quota is a hard allowance; the quota,
// its period and the rate limit stay the plan's.
func TestTrialTerms(t *testing.T) {
	q, c := billing.Whole(10), billing.Whole(5)
	rl := &billing.RateLimit{Requests: 3}
	for _, p := range []billing.Product{
		{ID: "sub", BillingModel: billing.Subscription, Quota: &q, Overage: "allow", Price: 10000, SpendingCap: &c, RateLimit: rl, Period: "week"},
		{ID: "payg", BillingModel: billing.UsagePostpaid, Price: 2000, SpendingCap: &c},
		{ID: "prepaid", BillingModel: billing.Prepaid, Price: billing.Whole(1)},
	} {
		got := TrialTerms(p)
		if got.Price != 0 || got.SpendingCap != nil || got.RateLimit != p.RateLimit || got.Quota != p.Quota || got.Period != p.Period {
			t.Errorf("%s: trial terms %+v", p.ID, got)
		}
		if p.Quota != nil && got.OverageAllowed() {
			t.Errorf("%s: a trial's overage is allowed", p.ID)
		}
		d := billing.Decide(got, billing.State{Used: q}, billing.Whole(1))
		if p.Quota != nil && (d.Allowed || d.Code != billing.CodeQuotaExceeded) || p.Quota == nil && (!d.Allowed || d.Cost != 0) {
			t.Errorf("%s: a trial call after 10 units: %+v", p.ID, d)
		}
	}
}

// TestQuotaRetry: a quota refusal's retry instant is the period's end,
// never earlier (docs/wire-contract.md); a subscription that ends at or
// before it is named in the message.
func TestQuotaRetry(t *testing.T) {
	started := time.Date(2026, 3, 17, 9, 0, 0, 0, time.UTC)
	now := time.Date(2026, 4, 1, 12, 0, 0, 0, time.UTC)
	periodEnd := time.Date(2026, 4, 17, 9, 0, 0, 0, time.UTC)
	p := billing.Product{ID: "p", Period: "month"}
	const reset = "used up; the period resets at 2026-04-17T09:00:00Z"
	for _, tc := range []struct {
		name    string
		endsAt  time.Time
		message string
	}{
		{"no end", time.Time{}, reset},
		{"ends after the period", periodEnd.Add(time.Second), reset},
		{"ends with the period", periodEnd, reset + "; the subscription ends before then, at 2026-04-17T09:00:00Z"},
		{"ends first", now.Add(90 * time.Minute), reset + "; the subscription ends before then, at 2026-04-01T13:30:00Z"},
	} {
		msg, at := QuotaRetry("used up", p, started, tc.endsAt, now)
		if !at.Equal(periodEnd) || msg != tc.message {
			t.Errorf("%s: %q %v, want %q %v", tc.name, msg, at, tc.message, periodEnd)
		}
	}
}
