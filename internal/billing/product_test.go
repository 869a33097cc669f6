package billing_test

import (
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

func TestRateLimitDefaults(t *testing.T) {
	tests := []struct {
		name     string
		rl       billing.RateLimit
		window   time.Duration
		capacity int
	}{
		{"all set", billing.RateLimit{Requests: 10, WindowSeconds: 60, Burst: 3}, time.Minute, 3},
		{"window defaults to a second", billing.RateLimit{Requests: 10}, time.Second, 10},
		{"burst defaults to requests", billing.RateLimit{Requests: 5, WindowSeconds: 7}, 7 * time.Second, 5},
		{"negative window is a second", billing.RateLimit{Requests: 5, WindowSeconds: -3}, time.Second, 5},
		{"negative burst is requests", billing.RateLimit{Requests: 5, Burst: -1}, time.Second, 5},
		{"burst above requests kept", billing.RateLimit{Requests: 2, WindowSeconds: 1, Burst: 9}, time.Second, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.rl.Window(); got != tt.window {
				t.Errorf("Window() = %v, want %v", got, tt.window)
			}
			if got := tt.rl.Capacity(); got != tt.capacity {
				t.Errorf("Capacity() = %d, want %d", got, tt.capacity)
			}
		})
	}
}

// TestProductEnumerations pins what Validate accepts against the lists the
// Caddyfile parser offers: every listed value is accepted, and the
// case-insensitive ones in any case.
func TestProductEnumerations(t *testing.T) {
	base := billing.Product{ID: "p", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest}
	type enumCase struct {
		name string
		set  func(*billing.Product)
		err  string // "" when valid
	}
	tests := []enumCase{
		{"empty period is month", func(p *billing.Product) { p.Period = "" }, ""},
		{"empty overage is block", func(p *billing.Product) { p.Overage = "" }, ""},
		{"period in upper case", func(p *billing.Product) { p.Period = "WEEK" }, ""},
		{"overage in mixed case", func(p *billing.Product) { p.Overage = "Allow" }, ""},
		{"billing model is case-sensitive", func(p *billing.Product) { p.BillingModel = "prepaid" },
			`product p: unknown billing model "prepaid"`},
		{"measurement type is case-sensitive", func(p *billing.Product) { p.MeasurementType = "per_token" },
			`product p: unknown measurement type "per_token"`},
		{"unknown billing model", func(p *billing.Product) { p.BillingModel = "" }, `product p: unknown billing model ""`},
		{"unknown period", func(p *billing.Product) { p.Period = "fortnight" },
			`product p: unknown period "fortnight" (day, week, month or year)`},
		{"unknown overage", func(p *billing.Product) { p.Overage = "warn" },
			`product p: overage must be block or allow, not "warn"`},
	}
	for _, v := range billing.BillingModels() {
		tests = append(tests, enumCase{"billing model " + v, func(p *billing.Product) { p.BillingModel = v }, ""})
	}
	for _, v := range billing.MeasurementTypes() {
		tests = append(tests, enumCase{"measurement type " + v, func(p *billing.Product) { p.MeasurementType = v }, ""})
	}
	for _, v := range billing.Periods() {
		tests = append(tests, enumCase{"period " + v, func(p *billing.Product) { p.Period = v }, ""})
	}
	for _, v := range billing.Overages() {
		tests = append(tests, enumCase{"overage " + v, func(p *billing.Product) { p.Overage = v }, ""})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := base
			tt.set(&p)
			err := p.Validate()
			switch {
			case tt.err == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.err != "" && (err == nil || err.Error() != tt.err):
				t.Errorf("Validate() = %v, want %s", err, tt.err)
			}
		})
	}
	if got := billing.Periods(); len(got) != 4 || got[2] != "month" {
		t.Errorf("Periods() = %v", got)
	}
}

