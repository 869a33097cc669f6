package portal

import (
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// TestDashboardNamesThePlan: a caller who took the plan "Pro" (29.00 EUR a
// month) of "Shop API" on the plans page finds, on the dashboard, the
// service and the plan under those names and what the plan costs with its
// currency, not the ids "shop" and "product pro" with the quota alone.
// The banner of refused calls names the service the same way.
func TestDashboardNamesThePlan(t *testing.T) {
	e := localWith(t, "", shopService())
	key := e.keyOnly("pat")
	e.subscribe("pat", "shop", "pro", "ACTIVE")
	e.subscribe("pat", "shop", "pro", "SUSPENDED")
	c := e.newClient()
	page := c.signIn(key)
	card := page[strings.Index(page, `<article class="card sub">`):]
	card = card[:strings.Index(card, "</article>")]
	for _, want := range []string{"<h3>Shop API", "plan Pro", "29.00 EUR a month"} {
		if !strings.Contains(card, want) {
			t.Errorf("the subscription's card lacks %q:\n%s", want, card)
		}
	}
	if strings.Contains(card, "product pro") {
		t.Errorf("the card names the plan by its id:\n%s", card)
	}
	if !strings.Contains(page, "<li><strong>Shop API</strong>: your subscription is suspended") {
		t.Errorf("the banner does not name the service:\n%s", page)
	}
}

// TestBannerPointsToALargerPlan: a caller whose free plan's quota is used
// up, on a service with larger plans they may take themselves, is told to
// take one on the plans page (with its link), not to ask their provider;
// where no larger plan is theirs to take, the words stay as they were.
func TestBannerPointsToALargerPlan(t *testing.T) {
	e := localWith(t, "", shopService())
	key := e.keyOnly("pat")
	e.subscribe("pat", "shop", "free", "ACTIVE")
	e.charge("pat", "shop", "hello", billing.Whole(100), time.Now(), 0)
	page := e.newClient().signIn(key)
	want := `To fix: wait for the next period, or take a larger plan on <a href="/portal/plans/shop">the plans page</a>.`
	if !strings.Contains(page, want) {
		t.Errorf("the banner lacks %q:\n%s", want, page)
	}

	// Pro is the largest plan a caller may take: nothing larger to offer.
	e.subscribe("pat", "shop", "pro", "ACTIVE")
	e.charge("pat", "shop", "hello", billing.Whole(1000), time.Now(), 0)
	page = e.newClient().signIn(key)
	if !strings.Contains(page, "To fix: wait for the next period, or ask your provider for a larger plan.") {
		t.Errorf("the banner on the largest plan:\n%s", page)
	}
}

// TestExportRefusedKeepsTheDates: a CSV export refused for its days (the
// last before the first) says why above the same form, the days typed
// kept, to correct and send again; the page keeps the portal's menu.
func TestExportRefusedKeepsTheDates(t *testing.T) {
	e := localWith(t, "", shopService())
	key := e.keyOnly("pat")
	e.subscribe("pat", "shop", "free", "ACTIVE")
	c := e.newClient()
	c.signIn(key)
	resp, page := c.get("/portal/usage.csv?from=2026-11-20&to=2026-11-01")
	if resp.StatusCode != 400 {
		t.Fatalf("refused export: %d", resp.StatusCode)
	}
	for _, want := range []string{"The last day is before the first.", `id="export-from" name="from" type="date" value="2026-11-20"`,
		`id="export-to" name="to" type="date" value="2026-11-01"`, "Sign out"} {
		if !strings.Contains(page, want) {
			t.Errorf("the refused export's page lacks %q:\n%s", want, page)
		}
	}
}

// TestPlanNamedFreeSaysItOnce: a free plan named "Free" is headed "Free",
// not "Free · Free"; a free plan named otherwise keeps its price beside
// its name ("Bigger free · Free").
func TestPlanNamedFreeSaysItOnce(t *testing.T) {
	e := localWith(t, "", shopService())
	key := e.keyOnly("pat")
	c := e.newClient()
	c.signIn(key)
	_, page := c.get("/portal/plans/shop")
	if strings.Contains(page, "<h3>Free <span") || !strings.Contains(page, "<h3>Free</h3>") {
		t.Errorf("the plan Free's heading:\n%s", page)
	}
	if !strings.Contains(page, `<h3>Bigger free <span class="muted">· Free</span></h3>`) {
		t.Errorf("the plan Bigger free's heading:\n%s", page)
	}
}

// TestBackFromCheckoutOffersNoSecondPayment: a caller sent back by Stripe
// after paying (?m=subscribed), before Stripe's event made the plan theirs,
// is told to wait and reload, not offered "Subscribe and pay with Stripe"
// again beside their old plan, which a person who thinks the payment
// failed clicks, starting a second subscription and a second charge. The
// plans page opened otherwise offers it as before.
func TestBackFromCheckoutOffersNoSecondPayment(t *testing.T) {
	e, _ := startPaid(t)
	key := e.keyOnly("payer")
	c := e.newClient()
	c.signIn(key)
	_, page := c.get("/portal/plans/echo?m=subscribed")
	if strings.Contains(page, "Subscribe and pay with Stripe") || !strings.Contains(page, "Paying again would start a second subscription") {
		t.Errorf("the plans page back from Checkout:\n%s", page)
	}
	if _, page := c.get("/portal/plans/echo"); !strings.Contains(page, "Subscribe and pay with Stripe") {
		t.Errorf("the plans page:\n%s", page)
	}
}

// TestBannerAddCreditsLinksToPacks: a caller out of credits on a plan
// whose credits they buy themselves in packs is told where: "add credits
// on the plans page", linked to it, not "add credits" with no word of
// where.
func TestBannerAddCreditsLinksToPacks(t *testing.T) {
	e, _ := startTopUpSite(t)
	key := e.keyOnly("pat")
	e.subscribe("pat", "echo", "credits", "ACTIVE")
	page := e.newClient().signIn(key)
	want := `you have 0 credits left. <span class="fix">To fix: add credits on <a href="/portal/plans/echo">the plans page</a>.</span>`
	if !strings.Contains(page, want) {
		t.Errorf("the banner lacks %q:\n%s", want, page)
	}
}
