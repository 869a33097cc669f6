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
	ends := trial.EndsAt.UTC().Format("2006-01-02 15:04 UTC")
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
