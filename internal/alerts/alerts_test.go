package alerts

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

func units(s string) billing.Units {
	u, err := billing.ParseUnits(s)
	if err != nil {
		panic(err)
	}
	return u
}

func ptr(u billing.Units) *billing.Units { return &u }

func TestParseAndValidate(t *testing.T) {
	sub := billing.Product{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(units("100")), Overage: "allow", Price: units("0.1"), SpendingCap: ptr(units("50"))}
	prepaid := billing.Product{ID: "pre", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: units("1")}
	cases := []struct {
		p       billing.Product
		metric  string
		levels  []string
		wantErr string
		want    []string
	}{
		{sub, "quota", []string{"80%", "100%", "12.5%"}, "", []string{"quota 80%", "quota 100%", "quota 12.5%"}},
		{sub, "spending_cap", []string{"90%"}, "", []string{"spending_cap 90%"}},
		{prepaid, "credits_below", []string{"10", "0.5"}, "", []string{"credits_below 10", "credits_below 0.5"}},
		{sub, "quota", []string{"80"}, "a percentage such as 80%", nil},
		{sub, "quota", []string{"0%"}, "above 0%", nil},
		{sub, "quota", []string{"1001%"}, "at most 1000%", nil},
		{sub, "quota", []string{"-5%"}, "invalid decimal", nil},
		{sub, "quota", []string{"80%", "80%"}, "given twice", nil},
		{sub, "credits_below", []string{"10"}, "only PREPAID products have credits", nil},
		{prepaid, "quota", []string{"80%"}, "has no quota", nil},
		{prepaid, "spending_cap", []string{"80%"}, "has no spending cap", nil},
		{prepaid, "credits_below", []string{"0"}, "must be above 0", nil},
		{sub, "calls", []string{"1"}, "not one of quota, credits_below, spending_cap", nil},
		{sub, "quota", nil, "missing level", nil},
	}
	for _, c := range cases {
		ts, err := Parse(c.metric, c.levels)
		if err == nil {
			err = ValidateAll(c.p, ts)
		}
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s %v: error %v, want one containing %q", c.metric, c.levels, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %v: %v", c.metric, c.levels, err)
			continue
		}
		var names []string
		for _, th := range ts {
			names = append(names, th.String())
		}
		if strings.Join(names, "|") != strings.Join(c.want, "|") {
			t.Errorf("%s %v: names %v, want %v", c.metric, c.levels, names, c.want)
		}
	}
}

func TestReached(t *testing.T) {
	p := billing.Product{ID: "basic", BillingModel: billing.Subscription, Quota: ptr(units("10")), SpendingCap: ptr(units("4"))}
	q80 := Threshold{Metric: MetricQuota, Percent: units("80")}
	q100 := Threshold{Metric: MetricQuota, Percent: units("100")}
	cap90 := Threshold{Metric: MetricSpendingCap, Percent: units("90")}
	ts := []Threshold{q80, q100, cap90}
	names := func(rs []Reading) string {
		var s []string
		for _, r := range rs {
			s = append(s, r.Threshold.String()+"="+r.Value.String()+"/"+r.Limit.String())
		}
		return strings.Join(s, ",")
	}
	for _, c := range []struct {
		s    billing.State
		want string
	}{
		{billing.State{Used: units("7.999999")}, ""},
		// Held units are not usage yet.
		{billing.State{Used: units("7"), Reserved: units("3")}, ""},
		{billing.State{Used: units("8")}, "quota 80%=8/8"},
		{billing.State{Used: units("12"), Spend: units("3.6")}, "quota 80%=12/8,quota 100%=12/10,spending_cap 90%=3.6/3.6"},
	} {
		if got := names(Reached(p, c.s, ts)); got != c.want {
			t.Errorf("state %+v: reached %q, want %q", c.s, got, c.want)
		}
	}
	pre := billing.Product{ID: "pre", BillingModel: billing.Prepaid}
	low := []Threshold{{Metric: MetricCreditsBelow, Credits: units("10")}}
	if got := names(Reached(pre, billing.State{Credits: units("10")}, low)); got != "" {
		t.Errorf("credits at the threshold: reached %q", got)
	}
	if got := names(Reached(pre, billing.State{Credits: units("9.5")}, low)); got != "credits_below 10=9.5/10" {
		t.Errorf("credits below: reached %q", got)
	}
}

// TestShareExact: a percentage's level is exact to a millionth, rounded
// up. Dividing the percentage by 100 first lost its digits past the
// fourth decimal: 12.345678% of 1,000,000 was reached at 123456, and
// 0.00005% of 1000 at 0, so it fired with nothing used.
func TestShareExact(t *testing.T) {
	for _, c := range []struct{ limit, percent, want string }{
		{"10", "80", "8"},
		{"1000000", "12.345678", "123456.78"},
		{"1000", "0.00005", "0.0005"},
		{"3", "33.333333", "1"}, // 0.99999999, up to a millionth
		// 1/3 of a millionth rounds up: the level is never below the share.
		{"0.000001", "33.333333", "0.000001"},
		{"1000000000000", "100", "1000000000000"},
		{"1000000000000", "90", "900000000000"},
	} {
		if got := share(units(c.limit), units(c.percent)); got != units(c.want) {
			t.Errorf("%s%% of %s = %s, want %s", c.percent, c.limit, got, c.want)
		}
	}
	if got := share(units("1000000000000"), units("1000")); got != math.MaxInt64 {
		t.Errorf("1000%% of the largest quantity = %s, want the largest Units", got)
	}
	p := billing.Product{ID: "basic", BillingModel: billing.Subscription, Quota: ptr(units("1000"))}
	tiny, err := Parse(MetricQuota, []string{"0.00005%"})
	if err != nil {
		t.Fatal(err)
	}
	if rs := Reached(p, billing.State{}, tiny); len(rs) != 0 {
		t.Fatalf("nothing used reached %+v", rs)
	}
}

