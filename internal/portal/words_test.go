package portal

import (
	"context"
	"math"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

func TestPricingWords(t *testing.T) {
	q, c := billing.Whole(10000), billing.Whole(50)
	for _, tc := range []struct {
		p    billing.Product
		want string
	}{
		{billing.Product{BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken, UnitLabel: "token", Price: billing.Whole(1) / 2000},
			"pay as you go, 0.50 in your plan's currency per 1,000 tokens"},
		{billing.Product{BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken, UnitLabel: "token", Price: billing.Whole(1) / 2000, Currency: "EUR"},
			"pay as you go, 0.50 EUR per 1,000 tokens"},
		{billing.Product{BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, UnitLabel: "request", Price: billing.Whole(2), Currency: "EUR"},
			"prepaid credits, 2 credits per request"},
		{billing.Product{BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken},
			"pay as you go, per 1,000 tokens"},
		{billing.Product{BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, UnitLabel: "request", Price: billing.Whole(2)},
			"prepaid credits, 2 credits per request"},
		{billing.Product{BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: &q, Overage: "block"},
			"monthly quota of 10,000 requests"},
		{billing.Product{BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: &q, Period: "day",
			Overage: "allow", Price: billing.Whole(1) / 100, SpendingCap: &c},
			"daily quota of 10,000 requests, then 0.01 in your plan's currency per request, spending cap of 50.00 in your plan's currency a day"},
		{billing.Product{BillingModel: billing.Subscription, MeasurementType: billing.PerRequest}, "monthly subscription, no quota"},
		{billing.Product{BillingModel: billing.UsageInstant, MeasurementType: billing.PerByte, Price: billing.Whole(1) / 1_000_000},
			"pay as you go, charged at each call, 1.00 in your plan's currency per 1,000,000 bytes"},
	} {
		if got := pricingWords(&tc.p); got != tc.want {
			t.Errorf("%+v:\n got %q\nwant %q", tc.p, got, tc.want)
		}
	}
	if got := pricingWords(nil); got != "no longer offered" {
		t.Errorf("no product: %q", got)
	}
	// The currency's own minor digits, as the plans page, the console and
	// the storefront write them: the dashboard said "500.00 JPY".
	for _, tc := range []struct {
		u        billing.Units
		currency string
		want     string
	}{
		{billing.Whole(500), "JPY", "500 JPY"},
		{billing.Whole(12345), "JPY", "12,345 JPY"},
		{billing.Whole(5) / 4, "BHD", "1.250 BHD"},
		{billing.Whole(29), "USD", "29.00 USD"},
		{billing.Whole(1) / 400, "EUR", "0.0025 EUR"},
		{billing.Whole(3), "", "3.00 in your plan's currency"},
	} {
		if got := moneyText(tc.u, tc.currency); got != tc.want {
			t.Errorf("moneyText(%s, %q) = %q, want %q", tc.u, tc.currency, got, tc.want)
		}
	}
}

func TestEnumWords(t *testing.T) {
	for in, want := range map[string]string{"ACTIVE": "Active", "CANCELLING": "Cancelling at period end",
		"cancelling_pending": "Cancelling at period end", "SUSPENDED": "Suspended", "EXPIRED": "Expired", "TRIAL": "Trial"} {
		if got := subscriptionWords(in); got != want {
			t.Errorf("%s: %q", in, got)
		}
	}
	for rl, want := range map[billing.RateLimit]string{{Requests: 10, WindowSeconds: 60}: "10/min", {Requests: 5}: "5/s",
		{Requests: 100, WindowSeconds: 3600}: "100/hour", {Requests: 3, WindowSeconds: 90}: "3 per 1m30s"} {
		if got := rateWords(&rl); got != want {
			t.Errorf("%+v: %q, want %q", rl, got, want)
		}
	}
	for u, want := range map[billing.Units]string{billing.Whole(1234567): "1,234,567.00", billing.Whole(1) / 2: "0.50", 0: "0.00", -billing.Whole(1500): "-1,500.00"} {
		if got := decimal(u, 2); got != want {
			t.Errorf("decimal(%d) = %q, want %q", u, got, want)
		}
	}
	if got := dateWords(time.Date(2026, 12, 26, 0, 0, 0, 0, time.UTC)); got != "26 Dec 2026" {
		t.Errorf("date %q", got)
	}
}

// TestStanding: the bar's level at 79, 80, 100 and 133%, and what refuses
// a call now in the gateway's own rule (billing.Decide).
func TestStanding(t *testing.T) {
	end := time.Date(2026, 12, 26, 0, 0, 0, 0, time.UTC)
	q, c := billing.Whole(100), billing.Whole(10)
	basic := &billing.Product{BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: &q}
	for used, level := range map[int64]string{0: levelOK, 79: levelOK, 80: levelWarn, 99: levelWarn, 100: levelOver, 133: levelOver} {
		s := standingOf(ops.PeriodSummary{ServiceID: "echo", Status: "ACTIVE", PeriodEnd: end, UnitsUsed: billing.Whole(used), Quota: &q}, basic)
		g := s.Gauges[0]
		if g.Level != level || g.Percent != int(used) || g.Width > 100 {
			t.Errorf("%d%%: %+v", used, g)
		}
		if refused := s.Refused != nil; refused != (used >= 100) {
			t.Errorf("%d%%: refused %+v", used, s.Refused)
		}
		if used == 133 && (g.Note != "quota used up until 26 Dec 2026 00:00 UTC" || s.Refused.Reason != "quota used up until 26 Dec 2026 00:00 UTC") {
			t.Errorf("133%%: %q / %+v", g.Note, s.Refused)
		}
	}
	// Overage allowed: past the quota the bar is red but calls go on.
	allow := *basic
	allow.Overage = "allow"
	if s := standingOf(ops.PeriodSummary{Status: "ACTIVE", PeriodEnd: end, UnitsUsed: billing.Whole(150), Quota: &q}, &allow); s.Refused != nil ||
		s.Gauges[0].Level != levelOver || !strings.Contains(s.Gauges[0].Note, "billed as overage") {
		t.Errorf("overage allowed: %+v", s)
	}
	capped := &billing.Product{BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1), SpendingCap: &c}
	if s := standingOf(ops.PeriodSummary{Status: "ACTIVE", PeriodEnd: end, Spend: billing.Whole(10), SpendingCap: &c}, capped); s.Refused == nil ||
		s.Refused.Reason != "spending cap reached until 26 Dec 2026 00:00 UTC" || s.Gauges[0].Note != "spending cap reached until 26 Dec 2026 00:00 UTC" {
		t.Errorf("cap reached: %+v", s)
	}
	prepaid := &billing.Product{BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1)}
	if s := standingOf(ops.PeriodSummary{Status: "ACTIVE"}, prepaid); s.Refused == nil || s.Refused.Fix != "add credits" {
		t.Errorf("0 credits: %+v", s)
	}
	if s := standingOf(ops.PeriodSummary{Status: "ACTIVE", Credits: billing.Whole(3)}, prepaid); s.Refused != nil {
		t.Errorf("3 credits: %+v", s.Refused)
	}
	for status, reason := range map[string]string{"SUSPENDED": "your subscription is suspended", "expired": "your subscription has expired"} {
		if s := standingOf(ops.PeriodSummary{Status: status}, basic); s.Refused == nil || s.Refused.Reason != reason {
			t.Errorf("%s: %+v", status, s.Refused)
		}
	}
}

