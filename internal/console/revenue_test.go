package console

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// seedPayments writes, through store.Payments as the webhook handlers do,
// a month of invoices, top-ups and Stripe subscriptions over moneyEnv's
// usage, and gives cal a negative balance: 10 credits bought, 8 spent,
// the payment refunded.
func seedPayments(t *testing.T, e *env, st store.Store) {
	t.Helper()
	pay, ok := st.(store.Payments)
	if !ok {
		t.Fatal("the bbolt store keeps no payment records")
	}
	bg := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	put := func(kind, id string, v any) {
		t.Helper()
		b, err := json.Marshal(v)
		must(err)
		must(pay.PutPaymentRecord(bg, kind, id, b, moneyNow))
	}
	day := func(d int) time.Time { return time.Date(2026, 11, d, 9, 0, 0, 0, time.UTC) }
	for _, inv := range []payments.InvoiceRecord{
		// November, EUR: 19.99 + 0.01 (a lower-case code, as Stripe writes it).
		{ID: "in_1", UserID: "ann", ServiceID: "eu", Status: "paid", AmountPaid: 1999, Currency: "EUR", PaidAt: day(3), PeriodEnd: day(1)},
		{ID: "in_6", UserID: "ann", ServiceID: "eu", Status: "paid", AmountPaid: 1, Currency: "eur", PaidAt: time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC)},
		// JPY has no minor unit: 500 is 500 JPY. Its period ends after
		// the usage of the 15th, which it covers.
		{ID: "in_2", UserID: "ann", ServiceID: "jp", Status: "paid", AmountPaid: 500, Currency: "JPY", PaidAt: day(5), PeriodEnd: day(16)},
		// KWD has three: 1125 is 1.125 KWD.
		{ID: "in_3", UserID: "ann", ServiceID: "kw", Status: "paid", AmountPaid: 1125, Currency: "KWD", PaidAt: day(6)},
		// October, and December: outside November.
		{ID: "in_4", UserID: "ann", ServiceID: "eu", Status: "paid", AmountPaid: 1000, Currency: "EUR", PaidAt: time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC)},
		{ID: "in_7", UserID: "ann", ServiceID: "eu", Status: "paid", AmountPaid: 7777, Currency: "EUR", PaidAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		// Not paid: never revenue.
		{ID: "in_5", UserID: "ann", ServiceID: "eu", Status: "open", AmountDue: 5000, Currency: "EUR"},
	} {
		put(payments.KindInvoice, inv.ID, inv)
	}
	for _, tu := range []payments.TopUpRecord{
		{ID: "pi_1", UserID: "cal", ServiceID: "pre", ProductID: "credits", Pack: "ten", Credits: "10", Amount: 1000, Currency: "USD", PaidAt: day(2), Refunded: 1000},
		{ID: "pi_2", UserID: "ann", ServiceID: "pre", ProductID: "credits", Pack: "big", Credits: "25", Amount: 2500, Currency: "USD", PaidAt: day(10)},
		{ID: "pi_3", UserID: "ann", ServiceID: "pre", ProductID: "credits", Pack: "yen", Credits: "3", Amount: 300, Currency: "JPY", PaidAt: day(11), Disputed: 100},
	} {
		put(payments.KindTopUp, tu.ID, tu)
	}
	for _, s := range []payments.SubscriptionRecord{
		{ID: "sub_1", UserID: "ann", ServiceID: "eu", ProductID: "pay", StripeStatus: "past_due", Status: "ACTIVE", PastDueSince: moneyNow.Add(-time.Hour)},
		{ID: "sub_2", UserID: "ben", ServiceID: "odd", ProductID: "b", StripeStatus: "past_due", Status: "ACTIVE", PastDueSince: moneyNow.Add(-100 * time.Hour)},
		{ID: "sub_3", UserID: "cal", ServiceID: "pre", ProductID: "credits", StripeStatus: "past_due", Status: "SUSPENDED", PastDueSince: moneyNow.Add(-80 * time.Hour)},
		{ID: "sub_4", UserID: "ann", ServiceID: "kw", ProductID: "pay", StripeStatus: "active", Status: "ACTIVE"},
	} {
		put(payments.KindSubscription, s.ID, s)
	}
	_, err := e.ops.PutSubscription(bg, "console:operator", "cal", "pre", "credits", "ACTIVE")
	must(err)
	_, err = pay.GrantCredits(bg, store.CreditGrant{ID: "pi_1", UserID: "cal", ServiceID: "pre", Credits: billing.Whole(10), GrantedAt: day(2), Source: "stripe"})
	must(err)
	svc, _ := e.rt.Catalog.Service("pre")
	p, _ := svc.Product("credits")
	res, err := st.Reserve(bg, store.Account{UserID: "cal", ServiceID: "pre", Product: *p}, billing.Whole(1), moneyNow)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("hold for cal: %v %+v", err, res.Decision)
	}
	_, err = st.Settle(bg, res, billing.Whole(16), store.LedgerEntry{Time: moneyNow, UserID: "cal", ServiceID: "pre", EndpointID: "get", ProductID: "credits", Source: store.SourceGateway})
	must(err)
	_, _, err = pay.ReverseCredits(bg, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: billing.Whole(10), At: day(12), Reason: "refund"})
	must(err)
}

