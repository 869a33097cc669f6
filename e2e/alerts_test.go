package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

const alertSecret = "alert-secret-alert-secret-0001"

// alertReceiver is the operator's webhook endpoint: it checks every
// request's signature with its own HMAC code (docs/alerts.md), answers 503
// while down or for the next failNext requests, and keeps what it got.
type alertReceiver struct {
	*httptest.Server
	secret string

	mu       sync.Mutex
	down     bool
	failNext int
	got      []alertDelivery
	// hold, when set, is called with the next request (once) before it
	// is answered: a receiver that takes its time.
	hold func(*http.Request)
}

type alertDelivery struct {
	Header http.Header
	Body   []byte
	Event  map[string]any
	SigOK  bool
	Status int
}

func newAlertReceiver(t *testing.T, secret string) *alertReceiver {
	r := &alertReceiver{secret: secret}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.Close)
	return r
}

func (r *alertReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	m := hmac.New(sha256.New, []byte(r.secret))
	m.Write(body)
	m.Write([]byte(req.Header.Get("X-Platform-Timestamp")))
	want := base64.StdEncoding.EncodeToString(m.Sum(nil))
	d := alertDelivery{Header: req.Header.Clone(), Body: body,
		SigOK: hmac.Equal([]byte(want), []byte(req.Header.Get("X-Platform-Signature")))}
	json.Unmarshal(body, &d.Event)
	r.mu.Lock()
	hold := r.hold
	r.hold = nil
	r.mu.Unlock()
	if hold != nil {
		hold(req)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case req.Method != http.MethodPost || req.URL.Path != "/hook" || !d.SigOK:
		d.Status = http.StatusUnauthorized
	case r.down:
		d.Status = http.StatusServiceUnavailable
	case r.failNext > 0:
		r.failNext--
		d.Status = http.StatusServiceUnavailable
	default:
		d.Status = http.StatusNoContent
	}
	r.got = append(r.got, d)
	w.WriteHeader(d.Status)
}

func (r *alertReceiver) setDown(down bool) {
	r.mu.Lock()
	r.down = down
	r.mu.Unlock()
}

// upHolding brings the receiver up with its next request held by hold.
func (r *alertReceiver) upHolding(hold func(*http.Request)) {
	r.mu.Lock()
	r.down, r.hold = false, hold
	r.mu.Unlock()
}

func (r *alertReceiver) all() []alertDelivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]alertDelivery(nil), r.got...)
}

// accepted returns the events the receiver answered 2xx, by threshold.
func (r *alertReceiver) accepted() map[string][]alertDelivery {
	out := make(map[string][]alertDelivery)
	for _, d := range r.all() {
		if d.Status/100 == 2 {
			th, _ := d.Event["userId"].(string)
			th += " " + fmt.Sprint(d.Event["threshold"])
			out[th] = append(out[th], d)
		}
	}
	return out
}

// alertsCatalog is a service whose products set each kind of threshold;
// the retry schedule is short so that a test waits milliseconds, not
// minutes, for a retry (waits poll a condition; no pass/fail depends on
// timing).
func alertsCatalog(backend, webhook string) string {
	return fmt.Sprintf(`
		alerts {
			webhook %s/hook
			secret %s
			interval 20ms
			retry_initial 20ms
			retry_max 80ms
		}
		service svc {
			backend %s
			secret %s
			endpoint ep
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 10
				alert quota 80%% 100%%
			}
			product pre {
				billing PREPAID
				measurement PER_REQUEST
				price 1
				alert credits_below 5
			}
			product metered {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				price 1
				spending_cap 10
				alert spending_cap 90%%
				currency EUR
			}
			product unnamed {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				price 1
				spending_cap 10
				alert spending_cap 90%%
			}
		}`, webhook, alertSecret, backend, testSecret)
}

// waitFor polls cond until it holds, failing after a generous bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func invokeOK(t *testing.T, key string, n int) {
	t.Helper()
	for range n {
		resp, body := call(t, "POST", invokeURL("svc", "ep"), key, "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("invoke: %d %s", resp.StatusCode, body)
		}
	}
}