// TestProductWarnings: what in a valid product can never be charged is
// said (the config still loads: a soft quota or a free plan may be
// meant), and a product that charges says nothing.
func TestProductWarnings(t *testing.T) {
	q := billing.Whole(10)
	capped := billing.Whole(100)
	tests := []struct {
		name string
		p    billing.Product
		want []string
	}{
		{"overage allowed for nothing", billing.Product{BillingModel: billing.Subscription, Quota: &q, Overage: "allow"},
			[]string{"overage allow without a price"}},
		{"subscription price without quota", billing.Product{BillingModel: billing.Subscription, Price: billing.Whole(1), Overage: "allow"},
			[]string{"has no quota"}},
		{"subscription price past a blocked quota", billing.Product{BillingModel: billing.Subscription, Quota: &q, Price: billing.Whole(1)},
			[]string{"its overage is blocked"}},
		{"cap on a free product", billing.Product{BillingModel: billing.UsagePostpaid, SpendingCap: &capped},
			[]string{"spending_cap can never be reached"}},
		{"cap on a blocked quota", billing.Product{BillingModel: billing.Subscription, Quota: &q, SpendingCap: &capped},
			[]string{"spending_cap can never be reached"}},
		{"charged overage", billing.Product{BillingModel: billing.Subscription, Quota: &q, Overage: "allow", Price: billing.Whole(1), SpendingCap: &capped}, nil},
		{"plain quota", billing.Product{BillingModel: billing.Subscription, Quota: &q}, nil},
		{"prepaid", billing.Product{BillingModel: billing.Prepaid, Price: billing.Whole(1), SpendingCap: &capped}, nil},
		{"free usage plan", billing.Product{BillingModel: billing.UsageInstant}, nil},
	}
	for _, tt := range tests {
		got := tt.p.Warnings()
		if len(got) != len(tt.want) {
			t.Errorf("%s: %q, want %d warnings like %q", tt.name, got, len(tt.want), tt.want)
			continue
		}
		for i, w := range tt.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: warning %q, want it to say %q", tt.name, got[i], w)
			}
		}
	}
}

// TestRateLimitWindowBounded: the JSON config takes window_seconds as a
// number, where the Caddyfile refuses a window past math.MaxInt32
// seconds. A longer one was accepted and Window overflowed time.Duration:
// 10^10 seconds became a negative window, a bucket that never refilled
// (its key refused for good after the burst) and a negative `w` in
// RateLimit-Policy.
func TestRateLimitWindowBounded(t *testing.T) {
	p := billing.Product{ID: "p", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		RateLimit: &billing.RateLimit{Requests: 1, WindowSeconds: 10_000_000_000}}
	if err := p.Validate(); err == nil {
		t.Errorf("a window of 10^10 seconds validated; Window() = %v", p.RateLimit.Window())
	}
	p.RateLimit.WindowSeconds = 1<<31 - 1
	if err := p.Validate(); err != nil {
		t.Errorf("the longest window the Caddyfile takes: %v", err)
	}
	if w := p.RateLimit.Window(); w <= 0 {
		t.Errorf("Window() = %v", w)
	}
}

// TestUnitLabelSurvivesTheHeader: a unit label is sent in
// X-<Brand>-Unit-Label and is the last field of the signed v3 context.
// Receivers drop the spaces around a header value (RFC 9110 section 5.5;
// Go's net/http, Node and the Python servers all do), so a label such as
// " tokens" was signed with its space and read without it: every call of
// the product failed the backend's signature check, and the backend's
// 401 was charged. Bytes that are not UTF-8 are refused as well: the
// label is shown and exported as text.
func TestUnitLabelSurvivesTheHeader(t *testing.T) {
	for _, bad := range []string{" tokens", "tokens ", " ", "tok\xffens"} {
		if err := billing.CheckUnitLabel(bad); err == nil {
			t.Errorf("unit %q accepted", bad)
		}
	}
	for _, good := range []string{"", "token", "1k tokens", "トークン"} {
		if err := billing.CheckUnitLabel(good); err != nil {
			t.Errorf("unit %q: %v", good, err)
		}
	}
}