// TestConsoleRevenue: the Revenue page sums paid invoices and top-ups
// (less refunds and disputes) per currency, exactly in minor units (JPY
// with none, KWD with three), in the month they were paid; shows the
// usage no invoice covers yet apart from what was received; the prepaid
// balances as credits owed per service and a negative balance as owed by
// its caller; past due subscriptions amber in the grace period and red
// past it or suspended. Nothing is added across currencies or to credits.
func TestConsoleRevenue(t *testing.T) {
	e, st := moneyEnv(t)
	seedPayments(t, e, st)
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}

	got := getPage(t, h, "/console/revenue")
	for _, w := range []string{
		"Revenue by currency, 2026-11",
		"EUR 20.00 EUR 0.00 EUR 20.00 EUR 0.00 EUR 1.50 EUR",
		"JPY 500 JPY 200 JPY 700 JPY 100 JPY 0 JPY",
		"KWD 1.125 KWD 0.000 KWD 1.125 KWD 0.000 KWD 1.125 KWD",
		"USD 0.00 USD 25.00 USD 25.00 USD 10.00 USD 0.00 USD",
		"Usage priced in no known currency, shown apart: " + oddA + ", " + oddB + ", " + gone + ".",
		"pre 15 credits 1",
		"cal pre credits -8 credits",
		"past_due → SUSPENDED: cal on pre (credits)",
		"past_due → ACTIVE: ben on odd (b), since 2026-11-11 08:00:00 UTC: past due beyond the grace period (72h): suspension due.",
		"past_due → ACTIVE: ann on eu (pay), since 2026-11-15 11:00:00 UTC: past due: Stripe retries the card; suspended from 2026-11-18 11:00 UTC unless paid.",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("no %q in\n%s", w, got)
		}
	}
	for _, bad := range []string{"77.77", "50.00 EUR", "30.00 EUR", "sub_4", "0 money"} {
		if strings.Contains(got, bad) {
			t.Errorf("%q on the page:\n%s", bad, got)
		}
	}
	w := serve(h, httptest.NewRequest("GET", "/console/revenue", nil), "operator")
	body := w.Body.String()
	// Red first (ben past the grace, cal suspended), then amber.
	red1, red2, amber := strings.Index(body, `<li class="level-red"><span class="level-red">past_due → ACTIVE:</span> <a href="/console/users/ben"`),
		strings.Index(body, `<li class="level-red"><span class="level-red">past_due → SUSPENDED`),
		strings.Index(body, `<li class="level-amber"><span class="level-amber">past_due → ACTIVE:</span> <a href="/console/users/ann"`)
	if red1 < 0 || red2 < 0 || amber < 0 || red1 > red2 || red2 > amber {
		t.Errorf("past due levels and order: red %d, %d, amber %d", red1, red2, amber)
	}
	if !strings.Contains(body, `class="num level-red">-8 credits`) {
		t.Error("the negative balance is not red")
	}

	// A range: October's invoice joins, each month has its row.
	got = getPage(t, h, "/console/revenue?from=2026-10&to=2026-11")
	for _, w := range []string{
		"Revenue by currency, 2026-10 to 2026-11",
		"EUR 30.00 EUR 0.00 EUR 30.00 EUR 0.00 EUR 1.50 EUR",
		"October 2026 EUR 10.00 EUR 0.00 EUR 10.00 EUR 0.00 EUR",
		"November 2026 EUR 20.00 EUR 0.00 EUR 20.00 EUR 1.50 EUR",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("range: no %q in\n%s", w, got)
		}
	}

	// The overview's summary of the month.
	got = getPage(t, h, "/console/")
	for _, w := range []string{
		"Received: 20.00 EUR, 700 JPY, 1.125 KWD, 25.00 USD.",
		"Usage not yet invoiced: 1.50 EUR, 0 JPY, 1.125 KWD, 0.00 USD; in no known currency: " + oddA + ", " + oddB + ", " + gone + ".",
		"Prepaid credits owed to callers (a liability): 15 credits on pre.",
		"1 negative prepaid balance owed by callers.",
		"3 subscriptions past due or suspended for non-payment.",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("overview: no %q in\n%s", w, got)
		}
	}

	// Bad ranges: a clear answer, nothing read.
	for q, want := range map[string]string{
		"from=2026-13":            "The first month must be written as 2026-09.",
		"from=2026-11&to=2026-10": "The last month must not be before the first.",
		"from=2026-11&to=nov":     "The last month must be written as 2026-11.",
		"from=2000-01&to=2026-11": "Choose at most five years.",
	} {
		w := serve(h, httptest.NewRequest("GET", "/console/revenue?"+q, nil), "operator")
		if w.Code != 400 || !strings.Contains(pageText(w.Body.String()), want) {
			t.Errorf("?%s: %d, want 400 with %q: %s", q, w.Code, want, pageText(w.Body.String()))
		}
	}
}