func (g *gateway) alerts(user string) []store.Alert {
	g.t.Helper()
	page, err := g.app().Ops().ListAlerts(context.Background(), ops.AlertQuery{UserID: user})
	if err != nil {
		g.t.Fatal(err)
	}
	return page.Alerts
}

// settle makes the gateway evaluate the user's subscription and attempt
// every due delivery now, so a test can state "nothing more is sent"
// without waiting for a timer.
func (g *gateway) settleAlerts(user string) {
	g.t.Helper()
	g.app().EvaluateAlerts(context.Background(), store.AccountRef{UserID: user, ServiceID: "svc"})
	g.app().DeliverDueAlerts(context.Background())
}

// stopGateway unloads the config, which closes the store as a shutdown
// does.
func stopGateway(t *testing.T) {
	t.Helper()
	admin := fmt.Sprintf("localhost:%d", adminPort)
	resp, err := loadClient.Post("http://"+admin+"/load", "application/json",
		strings.NewReader(fmt.Sprintf(`{"admin": {"listen": %q}}`, admin)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("unloading the config: %s", resp.Status)
	}
}

// TestAlertsQuotaThresholdsFireOnce: calls that push a subscription past
// 80% and then 100% of its quota send exactly one signed webhook for each,
// recorded as delivered, with no key or secret in it.
func TestAlertsQuotaThresholdsFireOnce(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	rcv := newAlertReceiver(t, alertSecret)
	g := startGateway(t, t.TempDir(), alertsCatalog(be.URL, rcv.URL))
	key, _ := g.newKey("u1")
	g.subscribe("u1", "svc", "basic", "ACTIVE")

	invokeOK(t, key, 7)
	g.settleAlerts("u1")
	if n := len(rcv.all()); n != 0 {
		t.Fatalf("%d webhooks at 70%% of the quota, want none", n)
	}
	invokeOK(t, key, 1) // 8 of 10: 80%
	waitFor(t, "the 80% webhook", func() bool { return len(rcv.accepted()["u1 quota 80%"]) == 1 })
	invokeOK(t, key, 1) // 90%: nothing new
	invokeOK(t, key, 1) // 100%
	waitFor(t, "the 100% webhook", func() bool { return len(rcv.accepted()["u1 quota 100%"]) == 1 })
	// Past the quota the call is refused, and the state stays past 100%.
	if resp, _ := call(t, "POST", invokeURL("svc", "ep"), key, ""); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("call past the quota: %d", resp.StatusCode)
	}
	g.settleAlerts("u1")
	g.settleAlerts("u1")

	all := rcv.all()
	if len(all) != 2 {
		t.Fatalf("%d webhooks, want exactly 2: %+v", len(all), all)
	}
	for _, d := range all {
		if !d.SigOK || d.Status != http.StatusNoContent {
			t.Fatalf("webhook not verified by the receiver: %+v", d)
		}
		if id := d.Header.Get("X-Platform-Event-ID"); id == "" || id != d.Event["eventId"] {
			t.Fatalf("event id header %q, body eventId %v", id, d.Event["eventId"])
		}
		for _, secret := range []string{key, testSecret, alertSecret, d.Header.Get("X-Platform-Signature")} {
			if strings.Contains(string(d.Body), secret) {
				t.Fatalf("the webhook body carries a key, secret or signature: %s", d.Body)
			}
		}
		if d.Event["type"] != "usage.alert" || d.Event["serviceId"] != "svc" || d.Event["productId"] != "basic" || d.Event["metric"] != "quota" ||
			d.Event["unit"] != "request" || d.Event["currency"] != nil {
			t.Fatalf("webhook body %s", d.Body)
		}
	}
	if v, l := all[0].Event["value"], all[0].Event["limit"]; v != 8.0 || l != 8.0 {
		t.Fatalf("80%% webhook: value %v limit %v, want 8 and 8", v, l)
	}
	if v, l := all[1].Event["value"], all[1].Event["limit"]; v != 10.0 || l != 10.0 {
		t.Fatalf("100%% webhook: value %v limit %v, want 10 and 10", v, l)
	}

	// The receiver answers before the gateway records the delivery.
	waitFor(t, "both deliveries recorded", func() bool {
		recs := g.alerts("u1")
		return len(recs) == 2 && recs[0].Status == store.AlertDelivered && recs[1].Status == store.AlertDelivered
	})
	recs := g.alerts("u1")
	if len(recs) != 2 {
		t.Fatalf("%d alert records, want 2: %+v", len(recs), recs)
	}
	for _, a := range recs {
		if a.Status != store.AlertDelivered || a.Attempts != 1 || a.DeliveredAt.IsZero() || a.LastError != "" {
			t.Fatalf("alert record %+v: want delivered at the first attempt", a)
		}
	}
	// Newest first: 100% fired after 80%.
	if recs[0].Threshold != "quota 100%" || recs[1].Threshold != "quota 80%" {
		t.Fatalf("records %s, %s", recs[0].Threshold, recs[1].Threshold)
	}

	// The admin route lists the same, filtered and paged.
	var page struct {
		Alerts     []store.Alert `json:"alerts"`
		NextCursor string        `json:"nextCursor"`
	}
	admin := fmt.Sprintf("http://localhost:%d/platform/alerts", adminPort)
	adminGet(t, admin+"?userId=u1&status=delivered&limit=1", http.StatusOK, &page)
	if len(page.Alerts) != 1 || page.Alerts[0].ID != recs[0].ID || page.NextCursor == "" {
		t.Fatalf("first page %+v", page)
	}
	cursor := page.NextCursor
	page.Alerts, page.NextCursor = nil, ""
	adminGet(t, admin+"?userId=u1&status=DELIVERED&limit=1&cursor="+cursor, http.StatusOK, &page)
	if len(page.Alerts) != 1 || page.Alerts[0].ID != recs[1].ID {
		t.Fatalf("second page %+v", page)
	}
	var e struct{ Code, Field string }
	adminGet(t, admin+"?status=SENT", http.StatusBadRequest, &e)
	if e.Code != "invalid_request" {
		t.Fatalf("bad status filter: %+v", e)
	}
	adminGet(t, admin+"?cursor=AAAA", http.StatusBadRequest, &e)
	adminGet(t, admin+"?serviceId=", http.StatusBadRequest, &e)
}

