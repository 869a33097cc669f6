package portal

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// TestBillingPageWords: the billing page says every invoice status in
// words a caller understands (Stripe's draft, open, void and
// uncollectible were shown raw), and a credit pack's credits as the rest
// of the portal writes them: "1,000 credits", "1 credit" (shown as
// "1000 credits" and "1 credits").
func TestBillingPageWords(t *testing.T) {
	e, _ := startPaid(t)
	key := e.keyOnly("words")
	pay := e.store().(store.Payments)
	bg := context.Background()
	now := time.Now().UTC()
	for _, inv := range []payments.InvoiceRecord{
		{ID: "in_paid", Status: "paid", AmountDue: 2900, AmountPaid: 2900},
		{ID: "in_failed", Status: "open", AmountDue: 2900},
		{ID: "in_open", Status: "open"},
		{ID: "in_draft", Status: "draft", AmountDue: 2900},
		{ID: "in_void", Status: "void", AmountDue: 2900},
		{ID: "in_uncollectible", Status: "uncollectible", AmountDue: 2900},
	} {
		inv.UserID, inv.ServiceID, inv.ProductID, inv.CustomerID, inv.Currency, inv.UpdatedAt = "words", "echo", "pro", "cus_words", "USD", now
		b, _ := json.Marshal(inv)
		if err := pay.PutPaymentRecord(bg, payments.KindInvoice, inv.ID, b, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, tu := range []payments.TopUpRecord{
		{ID: "pi_thousand", Credits: "1000"},
		{ID: "pi_one", Credits: "1"},
		{ID: "pi_half", Credits: "2.5"},
	} {
		tu.UserID, tu.ServiceID, tu.ProductID, tu.Pack, tu.Amount, tu.Currency, tu.PaidAt, tu.UpdatedAt = "words", "echo", "pro", "pack", 1000, "USD", now, now
		b, _ := json.Marshal(tu)
		if err := pay.PutPaymentRecord(bg, payments.KindTopUp, tu.ID, b, now); err != nil {
			t.Fatal(err)
		}
	}
	c := e.newClient()
	c.signIn(key)
	_, page := c.get("/portal/billing")
	row := func(id string) string {
		t.Helper()
		i := strings.Index(page, `<tr id="`+id+`">`)
		if i < 0 {
			t.Fatalf("no row %s on the billing page:\n%s", id, page)
		}
		r := page[i:]
		return r[:strings.Index(r, "</tr>")]
	}
	cell := func(r, label string) string {
		i := strings.Index(r, `data-label="`+label+`">`)
		if i < 0 {
			return ""
		}
		c := r[i+len(`data-label="`+label+`">`):]
		return c[:strings.Index(c, "</td>")]
	}
	for id, want := range map[string]string{
		"in_paid":          "Paid",
		"in_failed":        "<strong>Payment failed</strong>",
		"in_open":          "Awaiting payment",
		"in_draft":         "Being prepared, not yet due",
		"in_void":          "Cancelled, nothing to pay",
		"in_uncollectible": "Unpaid, written off",
	} {
		if got := cell(row("invoice-"+id), "Status"); got != want {
			t.Errorf("invoice %s: status %q, want %q", id, got, want)
		}
	}
	for id, want := range map[string]string{"pi_thousand": "1,000 credits", "pi_one": "1 credit", "pi_half": "2.5 credits"} {
		if got := cell(row("topup-"+id), "Credits"); got != want {
			t.Errorf("top-up %s: credits %q, want %q", id, got, want)
		}
	}
}
