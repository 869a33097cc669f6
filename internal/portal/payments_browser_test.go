package portal

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

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