// TestAlertsRetriedUntilDelivered: a receiver that fails twice gets the
// same event three times and accepts it once; the record says delivered
// after 3 attempts.
func TestAlertsRetriedUntilDelivered(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	rcv := newAlertReceiver(t, alertSecret)
	rcv.failNext = 2
	g := startGateway(t, t.TempDir(), alertsCatalog(be.URL, rcv.URL))
	key, _ := g.newKey("u2")
	g.subscribe("u2", "svc", "basic", "ACTIVE")
	invokeOK(t, key, 8)
	waitFor(t, "the alert delivered", func() bool {
		recs := g.alerts("u2")
		return len(recs) == 1 && recs[0].Status == store.AlertDelivered
	})
	g.settleAlerts("u2")
	all := rcv.all()
	if len(all) != 3 || all[0].Status != 503 || all[1].Status != 503 || all[2].Status != 204 {
		t.Fatalf("deliveries %+v, want 503, 503, 204", all)
	}
	id := all[0].Event["eventId"]
	for _, d := range all {
		if d.Event["eventId"] != id || string(d.Body) != string(all[0].Body) {
			t.Fatalf("a retry changed the event: %s vs %s", d.Body, all[0].Body)
		}
	}
	rec := g.alerts("u2")[0]
	if rec.Attempts != 3 || rec.ID != id {
		t.Fatalf("record %+v, want 3 attempts of %v", rec, id)
	}
}

