package billing_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

func utc(y int, m time.Month, d, h, min int) time.Time {
	return time.Date(y, m, d, h, min, 0, 0, time.UTC)
}

func TestPeriodBounds(t *testing.T) {
	tokyo := time.FixedZone("JST", 9*3600)
	tests := []struct {
		name       string
		period     string
		calendar   bool
		anchor     time.Time
		now        time.Time
		start, end time.Time
	}{
		// Anchored months renew on the day the subscription started.
		{"month anchored on the 17th", "month", false, utc(2024, 1, 17, 9, 30), utc(2024, 3, 20, 0, 0),
			utc(2024, 3, 17, 9, 30), utc(2024, 4, 17, 9, 30)},
		{"month anchored, just before renewal", "month", false, utc(2024, 1, 17, 9, 30), utc(2024, 3, 17, 9, 29),
			utc(2024, 2, 17, 9, 30), utc(2024, 3, 17, 9, 30)},
		{"month is the default period", "", false, utc(2024, 1, 17, 0, 0), utc(2024, 3, 20, 0, 0),
			utc(2024, 3, 17, 0, 0), utc(2024, 4, 17, 0, 0)},
		{"period names are case-insensitive", "Month", false, utc(2024, 1, 17, 0, 0), utc(2024, 3, 20, 0, 0),
			utc(2024, 3, 17, 0, 0), utc(2024, 4, 17, 0, 0)},
		{"month across a year end", "month", false, utc(2023, 11, 20, 0, 0), utc(2024, 1, 5, 0, 0),
			utc(2023, 12, 20, 0, 0), utc(2024, 1, 20, 0, 0)},
		{"month in the first period", "month", false, utc(2024, 1, 17, 0, 0), utc(2024, 1, 17, 0, 0),
			utc(2024, 1, 17, 0, 0), utc(2024, 2, 17, 0, 0)},

		// The 31st is clamped to the last day of shorter months and comes
		// back in longer ones.
		{"31st in leap February", "month", false, utc(2024, 1, 31, 0, 0), utc(2024, 2, 29, 12, 0),
			utc(2024, 2, 29, 0, 0), utc(2024, 3, 31, 0, 0)},
		{"31st in leap February, before renewal", "month", false, utc(2024, 1, 31, 0, 0), utc(2024, 2, 28, 23, 59),
			utc(2024, 1, 31, 0, 0), utc(2024, 2, 29, 0, 0)},
		{"31st in non-leap February", "month", false, utc(2023, 1, 31, 0, 0), utc(2023, 2, 28, 0, 0),
			utc(2023, 2, 28, 0, 0), utc(2023, 3, 31, 0, 0)},
		{"31st back in March", "month", false, utc(2023, 1, 31, 0, 0), utc(2023, 3, 30, 0, 0),
			utc(2023, 2, 28, 0, 0), utc(2023, 3, 31, 0, 0)},
		{"31st in April", "month", false, utc(2023, 1, 31, 0, 0), utc(2023, 4, 30, 8, 0),
			utc(2023, 4, 30, 0, 0), utc(2023, 5, 31, 0, 0)},
		{"30th in February", "month", false, utc(2023, 1, 30, 0, 0), utc(2023, 3, 1, 0, 0),
			utc(2023, 2, 28, 0, 0), utc(2023, 3, 30, 0, 0)},

		// Fixed-length periods step from the anchor.
		{"day anchored", "day", false, utc(2024, 3, 10, 15, 0), utc(2024, 3, 12, 14, 59),
			utc(2024, 3, 11, 15, 0), utc(2024, 3, 12, 15, 0)},
		{"week anchored", "week", false, utc(2024, 3, 6, 8, 0), utc(2024, 3, 19, 0, 0),
			utc(2024, 3, 13, 8, 0), utc(2024, 3, 20, 8, 0)},
		{"year anchored", "year", false, utc(2023, 6, 15, 0, 0), utc(2025, 1, 1, 0, 0),
			utc(2024, 6, 15, 0, 0), utc(2025, 6, 15, 0, 0)},
		{"year anchored on Feb 29, non-leap year", "year", false, utc(2024, 2, 29, 10, 0), utc(2025, 3, 1, 0, 0),
			utc(2025, 2, 28, 10, 0), utc(2026, 2, 28, 10, 0)},
		{"year anchored on Feb 29, before renewal", "year", false, utc(2024, 2, 29, 10, 0), utc(2025, 2, 28, 9, 59),
			utc(2024, 2, 29, 10, 0), utc(2025, 2, 28, 10, 0)},
		{"year anchored on Feb 29, next leap year", "year", false, utc(2024, 2, 29, 10, 0), utc(2028, 3, 1, 0, 0),
			utc(2028, 2, 29, 10, 0), utc(2029, 2, 28, 10, 0)},

		// Calendar alignment ignores the anchor.
		{"calendar month", "month", true, utc(2024, 1, 17, 9, 30), utc(2024, 3, 20, 0, 0),
			utc(2024, 3, 1, 0, 0), utc(2024, 4, 1, 0, 0)},
		{"calendar month in leap February", "month", true, utc(2024, 1, 31, 0, 0), utc(2024, 2, 29, 23, 59),
			utc(2024, 2, 1, 0, 0), utc(2024, 3, 1, 0, 0)},
		{"calendar December", "month", true, utc(2024, 1, 17, 0, 0), utc(2024, 12, 31, 23, 59),
			utc(2024, 12, 1, 0, 0), utc(2025, 1, 1, 0, 0)},
		{"calendar day", "day", true, utc(2024, 1, 17, 9, 30), utc(2024, 3, 20, 13, 0),
			utc(2024, 3, 20, 0, 0), utc(2024, 3, 21, 0, 0)},
		{"ISO week from a Sunday", "week", true, utc(2024, 1, 17, 0, 0), utc(2024, 3, 24, 23, 0), // Sunday
			utc(2024, 3, 18, 0, 0), utc(2024, 3, 25, 0, 0)},
		{"ISO week from a Wednesday", "week", true, utc(2024, 1, 17, 0, 0), utc(2024, 3, 20, 12, 0),
			utc(2024, 3, 18, 0, 0), utc(2024, 3, 25, 0, 0)},
		{"ISO week across a year end", "week", true, time.Time{}, utc(2025, 1, 1, 0, 0), // Wednesday
			utc(2024, 12, 30, 0, 0), utc(2025, 1, 6, 0, 0)},
		{"calendar year", "year", true, utc(2023, 6, 15, 0, 0), utc(2024, 6, 1, 0, 0),
			utc(2024, 1, 1, 0, 0), utc(2025, 1, 1, 0, 0)},
		{"zero anchor means calendar", "month", false, time.Time{}, utc(2024, 3, 20, 0, 0),
			utc(2024, 3, 1, 0, 0), utc(2024, 4, 1, 0, 0)},
		{"calendar periods are UTC", "day", true, time.Time{}, time.Date(2024, 3, 20, 3, 0, 0, 0, tokyo), // 19th 18:00 UTC
			utc(2024, 3, 19, 0, 0), utc(2024, 3, 20, 0, 0)},
		{"anchor in another zone", "month", false, time.Date(2024, 1, 17, 3, 0, 0, 0, tokyo), utc(2024, 3, 16, 19, 0),
			utc(2024, 3, 16, 18, 0), utc(2024, 4, 16, 18, 0)},

		// Start is inclusive, end exclusive.
		{"month, now at the start", "month", false, utc(2024, 1, 17, 9, 30), utc(2024, 3, 17, 9, 30),
			utc(2024, 3, 17, 9, 30), utc(2024, 4, 17, 9, 30)},
		{"day, now at the start", "day", false, utc(2024, 3, 10, 15, 0), utc(2024, 3, 12, 15, 0),
			utc(2024, 3, 12, 15, 0), utc(2024, 3, 13, 15, 0)},
		{"week, now at the start", "week", false, utc(2024, 3, 6, 8, 0), utc(2024, 3, 20, 8, 0),
			utc(2024, 3, 20, 8, 0), utc(2024, 3, 27, 8, 0)},
		{"year, now at the start", "year", false, utc(2023, 6, 15, 0, 0), utc(2024, 6, 15, 0, 0),
			utc(2024, 6, 15, 0, 0), utc(2025, 6, 15, 0, 0)},
		{"calendar month, now at the start", "month", true, time.Time{}, utc(2024, 4, 1, 0, 0),
			utc(2024, 4, 1, 0, 0), utc(2024, 5, 1, 0, 0)},
		{"calendar week, now at Monday midnight", "week", true, time.Time{}, utc(2024, 3, 25, 0, 0),
			utc(2024, 3, 25, 0, 0), utc(2024, 4, 1, 0, 0)},

		// An anchor after now (clock skew, a start set ahead) still yields
		// the period of its grid that contains now.
		{"month, anchor in the future", "month", false, utc(2024, 6, 17, 0, 0), utc(2024, 3, 5, 0, 0),
			utc(2024, 2, 17, 0, 0), utc(2024, 3, 17, 0, 0)},
		{"month, anchor on the 31st in the future", "month", false, utc(2024, 5, 31, 0, 0), utc(2024, 3, 15, 0, 0),
			utc(2024, 2, 29, 0, 0), utc(2024, 3, 31, 0, 0)},
		{"day, anchor in the future", "day", false, utc(2024, 3, 10, 12, 0), utc(2024, 3, 8, 11, 0),
			utc(2024, 3, 7, 12, 0), utc(2024, 3, 8, 12, 0)},
		{"day, anchor in the future, on the grid", "day", false, utc(2024, 3, 10, 12, 0), utc(2024, 3, 8, 12, 0),
			utc(2024, 3, 8, 12, 0), utc(2024, 3, 9, 12, 0)},
		{"year, anchor in the future", "year", false, utc(2026, 6, 15, 0, 0), utc(2024, 7, 1, 0, 0),
			utc(2024, 6, 15, 0, 0), utc(2025, 6, 15, 0, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start, end := billing.PeriodBounds(tt.period, tt.calendar, tt.anchor, tt.now)
			if !start.Equal(tt.start) || !end.Equal(tt.end) {
				t.Errorf("PeriodBounds(%q, %v, %s, %s) = [%s, %s), want [%s, %s)",
					tt.period, tt.calendar, tt.anchor, tt.now, start, end, tt.start, tt.end)
			}
			if start.Location() != time.UTC || end.Location() != time.UTC {
				t.Errorf("bounds not in UTC: %s, %s", start, end)
			}
		})
	}
}