// TestConsoleRevenueWithoutPayments: with no payments block the page says
// so and still shows the usage money per currency (all of it: nothing is
// invoiced through the gateway), the liabilities and no past due list.
func TestConsoleRevenueWithoutPayments(t *testing.T) {
	e, st := moneyEnv(t)
	seedPayments(t, e, st) // records of an earlier config are not read
	h := direct(t, e, false)
	got := getPage(t, h, "/console/revenue")
	for _, w := range []string{
		"Payments are not configured",
		"EUR 0.00 EUR 0.00 EUR 0.00 EUR 0.00 EUR 1.50 EUR",
		"JPY 0 JPY 0 JPY 0 JPY 0 JPY 21 JPY",
		"KWD 0.000 KWD 0.000 KWD 0.000 KWD 0.000 KWD 1.125 KWD",
		"pre 15 credits 1",
		"Without payments, no subscription is suspended for non-payment.",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("no %q in\n%s", w, got)
		}
	}
	if strings.Contains(got, "USD") || strings.Contains(got, "20.00 EUR") {
		t.Errorf("payment records read without payments:\n%s", got)
	}
}

// TestConsoleRevenueUnderCaddy: the console Caddy provisions takes the
// app's payments block: with one the Revenue page reads the payment
// records (no "not configured"), without one it says payments are not
// configured.
func TestConsoleRevenueUnderCaddy(t *testing.T) {
	for _, tc := range []struct {
		extra string
		want  string
	}{
		{"", "Payments are not configured"},
		{"payments stripe {\n\t\t\tsecret_key sk_test_console\n\t\t\twebhook_secret whsec_console\n\t\t}", "No subscription is past due or suspended for non-payment."},
	} {
		t.Run(strings.Fields(tc.extra + " none")[0], func(t *testing.T) {
			e := start(t, tc.extra)
			r, _ := http.NewRequest("GET", e.base+"/console/revenue", nil)
			r.SetBasicAuth(testOperator, testPassword)
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := pageText(string(b)); resp.StatusCode != 200 || !strings.Contains(got, tc.want) {
				t.Errorf("payments %q: %d, want %q in\n%s", tc.extra, resp.StatusCode, tc.want, got)
			}
		})
	}
}