// TestPortalUsageExport: the export answers only to a session, refuses a
// range it cannot read, and names the file by its days.
func TestPortalUsageExport(t *testing.T) {
	e := local(t, "")
	key, _ := e.user("alice", "basic")
	c := e.newClient()
	if resp, _ := c.get("/portal/usage.csv"); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("without a session: %d", resp.StatusCode)
	}
	c.signIn(key)
	for q, status := range map[string]int{
		"":                                http.StatusOK,
		"?from=2026-01-01&to=2026-01-31":  http.StatusOK,
		"?from=yesterday":                 http.StatusBadRequest,
		"?from=2026-02-01&to=2026-01-01":  http.StatusBadRequest,
		"?from=2024-01-01&to=2026-01-01":  http.StatusBadRequest,
		"?from=" + url.QueryEscape("<b>"): http.StatusBadRequest,
	} {
		resp, body := c.get("/portal/usage.csv" + q)
		if resp.StatusCode != status {
			t.Errorf("%s: %d, want %d\n%s", q, resp.StatusCode, status, body)
		}
	}
	resp, body := c.get("/portal/usage.csv?from=2026-01-01&to=2026-01-31")
	if got := resp.Header.Get("Content-Disposition"); got != `attachment; filename="usage-2026-01-01-to-2026-01-31.csv"` || body != strings.Join(exportHeader, ",")+"\n" {
		t.Errorf("%q\n%s", got, body)
	}
	if cell("=HYPERLINK()") != "'=HYPERLINK()" || cell("echo") != "echo" {
		t.Error("a formula cell is not defused")
	}
}