// TestAlertsSurviveRestart: an alert fired while the receiver is down is
// delivered after a restart, once; a restart after delivery sends nothing
// again.
func TestAlertsSurviveRestart(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	rcv := newAlertReceiver(t, alertSecret)
	rcv.setDown(true)
	dir := t.TempDir()
	g := startGateway(t, dir, alertsCatalog(be.URL, rcv.URL))
	key, _ := g.newKey("u3")
	g.subscribe("u3", "svc", "basic", "ACTIVE")
	invokeOK(t, key, 8)
	waitFor(t, "a failed attempt", func() bool {
		recs := g.alerts("u3")
		return len(recs) == 1 && recs[0].Attempts >= 1 && recs[0].LastError != ""
	})
	if rec := g.alerts("u3")[0]; rec.Status != store.AlertPending || !strings.Contains(rec.LastError, "503") {
		t.Fatalf("record while the receiver is down: %+v", rec)
	}
	stopGateway(t)

	rcv.setDown(false)
	g = startGateway(t, dir, alertsCatalog(be.URL, rcv.URL))
	waitFor(t, "delivery after the restart", func() bool { return len(rcv.accepted()["u3 quota 80%"]) == 1 })
	waitFor(t, "the delivery recorded", func() bool { return g.alerts("u3")[0].Status == store.AlertDelivered })
	g.settleAlerts("u3")
	if n := len(rcv.accepted()["u3 quota 80%"]); n != 1 {
		t.Fatalf("accepted %d times, want once", n)
	}
	sent := len(rcv.all())
	stopGateway(t)

	g = startGateway(t, dir, alertsCatalog(be.URL, rcv.URL))
	invokeOK(t, key, 1) // the subscription changes again, still past 80%
	g.settleAlerts("u3")
	if n := len(rcv.all()); n != sent {
		t.Fatalf("%d webhooks after a restart past delivery, want %d", n, sent)
	}
	if recs := g.alerts("u3"); len(recs) != 1 || recs[0].Status != store.AlertDelivered {
		t.Fatalf("records after the restart %+v", recs)
	}
}

// TestAlertsCreditsAndSpendingCap: a prepaid balance falling below its
// threshold and a spend reaching 90% of its cap each send one webhook.
func TestAlertsCreditsAndSpendingCap(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	rcv := newAlertReceiver(t, alertSecret)
	g := startGateway(t, t.TempDir(), alertsCatalog(be.URL, rcv.URL))
	preKey, _ := g.newKey("pre-user")
	g.subscribe("pre-user", "svc", "pre", "ACTIVE")
	g.credits("pre-user", "svc", "8")
	capKey, _ := g.newKey("cap-user")
	g.subscribe("cap-user", "svc", "metered", "ACTIVE")

	invokeOK(t, preKey, 3) // 5 left: not below 5
	invokeOK(t, capKey, 8) // spend 8 of 10: under 90%
	g.settleAlerts("pre-user")
	g.settleAlerts("cap-user")
	if n := len(rcv.all()); n != 0 {
		t.Fatalf("%d webhooks before any threshold, want none", n)
	}
	invokeOK(t, preKey, 1) // 4 left
	invokeOK(t, capKey, 1) // spend 9
	waitFor(t, "both webhooks", func() bool {
		a := rcv.accepted()
		return len(a["pre-user credits_below 5"]) == 1 && len(a["cap-user spending_cap 90%"]) == 1
	})
	invokeOK(t, preKey, 1)
	invokeOK(t, capKey, 1)
	waitFor(t, "both deliveries recorded", func() bool {
		a, c := g.alerts("pre-user"), g.alerts("cap-user")
		return len(a) == 1 && a[0].Status == store.AlertDelivered && len(c) == 1 && c[0].Status == store.AlertDelivered
	})
	g.settleAlerts("pre-user")
	g.settleAlerts("cap-user")
	if n := len(rcv.all()); n != 2 {
		t.Fatalf("%d webhooks, want 2", n)
	}
	a := rcv.accepted()
	if d := a["pre-user credits_below 5"][0]; d.Event["value"] != 4.0 || d.Event["limit"] != 5.0 || d.Event["metric"] != "credits_below" {
		t.Fatalf("credits webhook %s", d.Body)
	}
	if d := a["cap-user spending_cap 90%"][0]; d.Event["value"] != 9.0 || d.Event["limit"] != 9.0 {
		t.Fatalf("spending cap webhook %s", d.Body)
	}
	// Money with its currency, credits said to be credits (docs/alerts.md,
	// "The webhook"), and an existing field never moved: the new one
	// comes last, after limit.
	if d := a["cap-user spending_cap 90%"][0]; d.Event["currency"] != "EUR" || d.Event["unit"] != nil ||
		!strings.HasSuffix(string(d.Body), `,"value":9,"limit":9,"currency":"EUR"}`) {
		t.Fatalf("spending cap webhook without its currency: %s", d.Body)
	}
	if d := a["pre-user credits_below 5"][0]; d.Event["unit"] != "credits" || d.Event["currency"] != nil ||
		!strings.HasSuffix(string(d.Body), `,"value":4,"limit":5,"unit":"credits"}`) {
		t.Fatalf("credits webhook not saying credits: %s", d.Body)
	}
	// The record the admin API and the console list carries them too.
	if c := g.alerts("cap-user"); c[0].Currency != "EUR" || c[0].Unit != "" {
		t.Fatalf("spending cap alert record %+v", c[0])
	}
	if p := g.alerts("pre-user"); p[0].Unit != "credits" || p[0].Currency != "" {
		t.Fatalf("credits alert record %+v", p[0])
	}
}