// TestPeriodBoundsTile checks on many random anchors and instants that the
// period contains now and that periods tile time: the period starting at
// end is the next one, with no gap and no overlap.
func TestPeriodBoundsTile(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	base := utc(2020, 1, 1, 0, 0)
	for _, period := range []string{"day", "week", "month", "year"} {
		for _, calendar := range []bool{false, true} {
			for i := 0; i < 2000; i++ {
				anchor := base.Add(time.Duration(r.Int64N(int64(6 * 365 * 24 * time.Hour))))
				if i%5 == 0 { // often on a 29th to 31st, where clamping happens
					anchor = time.Date(2020+r.IntN(6), time.Month(1+r.IntN(12)), 29+r.IntN(3), r.IntN(24), 0, 0, 0, time.UTC)
				}
				now := base.Add(time.Duration(r.Int64N(int64(8 * 365 * 24 * time.Hour))))
				start, end := billing.PeriodBounds(period, calendar, anchor, now)
				if now.Before(start) || !now.Before(end) {
					t.Fatalf("%s calendar=%v anchor %s now %s: [%s, %s) does not contain now", period, calendar, anchor, now, start, end)
				}
				nextStart, _ := billing.PeriodBounds(period, calendar, anchor, end)
				if !nextStart.Equal(end) {
					t.Fatalf("%s calendar=%v anchor %s: period after [%s, %s) starts at %s", period, calendar, anchor, start, end, nextStart)
				}
				prevStart, prevEnd := billing.PeriodBounds(period, calendar, anchor, start.Add(-time.Nanosecond))
				if !prevEnd.Equal(start) || !prevStart.Before(start) {
					t.Fatalf("%s calendar=%v anchor %s: period before [%s, %s) is [%s, %s)", period, calendar, anchor, start, end, prevStart, prevEnd)
				}
			}
		}
	}
}
