package payments

import (
	"testing"
	"time"
)

// TestMetersPeriodBoundaryIn: the renewals the shipper splits an hour at
// are Stripe's: the anchor's day of the month, or the month's last day
// when it has fewer (an anchor on the 31st renews on 30 November and 28
// February), weeks, years, the current period's ends as applied, and
// never the subscription's start or an hour without a renewal.
func TestMetersPeriodBoundaryIn(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	jan31 := at("2026-01-31T23:05:09Z")
	for _, c := range []struct {
		name string
		sub  SubscriptionRecord
		hour string
		want string // "" for none
	}{
		{"monthly, from the start", SubscriptionRecord{StartDate: jan31}, "2026-02-28T23:00:00Z", "2026-02-28T23:05:09Z"},
		{"monthly, a 30-day month", SubscriptionRecord{StartDate: jan31}, "2026-11-30T23:00:00Z", "2026-11-30T23:05:09Z"},
		{"monthly, back on the 31st", SubscriptionRecord{StartDate: jan31}, "2026-12-31T23:00:00Z", "2026-12-31T23:05:09Z"},
		{"monthly, not on the 30th of a 31-day month", SubscriptionRecord{StartDate: jan31}, "2026-12-30T23:00:00Z", ""},
		{"the hour before", SubscriptionRecord{StartDate: jan31}, "2026-02-28T22:00:00Z", ""},
		{"the start is no renewal", SubscriptionRecord{StartDate: jan31}, "2026-01-31T23:00:00Z", ""},
		{"before the start", SubscriptionRecord{StartDate: jan31}, "2025-12-31T23:00:00Z", ""},
		{"no subscription", SubscriptionRecord{}, "2026-02-28T23:00:00Z", ""},
		{"every 3 months", SubscriptionRecord{StartDate: jan31, Interval: "month", IntervalCount: 3}, "2026-04-30T23:00:00Z", "2026-04-30T23:05:09Z"},
		{"every 3 months, not the second", SubscriptionRecord{StartDate: jan31, Interval: "month", IntervalCount: 3}, "2026-03-31T23:00:00Z", ""},
		{"yearly", SubscriptionRecord{StartDate: at("2024-02-29T10:30:00Z"), Interval: "year", IntervalCount: 1}, "2025-02-28T10:00:00Z", "2025-02-28T10:30:00Z"},
		{"weekly", SubscriptionRecord{StartDate: jan31, Interval: "week", IntervalCount: 1}, "2026-02-14T23:00:00Z", "2026-02-14T23:05:09Z"},
		{"weekly, not a day after", SubscriptionRecord{StartDate: jan31, Interval: "week", IntervalCount: 1}, "2026-02-15T23:00:00Z", ""},
		{"a trial: the anchor", SubscriptionRecord{StartDate: jan31, BillingCycleAnchor: at("2026-02-14T08:00:30Z"), Interval: "month", IntervalCount: 1},
			"2026-03-14T08:00:00Z", "2026-03-14T08:00:30Z"},
		{"the current period's end as applied", SubscriptionRecord{StartDate: jan31, Interval: "month", IntervalCount: 1,
			CurrentPeriodEnd: at("2026-06-03T04:05:06Z")}, "2026-06-03T04:00:00Z", "2026-06-03T04:05:06Z"},
	} {
		got, ok := periodBoundaryIn(c.sub, at(c.hour))
		if c.want == "" {
			if ok {
				t.Errorf("%s: a renewal at %s in the hour %s, want none", c.name, got, c.hour)
			}
			continue
		}
		if !ok || !got.Equal(at(c.want)) {
			t.Errorf("%s: renewal %s (%v) in the hour %s, want %s", c.name, got, ok, c.hour, c.want)
		}
	}
}