// TestAlertsSpendingCapWithoutCurrency: a product whose listing names no
// currency (a service not public may price in money without one) sends
// its spending cap alert with neither currency nor unit: money, in a
// currency the gateway was not told (docs/alerts.md).
func TestAlertsSpendingCapWithoutCurrency(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	rcv := newAlertReceiver(t, alertSecret)
	g := startGateway(t, t.TempDir(), alertsCatalog(be.URL, rcv.URL))
	key, _ := g.newKey("cap-user")
	g.subscribe("cap-user", "svc", "unnamed", "ACTIVE")
	invokeOK(t, key, 9)
	waitFor(t, "the webhook", func() bool { return len(rcv.accepted()["cap-user spending_cap 90%"]) == 1 })
	d := rcv.accepted()["cap-user spending_cap 90%"][0]
	if d.Event["currency"] != nil || d.Event["unit"] != nil || !strings.HasSuffix(string(d.Body), `,"metric":"spending_cap","value":9,"limit":9}`) {
		t.Fatalf("spending cap webhook of a product without a currency: %s", d.Body)
	}
}

// TestAlertsBadConfigRefused: a config whose thresholds cannot work is
// refused with a clear error, and the running config keeps serving.
func TestAlertsBadConfigRefused(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	rcv := newAlertReceiver(t, alertSecret)
	dir := t.TempDir()
	g := startGateway(t, dir, alertsCatalog(be.URL, rcv.URL))
	key, _ := g.newKey("u5")
	g.subscribe("u5", "svc", "basic", "ACTIVE")
	load := func(platformBlock string) string {
		cfg := fmt.Sprintf("{\n\tadmin localhost:%d\n\tplatform {\n\t\tstore %s/platform.db\n%s\n\t}\n}\n:%d {\n\tbind 127.0.0.1\n\tplatform_gateway\n\treverse_proxy {\n\t\tdynamic platform\n\t\ttransport platform\n\t}\n}\n",
			adminPort, dir, platformBlock, gwPort)
		resp, err := loadClient.Post(fmt.Sprintf("http://localhost:%d/load", adminPort), "text/caddyfile", strings.NewReader(cfg))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("bad config loaded:\n%s", platformBlock)
		}
		return string(body)
	}
	full := alertsCatalog(be.URL, rcv.URL)
	noBlock := full[strings.Index(full, "service svc"):]
	for _, tc := range []struct{ block, want string }{
		{strings.Replace(alertsCatalog(be.URL, rcv.URL), "alert quota 80% 100%", "alert quota 80", 1), "a percentage such as 80%"},
		{strings.Replace(alertsCatalog(be.URL, rcv.URL), "alert credits_below 5", "alert credits_below 5 5", 1), "given twice"},
		{strings.Replace(alertsCatalog(be.URL, rcv.URL), "secret "+alertSecret, "secret short", 1), "secret is shorter than 16 bytes"},
		{strings.Replace(alertsCatalog(be.URL, rcv.URL), "alerts {", "alerts {\n\t\t\tsign_with service", 1), "one or the other"},
		{noBlock, "no alerts { webhook … } block"},
	} {
		if msg := load(tc.block); !strings.Contains(msg, tc.want) {
			t.Errorf("error %s, want one mentioning %q", msg, tc.want)
		}
	}
	// Still the first config: calls are served and metered.
	invokeOK(t, key, 1)
}