// TestAxisNumber: a chart's tick labels. Below 0.01 they read "0." (two
// decimals, zeros trimmed); they are exact to a millionth, as usage is.
func TestAxisNumber(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0", 5: "5", 2500: "2,500", 25000: "25k", 2500000: "2.5M",
		0.5: "0.5", 0.004: "0.004", 0.000125: "0.000125", 0.1 + 0.2: "0.3", 1.25: "1.25",
	} {
		if got := axisNumber(f); got != want {
			t.Errorf("axisNumber(%v) = %q, want %q", f, got, want)
		}
	}
}

// TestPortalUsageCaptionExact: the usage chart's caption says the
// table's exact total and the largest day exactly, however large: summed
// through float64 it said "1,423,456,789,016.999936 in all" beside a
// table of 1,423,456,789,017 (found by a review of the shown figures).
// A small day's bar says it exactly too.
func TestPortalUsageCaptionExact(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	day := now.Truncate(24 * time.Hour)
	var rs []store.Rollup
	for _, u := range []billing.Units{billing.Whole(600_000_000_001), billing.Whole(700_000_000_003), billing.Whole(123_456_789_013),
		billing.Whole(1) / 1000 * 3} {
		rs = append(rs, store.Rollup{UserID: "u", ServiceID: "s", EndpointID: "e", ProductID: "p", Hour: day, Calls: 1, Units: u})
		day = day.Add(-24 * time.Hour)
	}
	v := buildUsage(nil, rs, now)
	if len(v.Units) != 1 {
		t.Fatalf("%d units, want 1", len(v.Units))
	}
	u := v.Units[0]
	if got, want := decimal(u.Total, 0), "1,423,456,789,017.003"; got != want {
		t.Fatalf("table total %s, want %s", got, want)
	}
	for _, want := range []string{"1,423,456,789,017.003 in all", "at most 700,000,000,003 in one day"} {
		if !strings.Contains(u.Chart.Caption, want) {
			t.Errorf("caption %q does not say %q", u.Chart.Caption, want)
		}
	}
	var small bool
	for _, b := range u.Chart.Bars {
		small = small || strings.HasSuffix(b.Label, ": 0.003 "+u.Unit)
		if strings.Contains(b.Label, "999") {
			t.Errorf("bar label %q is not the day's sum", b.Label)
		}
	}
	if !small {
		t.Errorf("no bar says the small day's 0.003 exactly: %+v", u.Chart.Bars)
	}
}

// TestGaugePercentExact: a bar's percentage is the share used, rounded
// down, exactly. Through float64, 29 of 100 requests read "28%" (0.29 ×
// 100 is 28.999…), 57 "56%", 113 "112%".
func TestGaugePercentExact(t *testing.T) {
	end := time.Date(2026, 12, 26, 0, 0, 0, 0, time.UTC)
	q := billing.Whole(100)
	basic := &billing.Product{BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: &q}
	for _, used := range []int64{29, 57, 58, 113} {
		g := standingOf(ops.PeriodSummary{Status: "ACTIVE", PeriodEnd: end, UnitsUsed: billing.Whole(used), Quota: &q}, basic).Gauges[0]
		if g.Percent != int(used) {
			t.Errorf("%d of 100 used: %d%%", used, g.Percent)
		}
	}
	// Past int64 when multiplied by 100: a 1 TB PER_BYTE quota, 950 GB used.
	tb := billing.Whole(1_000_000_000_000)
	bytes := &billing.Product{BillingModel: billing.Subscription, MeasurementType: billing.PerByte, Quota: &tb}
	if g := standingOf(ops.PeriodSummary{Status: "ACTIVE", PeriodEnd: end, UnitsUsed: tb / 100 * 95, Quota: &tb}, bytes).Gauges[0]; g.Percent != 95 || g.Level != levelWarn {
		t.Errorf("950 GB of 1 TB: %+v", g)
	}
}

