package portal

import (
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