func adminGet(t *testing.T, url string, status int, v any) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("GET %s: %d %s, want %d", url, resp.StatusCode, body, status)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
}

// TestAlertsGiveUp: retries are bounded: an alert still undelivered
// give_up_after its firing is marked FAILED and never sent again.
func TestAlertsGiveUp(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	rcv := newAlertReceiver(t, alertSecret)
	rcv.setDown(true)
	cfg := strings.Replace(alertsCatalog(be.URL, rcv.URL), "retry_max 80ms", "retry_max 80ms\n\t\t\tgive_up_after 200ms", 1)
	g := startGateway(t, t.TempDir(), cfg)
	key, _ := g.newKey("u6")
	g.subscribe("u6", "svc", "basic", "ACTIVE")
	invokeOK(t, key, 8)
	waitFor(t, "the alert given up", func() bool {
		recs := g.alerts("u6")
		return len(recs) == 1 && recs[0].Status == store.AlertFailed
	})
	rec := g.alerts("u6")[0]
	if rec.Attempts < 1 || !strings.Contains(rec.LastError, "503") || !rec.NextAttempt.IsZero() || !rec.DeliveredAt.IsZero() {
		t.Fatalf("given-up record %+v", rec)
	}
	sent := len(rcv.all())
	if sent != rec.Attempts {
		t.Fatalf("receiver got %d requests, record says %d attempts", sent, rec.Attempts)
	}
	rcv.setDown(false)
	g.settleAlerts("u6")
	if n := len(rcv.all()); n != sent {
		t.Fatalf("a given-up alert was sent again: %d requests, want %d", n, sent)
	}
}

// TestAlertsReloadSendsOnce: a config reload while an alert is being
// retried runs the old and the new config's delivery loops side by side
// for a moment; the alert is still accepted exactly once, on both stores.
// The retry under way at the reload is held by the receiver until the new
// config serves and the old one is being stopped, and then accepted: the
// old config's attempt must finish (not be cancelled by the reload) and
// record the delivery, and the new config must not send it again
// meanwhile. (Cancelled, the attempt was recorded as interrupted, due at
// once, and the new config's loop sent the alert a second time: accepted
// twice, about one run in twelve before this test held the attempt.)
func TestAlertsReloadSendsOnce(t *testing.T) {
	for _, pg := range []bool{false, true} {
		name := "file"
		if pg {
			name = "postgres"
		}
		t.Run(name, func(t *testing.T) { testAlertsReloadSendsOnce(t, pg) })
	}
}

