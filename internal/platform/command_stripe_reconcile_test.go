package platform

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
)

// TestCLIStripeReconcile: `caddy platform stripe reconcile` against a
// running server whose usage the shipper sent to stripe-mock: exit 0 and
// "ok" while the ledger and Stripe agree, a non-zero exit naming the
// difference once usage is not sent yet, the same in --json; a bad period
// is the admin API's invalid_request; a config without payments is
// not_found.
func TestCLIStripeReconcile(t *testing.T) {
	mock := stripetest.Start(t)
	base := mock.MeterState(t, map[string]string{"weather_calls": "mtr_weather"})
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dbJSON, _ := json.Marshal(filepath.Join(dir, "platform.db"))
	config := fmt.Sprintf(`{
		"admin": {"listen": %q},
		"apps": {
			"platform": {
				"store": %s,
				"payments": {"provider": "stripe", "secret_key": "sk_test_reconcile", "webhook_secret": "whsec_reconcile",
					"api_base": %q, "meter_interval": 3600000000000,
					"prices": [{"service": "weather", "product": "metered", "meter": "weather_calls"}]},
				"services": [{
					"id": "weather",
					"backend": "http://127.0.0.1:1",
					"secrets": ["0123456789abcdef0123456789abcdef"],
					"endpoints": [{"id": "forecast"}],
					"products": [{"id": "metered", "billing_model": "USAGE_POSTPAID", "measurement_type": "PER_REQUEST", "price": 0.25}],
					"product_listings": [{"product": "metered", "currency": "EUR"}]
				}]
			},
			"http": {"servers": {"srv0": {
				"listen": ["127.0.0.1:%d"],
				"routes": [{"handle": [{"handler": "static_response", "body": "ok"}]}]
			}}}
		}
	}`, admAddr, dbJSON, base, port)
	tester := admTester(t)
	tester.InitServer(config, "json")
	if t.Failed() {
		t.FailNow()
	}
	env := &admEnv{t: t}
	t.Cleanup(env.stop)
	app := admActiveApp(t)
	st := app.DataStore()
	ctx := context.Background()
	svc, _ := app.Catalog().Service("weather")
	prod, _ := svc.Product("metered")
	record := func(user string, units int64) {
		t.Helper()
		if _, err := st.Record(ctx, store.Account{UserID: user, ServiceID: "weather", Product: *prod},
			store.LedgerEntry{ID: fmt.Sprintf("%s-%d", user, time.Now().UnixNano()), Time: app.Now(), UserID: user, ServiceID: "weather",
				EndpointID: "forecast", ProductID: "metered", Units: billing.Whole(units), Source: store.SourceReport},
			func(store.LedgerEntry, billing.State) ([]byte, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range []string{"alice", "bob"} {
		if _, err := st.PutSubscription(ctx, store.Subscription{UserID: u, ServiceID: "weather", ProductID: "metered",
			Status: "ACTIVE", UpdatedAt: app.Now()}); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(payments.CustomerRecord{UserID: u, CustomerID: "cus_" + u, CreatedAt: app.Now()})
		if _, err := st.(store.Payments).InsertPaymentRecord(ctx, payments.KindCustomer, u, b, app.Now()); err != nil {
			t.Fatal(err)
		}
	}
	record("alice", 4)
	record("bob", 2)
	if _, err := app.PaymentsService().ShipMeters(ctx); err != nil {
		t.Fatal(err)
	}
	period := app.Now().UTC().Format("2006-01")
	out := cliMust(t, "stripe", "reconcile", "--period", period)
	for _, want := range []string{"cus_alice  alice", "weather_calls", "EUR", "1  ", "0.5", "2 customer meter(s), 0 differ"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	t.Logf("in agreement:\n%s", out)
	record("bob", 1) // not sent yet
	out, err = cliRun(t, "stripe", "reconcile", "--period", period)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 customer meters differ") || !strings.Contains(out, "DIFFERS: 0.25 not sent yet") {
		t.Errorf("a difference: err %v\n%s", err, out)
	}
	t.Logf("a difference:\n%s", out)
	out, err = cliRun(t, "stripe", "reconcile", "--period", period, "--json")
	var rec payments.Reconciliation
	if err == nil || json.Unmarshal([]byte(out), &rec) != nil || rec.Differ != 1 || len(rec.Rows) != 2 {
		t.Errorf("--json: err %v\n%s", err, out)
	}
	for _, r := range rec.Rows {
		if r.UserID == "bob" && (!r.Differs || r.Ledger != billing.Whole(3)/4 || r.Stripe != billing.Whole(2)/4) {
			t.Errorf("bob: %+v", r)
		}
	}

	for _, bad := range []string{"2026-13", "yesterday", "2026-11-02..2026-11-01"} {
		if _, err := cliRun(t, "stripe", "reconcile", "--period", bad); err == nil || !strings.Contains(err.Error(), "HTTP 400 invalid_request") {
			t.Errorf("--period %s: %v", bad, err)
		}
	}
	admExpectError(t, admJSON(t, "GET", "/platform/stripe/reconcile", ""), 400, "invalid_request", "period")
	admExpectError(t, admJSON(t, "GET", "/platform/stripe/reconcile?period=2026-11&x=1", ""), 400, "invalid_request", "x")
	admExpectError(t, admJSON(t, "POST", "/platform/stripe/reconcile?period=2026-11", ""), 405, "method_not_allowed", "")
	if _, err := cliRun(t, "stripe", "reconcile"); err == nil || !strings.Contains(err.Error(), "--period is required") {
		t.Errorf("without --period: %v", err)
	}

	// A config without payments (on another store: stop this one first).
	env.stop()
	admStart(t)
	admExpectError(t, admJSON(t, "GET", "/platform/stripe/reconcile?period=2026-11", ""), 404, "not_found", "")
}