// TestRevenueSplitsTheHourAnInvoiceEnds: "usage not yet invoiced" counts
// the calls after the end of the last invoiced period, in the hour that
// end falls in too. Periods start at the subscription's start (23:03:39
// here), so the hourly sum of 23:00 is partly invoiced: the call at 23:01
// is, the one at 23:10 is not. The whole hour was taken as invoiced.
func TestRevenueSplitsTheHourAnInvoiceEnds(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	used := ops.NewKeyUse()
	rt := engine.New(engine.Runtime{Catalog: moneyCatalog(t, false, billing.Whole(100)), Data: st, KeyUsed: used.Touch,
		Calls: new(engine.Calls), Clock: func() time.Time { return now }})
	e := &env{rt: rt, ops: ops.New(rt, used.Get)}
	bg := context.Background()
	for _, svc := range []string{"jp", "kw"} {
		if _, err := e.ops.PutSubscription(bg, "test", "ann", svc, "pay", "ACTIVE"); err != nil {
			t.Fatal(err)
		}
	}
	call := func(service string, at time.Time, units int64) {
		t.Helper()
		svc, _ := rt.Catalog.Service(service)
		p, _ := svc.Product("pay")
		_, err := st.Record(bg, store.Account{UserID: "ann", ServiceID: service, Product: *p},
			store.LedgerEntry{Time: at, UserID: "ann", ServiceID: service, EndpointID: "get", ProductID: "pay", Source: store.SourceReport, Units: billing.Whole(units)},
			func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil })
		if err != nil {
			t.Fatal(err)
		}
	}
	at := func(d, h, m, s int) time.Time { return time.Date(2026, 11, d, h, m, s, 0, time.UTC) }
	// The ledger's times never go back: the calls in the order made.
	// KWD, 0.125 a request, invoiced to 14:00:00 on the hour: 13:59 is
	// in the invoice, 14:00 not (the hour boundary was right before).
	call("kw", at(20, 13, 59, 0), 1) // invoiced
	call("kw", at(20, 14, 0, 0), 2)  // 0.250 KWD, not
	// JPY, 3 a request. Invoiced: 22:50 and 23:01 (before 23:03:39).
	// Not invoiced: 23:03:39 itself, 23:10, and the next day's 00:30.
	call("jp", at(20, 22, 50, 0), 1)  // 3 JPY, invoiced
	call("jp", at(20, 23, 1, 0), 2)   // 6 JPY, invoiced
	call("jp", at(20, 23, 3, 39), 10) // 30 JPY, not
	call("jp", at(20, 23, 10, 0), 5)  // 15 JPY, not
	call("jp", at(21, 0, 30, 0), 100) // 300 JPY, not
	var pay store.Payments = st
	for _, inv := range []payments.InvoiceRecord{
		{ID: "in_jp", UserID: "ann", ServiceID: "jp", Status: "paid", AmountPaid: 9, Currency: "JPY", PaidAt: at(21, 9, 0, 0), PeriodEnd: at(20, 23, 3, 39)},
		{ID: "in_kw", UserID: "ann", ServiceID: "kw", Status: "paid", AmountPaid: 125, Currency: "KWD", PaidAt: at(21, 9, 0, 0), PeriodEnd: at(20, 14, 0, 0)},
	} {
		b, _ := json.Marshal(inv)
		if err := pay.PutPaymentRecord(bg, payments.KindInvoice, inv.ID, b, now); err != nil {
			t.Fatal(err)
		}
	}
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	got := getPage(t, h, "/console/revenue")
	for _, w := range []string{"JPY 9 JPY 0 JPY 9 JPY 0 JPY 345 JPY", "KWD 0.125 KWD 0.000 KWD 0.125 KWD 0.000 KWD 0.250 KWD"} {
		if !strings.Contains(got, w) {
			t.Errorf("revenue: no %q in\n%s", w, got)
		}
	}
	if got := getPage(t, h, "/console/"); !strings.Contains(got, "Usage not yet invoiced: 345 JPY, 0.250 KWD.") {
		t.Errorf("overview: not 345 JPY, 0.250 KWD not yet invoiced:\n%s", got)
	}
}

