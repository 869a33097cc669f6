package portal

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// TestBrowserBillingOnAPhone: in a real browser at 390×844, the plans
// page with a paid plan and the billing page with invoices fit the
// screen, keep the stylesheet under the CSP with no inline script, and
// name every control; the invoices become stacked rows, their statuses
// in words ("Being prepared, not yet due") within the screen.
func TestBrowserBillingOnAPhone(t *testing.T) {
	ctx := newBrowser(t)
	e, _ := startPaid(t)
	key := e.keyOnly("phone")
	pay := e.store().(store.Payments)
	bg := context.Background()
	rec, _ := json.Marshal(payments.CustomerRecord{UserID: "phone", CustomerID: "cus_phone", CreatedAt: time.Now().UTC()})
	if _, err := pay.InsertPaymentRecord(bg, payments.KindCustomer, "phone", rec, time.Now()); err != nil {
		t.Fatal(err)
	}
	for i, st := range []string{"paid", "open", "draft"} {
		inv, _ := json.Marshal(payments.InvoiceRecord{ID: "in_phone_" + st, UserID: "phone", ServiceID: "echo", ProductID: "pro",
			CustomerID: "cus_phone", Status: st, AmountDue: 2900, AmountPaid: map[string]int64{"paid": 2900}[st], Currency: "USD",
			PeriodStart: time.Now().AddDate(0, -i-1, 0), PeriodEnd: time.Now().AddDate(0, -i, 0),
			HostedURL: "https://invoice.stripe.com/i/acct_1234567890/test_a_rather_long_invoice_link_" + st, PDFURL: "https://pay.stripe.com/invoice/x/pdf",
			UpdatedAt: time.Now().UTC()})
		if err := pay.PutPaymentRecord(bg, payments.KindInvoice, "in_phone_"+st, inv, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	step(t, ctx, "viewport", chromedp.EmulateViewport(phoneWidth, phoneHeight))
	signInBrowser(t, ctx, key, false)
	for _, p := range []struct{ name, path, wait string }{
		{"plans", "/portal/plans/echo", "#plan-pro form button"},
		{"billing", "/portal/billing", "#invoices table"},
	} {
		step(t, ctx, p.name, chromedp.Navigate(siteBase+p.path), chromedp.WaitVisible(chromedp.CSS(p.wait)))
		checkPage(t, ctx, "the "+p.name+" page")
		if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > phoneWidth {
			wide := eval[[]string](t, ctx, `[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 390.5).slice(0, 5).map(e => e.outerHTML.slice(0, 100))`)
			t.Errorf("%s at %dpx is %dpx wide: %q", p.name, phoneWidth, w, wide)
		}
		shot(t, ctx, p.name+"-paid-390")
	}
	if d := eval[string](t, ctx, `getComputedStyle(document.querySelector('#invoices td')).display`); d == "table-cell" {
		t.Error("invoices on a phone are not stacked rows")
	}
}

// TestBrowserCreditsHeldOnAPhone: at 390×844 the plans page of a prepaid
// plan whose grant expired while a job held 12 of its credits says so in
// words, before the next expiry, and still fits the screen.
func TestBrowserCreditsHeldOnAPhone(t *testing.T) {
	ctx := newBrowser(t)
	e, _ := startTopUpSitePriced(t, "", "price_small_held", "price_big_held")
	key, _ := e.user("held", "credits")
	pay := e.store().(store.Payments)
	bg := context.Background()
	now := time.Now().UTC()
	for _, g := range []store.CreditGrant{
		{ID: "pi_held", Credits: billing.Whole(100), GrantedAt: now.Add(-time.Hour), ExpiresAt: now.Add(time.Minute)},
		{ID: "pi_later", Credits: billing.Whole(50), GrantedAt: now.Add(-time.Minute), ExpiresAt: now.AddDate(0, 0, 30)},
	} {
		g.UserID, g.ServiceID, g.Source = "held", "echo", "stripe"
		if _, err := pay.GrantCredits(bg, g); err != nil {
			t.Fatal(err)
		}
	}
	a := store.Account{UserID: "held", ServiceID: "echo", Product: billing.Product{ID: "credits", BillingModel: billing.Prepaid,
		MeasurementType: billing.PerRequest, Price: billing.Whole(1)}}
	j := store.Job{ID: "job-held", UserID: "held", ServiceID: "echo", EndpointID: "hello", ProductID: "credits",
		Status: store.JobPending, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if res, err := e.store().CreateJobReserved(bg, j, a, billing.Whole(12), now); err != nil || !res.Decision.Allowed {
		t.Fatalf("job holding 12: %+v %v", res.Decision, err)
	}
	got, err := pay.ExpireCredits(bg, now.Add(2*time.Minute))
	if err != nil || len(got) != 1 || got[0].Deferred != billing.Whole(12) {
		t.Fatalf("ExpireCredits = %+v, %v; want pi_held with 12 deferred", got, err)
	}
	step(t, ctx, "viewport", chromedp.EmulateViewport(phoneWidth, phoneHeight))
	signInBrowser(t, ctx, key, false)
	step(t, ctx, "plans", chromedp.Navigate(siteBase+"/portal/plans/echo"), chromedp.WaitVisible(chromedp.ID("held-expiry")))
	checkPage(t, ctx, "the plans page")
	if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > phoneWidth {
		wide := eval[[]string](t, ctx, `[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 390.5).slice(0, 5).map(e => e.outerHTML.slice(0, 100))`)
		t.Errorf("plans at %dpx is %dpx wide: %q", phoneWidth, w, wide)
	}
	text := eval[string](t, ctx, `document.querySelector('#credits').innerText`)
	held := "12 credits expire when the calls holding them finish, less what those calls use."
	later := "50 credits expire on " + now.AddDate(0, 0, 30).Format("2 Jan 2006") + "."
	if i, k := strings.Index(text, held), strings.Index(text, later); i < 0 || k < i {
		t.Errorf("the credits section says %q; want %q, then %q", text, held, later)
	}
	shot(t, ctx, "plans-held-390")
}
