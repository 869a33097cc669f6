package billing

import (
	"strings"
	"time"
)

// PeriodBounds returns the billing period [start, end) that contains now for
// a subscription that started at anchor. Periods are anchored to the start
// (a subscription started on the 17th renews on the 17th; one started on the
// 31st renews on the last day of shorter months) unless calendar is set, in
// which case they align to calendar boundaries in UTC. Weeks are seven days
// from the anchor, or ISO weeks (Monday) with calendar.
func PeriodBounds(period string, calendar bool, anchor, now time.Time) (start, end time.Time) {
	now = now.UTC()
	anchor = anchor.UTC()
	if calendar || anchor.IsZero() {
		anchor = calendarAnchor(period, now)
	}
	switch strings.ToLower(period) {
	case "day":
		return stepFixed(anchor, now, 24*time.Hour)
	case "week":
		return stepFixed(anchor, now, 7*24*time.Hour)
	case "year":
		n := now.Year() - anchor.Year()
		start = addMonths(anchor, 12*n)
		if start.After(now) {
			n--
			start = addMonths(anchor, 12*n)
		}
		return start, addMonths(anchor, 12*(n+1))
	default:
		n := (now.Year()-anchor.Year())*12 + int(now.Month()) - int(anchor.Month())
		start = addMonths(anchor, n)
		if start.After(now) {
			n--
			start = addMonths(anchor, n)
		}
		return start, addMonths(anchor, n+1)
	}
}

func calendarAnchor(period string, now time.Time) time.Time {
	switch strings.ToLower(period) {
	case "day":
		return time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	case "week":
		d := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
		return d.AddDate(0, 0, -((int(d.Weekday()) + 6) % 7))
	case "year":
		return time.Date(now.Year(), 1, 1, 0, 0, 0, 0, time.UTC)
	default:
		return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
}

func stepFixed(anchor, now time.Time, step time.Duration) (time.Time, time.Time) {
	n := now.Sub(anchor) / step
	if now.Before(anchor) {
		n = -((anchor.Sub(now) + step - 1) / step)
	}
	start := anchor.Add(n * step)
	return start, start.Add(step)
}

// addMonths adds n months to t keeping its day of month, clamped to the last
// day of the target month (Jan 31 + 1 month = Feb 28 or 29).
func addMonths(t time.Time, n int) time.Time {
	y, m, d := t.Date()
	total := int(m) - 1 + n
	y += total / 12
	mm := total % 12
	if mm < 0 {
		mm += 12
		y--
	}
	last := time.Date(y, time.Month(mm+2), 0, 0, 0, 0, 0, time.UTC).Day()
	if d > last {
		d = last
	}
	return time.Date(y, time.Month(mm+1), d, t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}

// CeilSeconds is d in whole seconds, rounded up; 0 for none or less. The
// one rounding of a duration to seconds: PER_TIME_UNIT calls are charged
// by it, and every Retry-After and RateLimit reset a caller is shown is
// counted with it (apierror.RetrySeconds adds "at least one").
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