// TestPortalUsageSumsNeverWrap: the stores keep each hourly rollup at
// most at the largest amount (a report of billing.MaxUnits), and the
// portal's usage table and chart added hours and days without a bound:
// two such hours read as a large negative day and total.
func TestPortalUsageSumsNeverWrap(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	day := now.Truncate(24 * time.Hour)
	var rs []store.Rollup
	for h := range 3 {
		for d := range 2 {
			rs = append(rs, store.Rollup{UserID: "u", ServiceID: "s", EndpointID: "e", ProductID: "p",
				Hour: day.Add(-time.Duration(d) * 24 * time.Hour).Add(time.Duration(h) * time.Hour), Calls: 1, Units: math.MaxInt64})
		}
	}
	v := buildUsage(nil, rs, now)
	if len(v.Units) != 1 {
		t.Fatalf("%d units, want 1", len(v.Units))
	}
	u := v.Units[0]
	if u.Total != math.MaxInt64 {
		t.Errorf("table total %s, want the largest amount", decimal(u.Total, 0))
	}
	for _, r := range u.Rows {
		if r.Units != math.MaxInt64 {
			t.Errorf("day %s: %s, want the largest amount", r.Day.Format(time.DateOnly), decimal(r.Units, 0))
		}
	}
	if strings.Contains(u.Chart.Caption, "-") {
		t.Errorf("caption %q has a negative figure", u.Chart.Caption)
	}
}

// TestPortalUsageExportRemovedProduct: a row of a product since removed
// from the catalog cannot tell credits from money, and says so: it was
// labelled "money", which the cost of a removed PREPAID product is not.
func TestPortalUsageExportRemovedProduct(t *testing.T) {
	e := local(t, "")
	key, _ := e.user("alice", "basic")
	at := time.Now().UTC().Add(-time.Hour)
	gone := billing.Product{ID: "gone", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: billing.Whole(2)}
	if _, err := e.store().AddCredits(context.Background(), "alice", "echo", billing.Whole(10), at, store.AuditEntry{Time: at, Actor: "test",
		Action: "credits.add", UserID: "alice", ServiceID: "echo", Detail: "amount 10"}); err != nil {
		t.Fatal(err)
	}
	en := store.LedgerEntry{Time: at, UserID: "alice", ServiceID: "echo", EndpointID: "hello", ProductID: "gone",
		Source: store.SourceReport, Units: billing.Whole(3), RequestID: "req-gone"}
	if _, err := e.store().Record(context.Background(), store.Account{UserID: "alice", ServiceID: "echo", Product: gone}, en,
		func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
		t.Fatal(err)
	}
	c := e.newClient()
	c.signIn(key)
	_, body := c.get("/portal/usage.csv")
	lines := strings.Split(strings.TrimSpace(body), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], ",req-gone,3,units,0,6,unknown,report") {
		t.Fatalf("export of a removed product's row:\n%s", body)
	}
}

// TestPriceTextRemovedPlan: the cost of a plan no longer offered (a
// recent call's, a job's) cannot tell credits from money and says so; it
// read "6.00 in your plan's currency", money, where a removed PREPAID
// plan's cost was credits.
func TestPriceTextRemovedPlan(t *testing.T) {
	if got, want := priceText(nil, billing.Whole(6)), "6 of a plan no longer offered (credits or money)"; got != want {
		t.Errorf("priceText(nil, 6) = %q, want %q", got, want)
	}
	eur := &billing.Product{BillingModel: billing.UsagePostpaid, Currency: "EUR"}
	pre := &billing.Product{BillingModel: billing.Prepaid, Currency: "EUR"}
	if got := priceText(eur, billing.Whole(6)); got != "6.00 EUR" {
		t.Errorf("money: %q", got)
	}
	if got := priceText(pre, billing.Whole(6)); got != "6 credits" {
		t.Errorf("credits: %q", got)
	}
}

// TestCostTextOfAFreePlan: a call under a plan that charges no money and
// names no currency (a free plan) cost nothing, and its row says "None",
// not "0.00 in your plan's currency"; a zero of a plan with a currency, or
// in credits, keeps its unit, and a cost that is not zero keeps the words.
func TestCostTextOfAFreePlan(t *testing.T) {
	free := &billing.Product{BillingModel: billing.Subscription}
	eur := &billing.Product{BillingModel: billing.UsagePostpaid, Currency: "EUR"}
	pre := &billing.Product{BillingModel: billing.Prepaid}
	for _, tc := range []struct {
		p    *billing.Product
		u    billing.Units
		want string
	}{
		{free, 0, "None"},
		{free, billing.Whole(3), "3.00 in your plan's currency"},
		{eur, 0, "0.00 EUR"},
		{pre, 0, "0 credits"},
		{nil, 0, "None"},
	} {
		if got := costText(tc.p, tc.u); got != tc.want {
			t.Errorf("costText(%+v, %s) = %q, want %q", tc.p, tc.u, got, tc.want)
		}
	}
}