// TestRevenueFirstInvoiceCoversNoUsage: the first invoice of a Stripe
// subscription (its period starts and ends at the subscription's start)
// bills no metered usage: the meter shipper stamps usage recorded before
// the subscription began at its start, so it is billed at the end of the
// first period, and until then it is not yet invoiced. It read as
// invoiced as soon as the first invoice came (found by a review of the
// shown figures, with TestMetersUsageBeforeTheSubscriptionStampedAtItsStart).
func TestRevenueFirstInvoiceCoversNoUsage(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	used := ops.NewKeyUse()
	rt := engine.New(engine.Runtime{Catalog: moneyCatalog(t, false, billing.Whole(100)), Data: st, KeyUsed: used.Touch,
		Calls: new(engine.Calls), Clock: func() time.Time { return now }})
	e := &env{rt: rt, ops: ops.New(rt, used.Get)}
	bg := context.Background()
	if _, err := e.ops.PutSubscription(bg, "test", "ann", "jp", "pay", "ACTIVE"); err != nil {
		t.Fatal(err)
	}
	svc, _ := rt.Catalog.Service("jp")
	p, _ := svc.Product("pay")
	at := func(d, h, m, s int) time.Time { return time.Date(2026, 11, d, h, m, s, 0, time.UTC) }
	for _, c := range []struct {
		at    time.Time
		units int64
	}{{at(20, 9, 10, 0), 1}, {at(20, 10, 40, 0), 2}} { // 3 JPY before the start (10:30), 6 JPY after
		_, err := st.Record(bg, store.Account{UserID: "ann", ServiceID: "jp", Product: *p},
			store.LedgerEntry{Time: c.at, UserID: "ann", ServiceID: "jp", EndpointID: "get", ProductID: "pay", Source: store.SourceReport, Units: billing.Whole(c.units)},
			func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil })
		if err != nil {
			t.Fatal(err)
		}
	}
	var pay store.Payments = st
	start := at(20, 10, 30, 0)
	b, _ := json.Marshal(payments.InvoiceRecord{ID: "in_first", UserID: "ann", ServiceID: "jp", Status: "paid", AmountPaid: 500,
		Currency: "JPY", PaidAt: start, PeriodStart: start, PeriodEnd: start})
	if err := pay.PutPaymentRecord(bg, payments.KindInvoice, "in_first", b, now); err != nil {
		t.Fatal(err)
	}
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	if got := getPage(t, h, "/console/"); !strings.Contains(got, "Usage not yet invoiced: 9 JPY.") {
		t.Errorf("overview: not 9 JPY not yet invoiced:\n%s", got)
	}
}

// TestRevenueInvoiceRefundsNotReceived: what a refund or a lost dispute
// gave back of a paid invoice (the webhook keeps it on the invoice's
// record) is not received: Paid invoices are net of it, in the month the
// invoice was paid, and it is counted under Refunded or disputed.
func TestRevenueInvoiceRefundsNotReceived(t *testing.T) {
	e, st := moneyEnv(t)
	pay := st.(store.Payments)
	bg := context.Background()
	paid := time.Date(2026, 11, 3, 9, 0, 0, 0, time.UTC)
	for id, back := range map[string]string{
		"in_part":    `"refunded": 1000`,
		"in_dispute": `"disputed": 2900`,
		"in_whole":   `"refunded": 2900, "disputed": 2900`, // refunded, then the dispute lost too: never more than paid
	} {
		b := fmt.Sprintf(`{"id": %q, "userId": "ann", "serviceId": "eu", "status": "paid", "amountPaid": 2900, "currency": "EUR", "paidAt": %q, %s}`,
			id, paid.Format(time.RFC3339), back)
		if err := pay.PutPaymentRecord(bg, payments.KindInvoice, id, []byte(b), moneyNow); err != nil {
			t.Fatal(err)
		}
	}
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	// 3 × 29.00 paid, 10.00 + 29.00 + 29.00 back: 19.00 received.
	if got := getPage(t, h, "/console/revenue"); !strings.Contains(got, "EUR 19.00 EUR 0.00 EUR 19.00 EUR 68.00 EUR") {
		t.Errorf("no EUR 19.00 received, 68.00 refunded or disputed:\n%s", got)
	}
	if got := getPage(t, h, "/console/"); !strings.Contains(got, "Received: 19.00 EUR, ") {
		t.Errorf("overview: not 19.00 EUR received:\n%s", got)
	}
}