func testAlertsReloadSendsOnce(t *testing.T, pg bool) {
	be := newTestBackend(t, testSecret, "Platform")
	rcv := newAlertReceiver(t, alertSecret)
	rcv.setDown(true)
	dir := t.TempDir()
	block := alertsCatalog(be.URL, rcv.URL)
	// The same store, another interval: a reload, not a restart.
	reloaded := gatewayConfig(dir, strings.Replace(block, "interval 20ms", "interval 30ms", 1), "", "", "")
	var g *gateway
	if pg {
		dsn := pgtest.DB(t)
		g = startGatewayPostgres(t, dir, dsn, block)
		reloaded = onPostgres(t, reloaded, dir, dsn)
	} else {
		g = startGateway(t, dir, block)
	}
	key, _ := g.newKey("u7")
	g.subscribe("u7", "svc", "basic", "ACTIVE")
	invokeOK(t, key, 8)
	waitFor(t, "a failed attempt", func() bool {
		recs := g.alerts("u7")
		return len(recs) == 1 && recs[0].Attempts >= 1
	})
	old := g.app()

	// The next retry reaches the receiver, which answers it only once the
	// new config serves and the old one's stop has cancelled the request
	// (or, when nothing cancels it, after a while).
	arrived, swapped, answered := make(chan struct{}), make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(swapped) })
	defer release() // a failed test lets the receiver go
	var cancelled atomic.Bool
	rcv.upHolding(func(req *http.Request) {
		defer close(answered)
		close(arrived)
		<-swapped
		select {
		case <-req.Context().Done():
			cancelled.Store(true)
		case <-time.After(2 * time.Second):
		}
	})
	select {
	case <-arrived:
	case <-time.After(15 * time.Second):
		t.Fatal("timed out waiting for the retry")
	}
	loaded := make(chan error, 1)
	go func() {
		resp, err := loadClient.Post(fmt.Sprintf("http://localhost:%d/load", adminPort), "text/caddyfile", strings.NewReader(reloaded))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s %s", resp.Status, b)
			}
		}
		loaded <- err
	}()
	waitFor(t, "the new config serving", func() bool {
		a, err := caddy.ActiveContext().App("platform")
		return err == nil && a != old
	})
	release()
	if err := <-loaded; err != nil {
		t.Fatalf("reload: %v", err)
	}
	<-answered
	if cancelled.Load() {
		t.Error("the reload cancelled the attempt under way at the receiver")
	}
	waitFor(t, "delivery after the reload", func() bool {
		recs := g.alerts("u7")
		return len(recs) == 1 && recs[0].Status == store.AlertDelivered
	})
	g.settleAlerts("u7")
	if n := len(rcv.accepted()["u7 quota 80%"]); n != 1 {
		t.Fatalf("accepted %d times across a reload, want once", n)
	}
	if recs := g.alerts("u7"); recs[0].Attempts != len(rcv.all()) {
		t.Fatalf("record %+v after %d requests: the attempts are not the requests made", recs[0], len(rcv.all()))
	}
	invokeOK(t, key, 1) // the new config's evaluator sees the old threshold as fired
	g.settleAlerts("u7")
	if recs := g.alerts("u7"); len(recs) != 1 {
		t.Fatalf("records %+v", recs)
	}
}

