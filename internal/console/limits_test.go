package console

import (
	"math"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// A limit's level and words: amber from 80%, red at and past 100% with
// when calls are allowed again, to the minute (a period ends at the
// time of day the subscription started; or that they are billed as overage),
// never a full green bar.
func TestLimits(t *testing.T) {
	u := billing.Whole
	q := func(n int64) *billing.Units { x := u(n); return &x }
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		ps      ops.PeriodSummary
		overage bool
		want    []limit
	}{
		{"under", ops.PeriodSummary{UnitsUsed: u(79), Quota: q(100), UnitLabel: "request", PeriodEnd: end}, false,
			[]limit{{What: "quota", Used: u(79), Max: u(100), Unit: "request", Percent: 79, Fill: 79, Level: levelOK}}},
		{"amber at 80%", ops.PeriodSummary{UnitsUsed: u(80), Quota: q(100), PeriodEnd: end}, false,
			[]limit{{What: "quota", Used: u(80), Max: u(100), Percent: 80, Fill: 80, Level: levelAmber}}},
		{"red at 133%, refused until the period ends", ops.PeriodSummary{UnitsUsed: u(133), Quota: q(100), PeriodEnd: end}, false,
			[]limit{{What: "quota", Used: u(133), Max: u(100), Percent: 133, Fill: 100, Level: levelRed, Consequence: "refused until 2026-12-01 00:00 UTC"}}},
		{"past the quota with overage", ops.PeriodSummary{UnitsUsed: u(100), Quota: q(100), PeriodEnd: end}, true,
			[]limit{{What: "quota", Used: u(100), Max: u(100), Percent: 100, Fill: 100, Level: levelRed, Consequence: "further calls billed as overage"}}},
		{"a cap at 100% is red", ops.PeriodSummary{BillingModel: billing.UsagePostpaid, Spend: u(10), SpendingCap: q(10), PeriodEnd: end}, false,
			[]limit{{What: "spending cap", Used: u(10), Max: u(10), Unit: "EUR", Percent: 100, Fill: 100, Level: levelRed, Consequence: "refused until 2026-12-01 00:00 UTC"}}},
		{"a period that ends in the day: its time, to the minute after", ops.PeriodSummary{UnitsUsed: u(100), Quota: q(100),
			PeriodEnd: time.Date(2026, 12, 28, 17, 45, 20, 0, time.UTC)}, false,
			[]limit{{What: "quota", Used: u(100), Max: u(100), Percent: 100, Fill: 100, Level: levelRed, Consequence: "refused until 2026-12-28 17:46 UTC"}}},
		{"a zero quota is red", ops.PeriodSummary{Quota: q(0), PeriodEnd: end}, false,
			[]limit{{What: "quota", Max: 0, Percent: 100, Fill: 100, Level: levelRed, Consequence: "refused until 2026-12-01 00:00 UTC"}}},
	} {
		got := limits(tc.ps, tc.overage, "EUR")
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %+v", tc.name, got)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got[i], tc.want[i])
			}
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 1: 1, 1.2: 2, 2400: 2500, 228: 250, 14.8: 20, 0.03: 0.05, 7: 10} {
		if got := niceCeil(in); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", in, got, want)
		}
	}
}

