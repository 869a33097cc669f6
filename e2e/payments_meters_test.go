package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

const (
	meterSecret    = "meter-secret-meter-secret-000001"
	meterStripeKey = "sk_test_e2emetersnotarealkey"
)

// TestMetersKill9: the real binary serves calls of a postpaid product to a
// subscriber with a Stripe customer; its shipper sends the usage to
// stripe-mock (behind the recording proxy) as meter events; it is killed
// with SIGKILL while Stripe is slow to answer a meter event, restarted,
// and in the end every unit of the ledger reached Stripe once: the
// distinct identifiers' values add up to the ledger's cost, and every
// resend of an identifier carried the same value.
func TestMetersKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the real binary")
	}
	bin := e2etest.GatewayBinary(t)
	mock := stripetest.Start(t)
	var slow atomic.Bool
	var inFlight atomic.Int64
	mock.Fail(func(r stripetest.Request) int {
		if r.Path == "/v1/billing/meter_events" && slow.Load() {
			inFlight.Add(1)
			time.Sleep(6 * time.Second) // the gateway dies while waiting
		}
		return 0
	})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(be.Close)

	dir := t.TempDir()
	dbPath := filepath.Join(dir, "platform.db")
	// The subscriber's Stripe customer, as Checkout leaves it.
	st, err := boltstore.Open(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	cust, _ := json.Marshal(payments.CustomerRecord{UserID: "u-meter", CustomerID: "cus_meter", CreatedAt: time.Now().UTC()})
	if _, err := st.InsertPaymentRecord(context.Background(), payments.KindCustomer, "u-meter", cust, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	adminPort, httpPort := e2etest.FreePort(t), e2etest.FreePort(t)
	cfg := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`{
	admin 127.0.0.1:%d
	http_port %d
	https_port %d
	auto_https off
	grace_period 2s
	platform {
		store %s
		payments stripe {
			secret_key {env.STRIPE_SECRET_KEY}
			webhook_secret whsec_e2e_meters
			api_base %s
			meter_interval 1s
			meter metered payg geo_payg price_metered
		}
		service metered {
			backend %s
			secret {env.METER_SECRET}
			endpoint echo {
				methods GET POST
				path /echo
			}
			product payg {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				unit request
				price 0.002
				currency USD
			}
		}
	}
}
:%d {
	bind 127.0.0.1
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform
	}
}
`, adminPort, httpPort, e2etest.FreePort(t), dbPath, mock.URL, be.URL, httpPort)), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "caddy.log")
	run := e2etest.Run{Name: "the binary", Bin: bin, Config: cfg, Home: dir,
		Env: []string{"METER_SECRET=" + meterSecret, "STRIPE_SECRET_KEY=" + meterStripeKey},
		Log: logPath, AdminPort: adminPort, HTTPPort: httpPort}

	p := e2etest.Start(t, run)
	var k struct {
		Key string `json:"key"`
	}
	e2etest.AdminJSON(t, "POST", p.Admin+"/platform/keys", map[string]any{"userId": "u-meter"}, 201, &k)
	e2etest.AdminJSON(t, "PUT", p.Admin+"/platform/subscriptions/u-meter/metered", map[string]any{"productId": "payg"}, 200, nil)
	served := 0
	callN := func(base string, n int) {
		for i := 0; i < n; i++ {
			resp, body := call(t, "POST", base+"/api/service/metered/endpoint/echo/invoke", k.Key, "{}")
			if resp.StatusCode != 200 {
				t.Fatalf("call: %d %s", resp.StatusCode, body)
			}
			served++
		}
	}
	callN(p.Base, 10)
	waitSum(t, mock, int64(served)*2000, 30*time.Second)
	// Stripe slows down; more usage; the gateway is killed while a meter
	// event waits for its answer.
	slow.Store(true)
	callN(p.Base, 7)
	deadline := time.Now().Add(30 * time.Second)
	for inFlight.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no meter event was sent after more usage (log in %s)\n%s", logPath, e2etest.Tail(logPath))
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.Kill()
	slow.Store(false)

	// The restarted gateway takes the lease once the dead one's runs out
	// (15s) and sends what was planned, then the new usage.
	p = e2etest.Start(t, run)
	callN(p.Base, 5)
	waitSum(t, mock, int64(served)*2000, 60*time.Second)
	p.Stop(t, 20*time.Second)

	// The ledger, read from the file, agrees.
	st, err = boltstore.Open(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var cost int64
	if err := st.ScanLedger(context.Background(), store.LedgerFilter{UserID: "u-meter"}, func(e store.LedgerEntry) error {
		cost += int64(e.Cost)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	saw := meterEvents(t, mock)
	taken := map[string]bool{}
	for _, r := range mock.Requests("/v1/billing/meter_events") {
		taken[r.Form.Get("identifier")] = taken[r.Form.Get("identifier")] || r.Status == 200
	}
	for id := range saw {
		if !taken[id] {
			t.Errorf("identifier %s was never answered 200 by stripe-mock", id)
		}
	}
	var sum int64
	for _, v := range saw {
		sum += v
	}
	if sum != cost || cost != int64(served)*2000 {
		t.Errorf("Stripe got %d over %d identifiers; the ledger's cost is %d for %d calls", sum, len(saw), cost, served)
	}
	resent := len(mock.Requests("/v1/billing/meter_events")) - len(saw)
	t.Logf("%d calls, %d meter events, %d resent after the kill", served, len(saw), resent)
	if found := secretsIn(t, logPath, []string{meterStripeKey, meterSecret, k.Key}); len(found) > 0 {
		t.Errorf("the server log holds a key or secret: %q", found[0])
	}
}

// meterEvents reads the meter events at the proxy: value by identifier.
// Every attempt counts (Stripe may have taken one whose answer was
// lost), and every attempt of an identifier must carry the same value
// and customer.
func meterEvents(t *testing.T, m *stripetest.Mock) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, r := range m.Requests("/v1/billing/meter_events") {
		id := r.Form.Get("identifier")
		v, err := strconv.ParseInt(r.Form.Get("payload[value]"), 10, 64)
		if id == "" || err != nil || v <= 0 {
			t.Fatalf("a malformed meter event: %v", r.Form)
		}
		if c := r.Form.Get("payload[stripe_customer_id]"); c != "cus_meter" || r.Form.Get("event_name") != "geo_payg" {
			t.Fatalf("meter event %s for %s on %s", id, c, r.Form.Get("event_name"))
		}
		if prev, ok := out[id]; ok && prev != v {
			t.Fatalf("identifier %s sent with %d and again with %d", id, prev, v)
		}
		out[id] = v
	}
	return out
}

// waitSum waits until the distinct identifiers at the proxy add up to
// want, failing past it or at the deadline.
func waitSum(t *testing.T, m *stripetest.Mock, want int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var sum int64
		for _, v := range meterEvents(t, m) {
			sum += v
		}
		if sum == want {
			return
		}
		if sum > want {
			t.Fatalf("Stripe got %d, more than the %d used", sum, want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stripe got %d of %d within %s", sum, want, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