// TestAlertsStopWaitsForAttempt: a stop while an attempt is under way
// lets it finish rather than cancelling it, but no longer than its
// timeout: a receiver that never answers holds the stop for the attempt's
// timeout at most. The attempt is recorded as what it was (timed out, to
// be retried), and the next start delivers the alert once.
func TestAlertsStopWaitsForAttempt(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	rcv := newAlertReceiver(t, alertSecret)
	dir := t.TempDir()
	const timeout = time.Second
	block := strings.Replace(alertsCatalog(be.URL, rcv.URL), "interval 20ms", "interval 20ms\n\t\t\ttimeout 1s", 1)
	arrived := make(chan struct{})
	rcv.upHolding(func(req *http.Request) {
		close(arrived)
		<-req.Context().Done() // never answered: the gateway gives up
		rcv.setDown(true)      // (and what it would have got is not an acceptance)
	})
	g := startGateway(t, dir, block)
	key, _ := g.newKey("u8")
	g.subscribe("u8", "svc", "basic", "ACTIVE")
	invokeOK(t, key, 8)
	select {
	case <-arrived:
	case <-time.After(15 * time.Second):
		t.Fatal("timed out waiting for the attempt")
	}
	began := time.Now()
	stopGateway(t)
	if took := time.Since(began); took > timeout+4*time.Second {
		t.Fatalf("the stop took %s with an attempt under way, want about its timeout (%s) at most", took, timeout)
	}

	rcv.setDown(false)
	// What the stop recorded, read before the next start sends anything.
	st, err := boltstore.Open(filepath.Join(dir, "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := st.ListAlerts(context.Background(), store.AlertFilter{UserID: "u8"}, "", 10)
	st.Close()
	if err != nil || len(recs) != 1 {
		t.Fatalf("alerts after the stop: %+v, %v", recs, err)
	}
	if rec := recs[0]; rec.Status != store.AlertPending || rec.Attempts != 1 || !strings.Contains(rec.LastError, "deadline exceeded") {
		t.Fatalf("record after a stop mid-attempt %+v, want pending after 1 attempt that timed out", rec)
	}
	g = startGateway(t, dir, block)
	waitFor(t, "the delivery after the next start", func() bool { return g.alerts("u8")[0].Status == store.AlertDelivered })
	g.settleAlerts("u8")
	if recs := g.alerts("u8"); recs[0].Attempts != 2 {
		t.Fatalf("record after the next start %+v, want delivered at the second attempt", recs[0])
	}
	if n := len(rcv.accepted()["u8 quota 80%"]); n != 1 {
		t.Fatalf("accepted %d times, want once", n)
	}
}

// TestAlertsCrossingAtPeriodEnd: a threshold reached in the last moment of
// a period and evaluated just after it ends (the evaluator runs every
// interval, after the commit) still fires, for the period it was reached
// in; the new period starts with nothing fired.
func TestAlertsCrossingAtPeriodEnd(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	rcv := newAlertReceiver(t, alertSecret)
	// The loop leaves the evaluation to the test (settleAlerts).
	g := startGateway(t, t.TempDir(), strings.Replace(alertsCatalog(be.URL, rcv.URL), "interval 20ms", "interval 1h", 1))
	key, _ := g.newKey("u-end")
	g.subscribe("u-end", "svc", "basic", "ACTIVE")
	sub, err := g.store().GetSubscription(context.Background(), "u-end", "svc")
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := g.app().Catalog().Service("svc")
	p, _ := svc.Product("basic")
	start, end := billing.PeriodBounds(p.Period, p.CalendarPeriods, sub.StartedAt, sub.StartedAt)
	var now atomic.Pointer[time.Time]
	at := func(t time.Time) { now.Store(&t) }
	g.app().SetClock(func() time.Time { return *now.Load() })
	defer g.app().SetClock(nil)

	at(end.Add(-500 * time.Millisecond))
	invokeOK(t, key, 8) // 8 of 10 in the period's last second
	at(end.Add(500 * time.Millisecond))
	g.settleAlerts("u-end")
	recs := g.alerts("u-end")
	if len(recs) != 1 || recs[0].Threshold != "quota 80%" || !recs[0].PeriodStart.Equal(start) || recs[0].Value != billing.Whole(8) {
		t.Fatalf("alerts after a crossing at the period's end %+v, want quota 80%% of the period from %s at 8", recs, start)
	}
	waitFor(t, "the webhook", func() bool { return len(rcv.accepted()["u-end quota 80%"]) == 1 })

	// A plan changed at the period's end: the old plan's usage of the
	// period is not read against the new plan's thresholds (8 calls on
	// metered, no quota, are not 80% of basic's quota of 10).
	moverKey, _ := g.newKey("u-mover")
	if _, err := g.store().PutSubscription(context.Background(), store.Subscription{UserID: "u-mover", ServiceID: "svc",
		ProductID: "metered", Status: "ACTIVE", UpdatedAt: start}); err != nil { // the same periods as u-end
		t.Fatal(err)
	}
	at(end.Add(-500 * time.Millisecond))
	invokeOK(t, moverKey, 8)
	at(end.Add(100 * time.Millisecond))
	if _, err := g.store().PutSubscription(context.Background(), store.Subscription{UserID: "u-mover", ServiceID: "svc",
		ProductID: "basic", Status: "ACTIVE", UpdatedAt: end.Add(100 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	at(end.Add(500 * time.Millisecond))
	g.settleAlerts("u-mover")
	if recs := g.alerts("u-mover"); len(recs) != 0 {
		t.Fatalf("alerts of a plan changed at the period's end: %+v, want none", recs)
	}

	// The new period: nothing used, nothing fired; a crossing fires anew.
	invokeOK(t, key, 7)
	g.settleAlerts("u-end")
	if recs := g.alerts("u-end"); len(recs) != 1 {
		t.Fatalf("alerts at 70%% of the new period: %+v", recs)
	}
	invokeOK(t, key, 1)
	g.settleAlerts("u-end")
	if recs := g.alerts("u-end"); len(recs) != 2 || !recs[0].PeriodStart.Equal(end) {
		t.Fatalf("alerts at 80%% of the new period: %+v, want a second for the period from %s", recs, end)
	}
}