func TestEventBodyAndSignature(t *testing.T) {
	e := Event{EventID: "alt_1", CreatedAt: time.Date(2026, 11, 23, 16, 0, 0, 0, time.FixedZone("x", 3600)),
		UserID: "u1", ServiceID: "svc", ProductID: "basic", PeriodStart: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		Threshold: "quota 80%", Metric: MetricQuota, Value: units("8"), Limit: units("8")}
	body, err := e.Body()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"eventId":"alt_1","type":"usage.alert","createdAt":"2026-11-23T15:00:00Z","userId":"u1","serviceId":"svc",` +
		`"productId":"basic","periodStart":"2026-11-01T00:00:00Z","threshold":"quota 80%","metric":"quota","value":8,"limit":8}`
	if string(body) != want {
		t.Fatalf("body\n%s\nwant\n%s", body, want)
	}
	var back map[string]any
	if err := json.Unmarshal(body, &back); err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1795000000, 0)
	sig, ts := Sign([]byte("operator-secret-0123456789"), body, at)
	if ts != "1795000000" {
		t.Fatalf("timestamp %q", ts)
	}
	// The receiver's own HMAC, as docs/alerts.md shows it.
	m := hmac.New(sha256.New, []byte("operator-secret-0123456789"))
	m.Write(body)
	m.Write([]byte(ts))
	if want := base64.StdEncoding.EncodeToString(m.Sum(nil)); sig != want {
		t.Fatalf("signature %s, want %s", sig, want)
	}
}

// TestScheduleBacksOffAndGivesUp: the waits double up to Max, the last
// try is at GiveUpAfter, and a failure then gives up.
func TestScheduleBacksOffAndGivesUp(t *testing.T) {
	s := Schedule{Initial: time.Minute, Max: 10 * time.Minute, GiveUpAfter: time.Hour}
	created := time.Unix(0, 0)
	var waits []time.Duration
	at := created
	for attempts := 1; ; attempts++ {
		next, ok := s.Next(created, at, attempts)
		if !ok {
			break
		}
		waits = append(waits, next.Sub(at))
		at = next
		if attempts > 100 {
			t.Fatal("never gives up")
		}
	}
	// The last wait is cut to reach GiveUpAfter exactly: a wait of 10
	// after 55 minutes would pass it, and the alert was given up at 55
	// minutes, without a try in the last 5 (with DefaultSchedule, nearly
	// an hour before its 24 h).
	want := []time.Duration{1, 2, 4, 8, 10, 10, 10, 10, 5}
	if at != created.Add(s.GiveUpAfter) {
		t.Fatalf("last try at %s, want at GiveUpAfter %s", at.Sub(created), s.GiveUpAfter)
	}
	if len(waits) != len(want) {
		t.Fatalf("waits %v, want %v minutes", waits, want)
	}
	for i := range want {
		if waits[i] != want[i]*time.Minute {
			t.Fatalf("waits %v, want %v minutes", waits, want)
		}
	}
}

// TestDocumentedWebhookVector pins the quota example of docs/alerts.md
// (and docs/wire-contract.md), its body and its exact signature: the docs
// tell receivers to check their code against it.
func TestDocumentedWebhookVector(t *testing.T) {
	e := Event{EventID: "alt_42", CreatedAt: time.Date(2026, 11, 23, 15, 58, 37, 315677224, time.UTC),
		UserID: "user-1", ServiceID: "weather", ProductID: "basic", PeriodStart: time.Date(2026, 11, 17, 9, 12, 0, 0, time.UTC),
		Threshold: "quota 80%", Metric: MetricQuota, Value: billing.Whole(800), Limit: billing.Whole(800), Unit: "request"}
	body, err := e.Body()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"eventId":"alt_42","type":"usage.alert","createdAt":"2026-11-23T15:58:37.315677224Z","userId":"user-1","serviceId":"weather","productId":"basic","periodStart":"2026-11-17T09:12:00Z","threshold":"quota 80%","metric":"quota","value":800,"limit":800,"unit":"request"}`
	if string(body) != want {
		t.Fatalf("body\n%s\nwant\n%s", body, want)
	}
	sig, ts := Sign([]byte("example-alert-secret-0123"), body, time.Unix(1795449517, 0))
	if ts != "1795449517" || sig != "8RdLdGomhTrD1RStvezQg3m0PIRMvrdpkWebEvxsVhk=" {
		t.Fatalf("signature %s at %s", sig, ts)
	}
}