// The console words the operations' errors for a person.
func TestHumanMessage(t *testing.T) {
	for in, want := range map[string]string{
		"expiresAt is in the past":                   "The expiry date is in the past.",
		"amount must not be zero":                    "The amount must not be zero.",
		"service weather has no product gold":        "Service weather has no product gold.",
		"serviceId is not a valid id":                "The service is not a valid id.",
		"status must be one of ACTIVE, TRIAL":        "Status must be one of ACTIVE, TRIAL.",
		"The end date must be after the start date.": "The end date must be after the start date.",
	} {
		if got := humanMessage(apierror.Invalid("x", in)); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

// Before and after of each kind of change.
func TestBeforeAfter(t *testing.T) {
	put := func(seq uint64, detail string) store.AuditEntry {
		return store.AuditEntry{Seq: seq, Action: ops.AuditSubscriptionPut, UserID: "dave", ServiceID: "weather", Detail: detail}
	}
	newer, older := put(2, "product credits, status ACTIVE (was product basic)"), put(1, "product basic, status TRIAL")
	seen := []store.AuditEntry{newer, older}
	for _, tc := range []struct {
		e             store.AuditEntry
		whole         bool
		before, after string
	}{
		{newer, true, "product basic, status TRIAL", "product credits, status ACTIVE"},
		{older, true, "no subscription", "product basic, status TRIAL"},
		{older, false, "(older than the entries read)", "product basic, status TRIAL"},
		{store.AuditEntry{Action: ops.AuditCreditsAdd, Detail: "amount -5, balance 0"}, true, "balance 5", "balance 0 (-5)"},
		{store.AuditEntry{Action: ops.AuditKeyRevoke, KeyID: "k1"}, true, "key k1 active", "revoked"},
		{store.AuditEntry{Action: ops.AuditConfigChange, Detail: "alerts_webhook: https://x"}, true, "", "alerts_webhook: https://x"},
	} {
		if b, a := beforeAfter(tc.e, seen, tc.whole); b != tc.before || a != tc.after {
			t.Errorf("%s %q: %q → %q, want %q → %q", tc.e.Action, tc.e.Detail, b, a, tc.before, tc.after)
		}
	}
	// Without the newer entry's own "(was …)" and no older entry read,
	// the product it had is still told.
	if b, _ := beforeAfter(newer, []store.AuditEntry{newer}, false); b != "product basic" {
		t.Errorf("before from the detail: %q", b)
	}
}

// TestLimitPercentExact: a limit's share is exact however large the
// figures. used·100 in int64 wrapped past about 9.2e16 micro-units: 950
// GB of a 1 TB PER_BYTE quota read "2%" (green), 100 GB "-8%".
func TestLimitPercentExact(t *testing.T) {
	gb := func(n int64) billing.Units { return billing.Whole(n * 1_000_000_000) }
	tb := gb(1000)
	for _, tc := range []struct {
		used, max     billing.Units
		percent, fill int
		level         string
	}{
		{gb(950), tb, 95, 95, levelAmber},
		{gb(100), tb, 10, 10, levelOK},
		{gb(800), tb, 80, 80, levelAmber},
		{gb(800) - 1, tb, 79, 79, levelOK},
		{tb, tb, 100, 100, levelRed},
		{gb(9_000), tb, 900, 100, levelRed},
		// 92 billion tokens of a quota of 100 billion.
		{billing.Whole(92_000_000_000), billing.Whole(100_000_000_000), 92, 92, levelAmber},
		// The largest amount of a limit of one micro-unit.
		{billing.Units(math.MaxInt64), 1, math.MaxInt, 100, levelRed},
	} {
		l := newLimit("quota", tc.used, tc.max, "byte")
		if l.Percent != tc.percent || l.Fill != tc.fill || l.Level != tc.level {
			t.Errorf("%v of %v: %d%% (fill %d, %s), want %d%% (fill %d, %s)", tc.used, tc.max, l.Percent, l.Fill, l.Level, tc.percent, tc.fill, tc.level)
		}
	}
}

// TestUnitNameOfEachMeasurement: a product without a unit label is named
// by its measurement, as the portal names it; a PER_TIME_UNIT product's
// seconds were charted as "unit".
func TestUnitNameOfEachMeasurement(t *testing.T) {
	for m, want := range map[string]string{billing.PerRequest: "request", billing.PerToken: "token", billing.PerByte: "byte", billing.PerTimeUnit: "second"} {
		if got := (&billing.Product{MeasurementType: m}).UnitName(); got != want {
			t.Errorf("%s: %q, want %q", m, got, want)
		}
	}
	if got := (&billing.Product{MeasurementType: billing.PerTimeUnit, UnitLabel: "minute"}).UnitName(); got != "minute" {
		t.Errorf("a label: %q", got)
	}
}
