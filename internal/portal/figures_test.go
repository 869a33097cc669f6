package portal

import (
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestCancelTrialConfirmation: the confirmation before cancelling a
// trial names the day access really ends, the trial's end (sooner than
// the period's, and what cancelling sets), not the end of the period.
func TestCancelTrialConfirmation(t *testing.T) {
	e := localWith(t, "allow_key_management\nsign_in_limit 1000", shopService())
	c := e.newClient()
	c.signIn(e.keyOnly("tina"))
	if resp, body := c.plansForm("subscribe", "trial"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("trial: %d\n%s", resp.StatusCode, body)
	}
	trial, _ := e.subscription("tina")
	resp, body := c.get("/portal/plans/shop/cancel")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Cancel my subscription") {
		t.Fatalf("cancel confirmation: %d\n%s", resp.StatusCode, body)
	}
	confirm := body[strings.Index(body, `<div class="confirm">`):]
	confirm = confirm[:strings.Index(confirm, "</p>")]
	ends := trial.EndsAt.UTC().Format("2 Jan 2006 15:04 UTC")
	if !strings.Contains(confirm, ends) {
		t.Errorf("the confirmation does not name the trial's end %s: %s", ends, confirm)
	}
	if !trial.EndsAt.Before(time.Now().AddDate(0, 0, 20)) {
		t.Fatalf("the trial ends %s, not before its period", trial.EndsAt)
	}
}

// TestStandingNegativeBalance: a prepaid balance below zero (a refund
// took back credits already spent) is said as it is, not as "0 credits
// left": buying a pack as large as the debt does not yet serve a call.
func TestStandingNegativeBalance(t *testing.T) {
	prepaid := &billing.Product{BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1)}
	s := standingOf(ops.PeriodSummary{Status: "ACTIVE", Credits: -billing.Whole(5)}, prepaid)
	if s.Refused == nil || !strings.Contains(s.Refused.Reason, "-5 credits") || strings.Contains(s.Refused.Reason, "0 credits") {
		t.Errorf("a balance of -5 credits: %+v", s.Refused)
	}
	s = standingOf(ops.PeriodSummary{Status: "ACTIVE"}, prepaid)
	if s.Refused == nil || s.Refused.Reason != "you have 0 credits left" {
		t.Errorf("a balance of 0: %+v", s.Refused)
	}
}

// TestStandingEndsBeforeNextPeriod: a quota used up or a cap reached on
// a subscription that ends before its period does (a trial ending, a
// cancellation) was said as "until <period end>", with "wait for the
// next period": a period the caller will not have. The banner and the
// bar name the subscription's end and do not promise one; a
// subscription whose end comes after the period's still waits for the
// next period.
func TestStandingEndsBeforeNextPeriod(t *testing.T) {
	periodEnd := time.Date(2026, 12, 26, 17, 45, 20, 0, time.UTC) // the time of day the subscription began
	q, c := billing.Whole(100), billing.Whole(10)
	quota := &billing.Product{BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: &q}
	capped := &billing.Product{BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1), SpendingCap: &c}
	for _, tc := range []struct {
		name   string
		status string
		ends   time.Time
		p      *billing.Product
		reason string
		fix    string
	}{
		{"trial ending first", "TRIAL", time.Date(2026, 12, 9, 14, 0, 0, 0, time.UTC), quota,
			"quota used up; your subscription ends 9 Dec 2026 14:00 UTC", "ask your provider for a larger plan"},
		{"cancelling at the period's end", "CANCELLING", periodEnd, quota,
			"quota used up; your subscription ends 26 Dec 2026 17:46 UTC", "ask your provider for a larger plan"},
		{"cap, cancelling early", "CANCELLING", time.Date(2026, 12, 20, 0, 0, 0, 0, time.UTC), capped,
			"spending cap reached; your subscription ends 20 Dec 2026 00:00 UTC", "ask your provider to raise the cap"},
		{"ending after the period", "TRIAL", periodEnd.AddDate(0, 0, 10), quota,
			"quota used up until 26 Dec 2026 17:46 UTC", "wait for the next period, or ask your provider for a larger plan"},
		{"no end", "ACTIVE", time.Time{}, capped,
			"spending cap reached until 26 Dec 2026 17:46 UTC", "wait for the next period, or ask your provider to raise the cap"},
	} {
		ps := ops.PeriodSummary{ServiceID: "echo", Status: tc.status, PeriodEnd: periodEnd, EndsAt: tc.ends}
		if tc.p == quota {
			ps.Quota, ps.UnitsUsed = &q, billing.Whole(100)
		} else {
			ps.SpendingCap, ps.Spend = &c, billing.Whole(10)
		}
		s := standingOf(ps, tc.p)
		if s.Refused == nil || s.Refused.Reason != tc.reason || s.Refused.Fix != tc.fix {
			t.Errorf("%s: banner %+v, want %q, %q", tc.name, s.Refused, tc.reason, tc.fix)
		}
		if len(s.Gauges) != 1 || s.Gauges[0].Note != tc.reason {
			t.Errorf("%s: bar %+v, want the note %q", tc.name, s.Gauges, tc.reason)
		}
	}
}