// TestReachedSaysWhatItCounts: every reading says what its value and
// limit count: money with its product's currency, credits as credits
// (also the spend of a PREPAID product, whose price is credits), units
// by their name; neither for money of a product without a currency.
// A spending cap's reading had no currency: "value":45 of what?
func TestReachedSaysWhatItCounts(t *testing.T) {
	capAt := func(model, currency string) billing.Product {
		return billing.Product{ID: "p", BillingModel: model, MeasurementType: billing.PerToken, Price: units("1"),
			Quota: ptr(units("10")), SpendingCap: ptr(units("4")), Currency: currency}
	}
	cap90 := []Threshold{{Metric: MetricSpendingCap, Percent: units("90")}}
	q80 := []Threshold{{Metric: MetricQuota, Percent: units("80")}}
	low := []Threshold{{Metric: MetricCreditsBelow, Credits: units("10")}}
	labelled := capAt(billing.Subscription, "EUR")
	labelled.UnitLabel = "word"
	for _, c := range []struct {
		what           string
		p              billing.Product
		ts             []Threshold
		currency, unit string
	}{
		{"usage spend in EUR", capAt(billing.UsagePostpaid, "EUR"), cap90, "EUR", ""},
		{"overage spend in JPY", capAt(billing.Subscription, "JPY"), cap90, "JPY", ""},
		{"spend without a currency", capAt(billing.UsageInstant, ""), cap90, "", ""},
		{"prepaid spend is credits", capAt(billing.Prepaid, "EUR"), cap90, "", UnitCredits},
		{"credits left", capAt(billing.Prepaid, "EUR"), low, "", UnitCredits},
		{"quota of tokens", capAt(billing.Subscription, "EUR"), q80, "", "token"},
		{"quota of a unit label", labelled, q80, "", "word"},
	} {
		rs := Reached(c.p, billing.State{Used: units("9"), Spend: units("4"), Credits: units("1")}, c.ts)
		if len(rs) != 1 || rs[0].Currency != c.currency || rs[0].Unit != c.unit {
			t.Errorf("%s: readings %+v, want currency %q unit %q", c.what, rs, c.currency, c.unit)
		}
	}
}

// TestEventBodyCurrencyLast: a spending cap alert carries its currency,
// a credits alert says credits, each after limit, so every field before
// it is where it always was (receivers verify the raw bytes); without
// either the body is what it always was.
func TestEventBodyCurrencyLast(t *testing.T) {
	base := Event{EventID: "alt_7", CreatedAt: time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC),
		UserID: "u1", ServiceID: "svc", ProductID: "metered", PeriodStart: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		Threshold: "spending_cap 90%", Metric: MetricSpendingCap, Value: units("45.5"), Limit: units("45")}
	const head = `{"eventId":"alt_7","type":"usage.alert","createdAt":"2026-11-23T16:00:00Z","userId":"u1","serviceId":"svc",` +
		`"productId":"metered","periodStart":"2026-11-01T00:00:00Z","threshold":"spending_cap 90%","metric":"spending_cap","value":45.5,"limit":45`
	for _, c := range []struct {
		currency, unit, tail string
	}{
		{"EUR", "", `,"currency":"EUR"}`},
		{"", "", `}`},
		{"", UnitCredits, `,"unit":"credits"}`},
	} {
		e := base
		e.Currency, e.Unit = c.currency, c.unit
		body, err := e.Body()
		if err != nil {
			t.Fatal(err)
		}
		if string(body) != head+c.tail {
			t.Errorf("body\n%s\nwant\n%s", body, head+c.tail)
		}
	}
}

// TestDocumentedSpendingCapVector pins the spending cap example of
// docs/alerts.md: its body and its exact signature.
func TestDocumentedSpendingCapVector(t *testing.T) {
	e := Event{EventID: "alt_43", CreatedAt: time.Date(2026, 11, 23, 16, 2, 11, 482910337, time.UTC),
		UserID: "user-1", ServiceID: "weather", ProductID: "basic", PeriodStart: time.Date(2026, 11, 17, 9, 12, 0, 0, time.UTC),
		Threshold: "spending_cap 90%", Metric: MetricSpendingCap, Value: units("45.02"), Limit: billing.Whole(45), Currency: "EUR"}
	body, err := e.Body()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"eventId":"alt_43","type":"usage.alert","createdAt":"2026-11-23T16:02:11.482910337Z","userId":"user-1","serviceId":"weather","productId":"basic","periodStart":"2026-11-17T09:12:00Z","threshold":"spending_cap 90%","metric":"spending_cap","value":45.02,"limit":45,"currency":"EUR"}`
	if string(body) != want {
		t.Fatalf("body\n%s\nwant\n%s", body, want)
	}
	sig, ts := Sign([]byte("example-alert-secret-0123"), body, time.Unix(1795449731, 0))
	if ts != "1795449731" || sig != "STtklC40zsK6T9gYzRAW/0kBMviOqKRrxxb79P/UFJ8=" {
		t.Fatalf("signature %s at %s", sig, ts)
	}
}
