package platform

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/platformgw/gateway/internal/alerts"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// TestAlertsCaddyfileErrors: every mistake in an `alert` line or the
// `alerts` block is refused at adapt time, on its line.
func TestAlertsCaddyfileErrors(t *testing.T) {
	const svc = "\t\tbackend http://127.0.0.1:9000\n\t\tsecret {env.S}\n\t\tendpoint e\n"
	const quota = "\t\tproduct p {\n\t\t\tbilling SUBSCRIPTION\n\t\t\tmeasurement PER_REQUEST\n\t\t\tquota 100\n"
	const hook = "\talerts {\n\t\twebhook https://hooks.example.com/a\n\t\tsecret {env.A}\n\t}\n"
	for _, tc := range []struct {
		name  string
		block string
		want  []string
		line  int
	}{
		{"percent without %", "platform {\n" + hook + "\tservice s {\n" + svc + quota + "\t\t\talert quota 80\n\t\t}\n\t}\n}", []string{"alert quota '80'", "a percentage such as 80%"}, 15},
		{"zero percent", "platform {\n" + hook + "\tservice s {\n" + svc + quota + "\t\t\talert quota 0%\n\t\t}\n\t}\n}", []string{"above 0%"}, 15},
		{"unknown metric", "platform {\n" + hook + "\tservice s {\n" + svc + quota + "\t\t\talert calls 10\n\t\t}\n\t}\n}", []string{"alert metric 'calls'", "quota, credits_below, spending_cap"}, 15},
		{"no level", "platform {\n" + hook + "\tservice s {\n" + svc + quota + "\t\t\talert quota\n\t\t}\n\t}\n}", []string{"alert: missing argument"}, 15},
		{"no spending cap", "platform {\n" + hook + "\tservice s {\n" + svc + quota + "\t\t\talert spending_cap 90%\n\t\t}\n\t}\n}", []string{"product p has no spending cap"}, 15},
		{"credits on a subscription", "platform {\n" + hook + "\tservice s {\n" + svc + quota + "\t\t\talert credits_below 5\n\t\t}\n\t}\n}", []string{"only PREPAID products have credits"}, 15},
		{"quota without quota", "platform {\n" + hook + "\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tbilling PREPAID\n\t\t\tmeasurement PER_REQUEST\n\t\t\talert quota 80%\n\t\t}\n\t}\n}", []string{"product p has no quota"}, 14},
		{"threshold twice", "platform {\n" + hook + "\tservice s {\n" + svc + quota + "\t\t\talert quota 80% 100%\n\t\t\talert quota 80%\n\t\t}\n\t}\n}", []string{"alert quota 80% given twice", "first on line 15"}, 16},
		{"alerts without webhook", "platform {\n\talerts {\n\t\tsecret {env.A}\n\t}\n}", []string{"alerts: no webhook URL"}, 3},
		{"alerts without secret", "platform {\n\talerts {\n\t\twebhook https://h.example/a\n\t}\n}", []string{"no secret to sign the webhooks with"}, 3},
		{"secret and sign_with service", "platform {\n\talerts {\n\t\twebhook https://h.example/a\n\t\tsecret x\n\t\tsign_with service\n\t}\n}", []string{"one or the other"}, 3},
		{"bad webhook", "platform {\n\talerts {\n\t\twebhook ftp://h.example/a\n\t}\n}", []string{"webhook 'ftp://h.example/…'"}, 4},
		{"webhook with credentials", "platform {\n\talerts {\n\t\twebhook https://u:p@h.example/a\n\t}\n}", []string{"no credentials"}, 4},
		{"bad sign_with", "platform {\n\talerts {\n\t\tsign_with owner\n\t}\n}", []string{"sign_with 'owner' is not one of secret, service"}, 4},
		{"unknown in alerts", "platform {\n\talerts {\n\t\turl https://h.example\n\t}\n}", []string{"unrecognized subdirective 'url' in alerts"}, 4},
		{"duplicate in alerts", "platform {\n\talerts {\n\t\twebhook https://h.example/a\n\t\twebhook https://h.example/b\n\t}\n}", []string{"duplicate subdirective 'webhook' in alerts"}, 5},
		{"bad duration", "platform {\n\talerts {\n\t\tretry_initial soon\n\t}\n}", []string{"retry_initial 'soon' is not a duration"}, 4},
		{"initial past max", "platform {\n\talerts {\n\t\twebhook https://h.example/a\n\t\tsecret {env.A}\n\t\tretry_initial 2h\n\t\tretry_max 1h\n\t}\n}", []string{"retry_initial 2h0m0s is longer than retry_max 1h0m0s"}, 3},
		{"alerts argument", "platform {\n\talerts x {\n\t}\n}", []string{"'alerts' takes no arguments"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(platformConfig(tc.block)), nil)
			if err == nil {
				t.Fatalf("no error for\n%s", tc.block)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error does not mention %q: %s", w, msg)
				}
			}
			if at := fmt.Sprintf("Caddyfile:%d", tc.line); !strings.HasSuffix(msg, at) {
				t.Errorf("error does not point at %s: %s", at, msg)
			}
		})
	}
}

// TestAlertsCatalogRefuses: the JSON config is checked as the Caddyfile is.
func TestAlertsCatalogRefuses(t *testing.T) {
	q := billing.Whole(100)
	svc := func(pa ...*catalog.ProductAlerts) []*catalog.Service {
		return []*catalog.Service{{ID: "s", Backend: "http://127.0.0.1:1", Secrets: []string{"0123456789abcdef0123"},
			Endpoints: []*catalog.Endpoint{{ID: "e"}},
			Products:  []*billing.Product{{ID: "p", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &q}},
			Alerts:    pa}}
	}
	eighty := alerts.Threshold{Metric: alerts.MetricQuota, Percent: billing.Whole(80)}
	for _, tc := range []struct {
		alerts []*catalog.ProductAlerts
		want   string
	}{
		{[]*catalog.ProductAlerts{{Product: "nope", Thresholds: []alerts.Threshold{eighty}}}, `alerts for product "nope", which the service does not have`},
		{[]*catalog.ProductAlerts{{Product: "p", Thresholds: []alerts.Threshold{eighty}}, {Product: "p"}}, "alerts for product p given twice"},
		{[]*catalog.ProductAlerts{{Product: "p", Thresholds: []alerts.Threshold{{Metric: "quota"}}}}, "above 0%"},
		{[]*catalog.ProductAlerts{{Product: "p", Thresholds: []alerts.Threshold{{Metric: "quota", Percent: billing.Whole(5), Credits: 1}}}}, "takes a percentage, not credits"},
	} {
		_, err := catalog.Compile(svc(tc.alerts...), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Compile: %v, want an error containing %q", err, tc.want)
		}
	}
	c, err := catalog.Compile(svc(&catalog.ProductAlerts{Product: "p", Thresholds: []alerts.Threshold{eighty}}), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Service("s")
	if got := s.AlertThresholds("p"); len(got) != 1 || got[0].String() != "quota 80%" || !c.HasAlerts() {
		t.Fatalf("thresholds %v", got)
	}
}

// TestCLIAlerts: `caddy platform alerts` lists the recorded alerts through
// the admin API, filtered, following pages to the end.
func TestCLIAlerts(t *testing.T) {
	env := admStart(t)
	ds := env.app.DataStore()
	now := time.Now().UTC()
	for i, user := range []string{"ann", "bob", "ann"} {
		a, err := ds.CreateAlert(context.Background(), store.Alert{UserID: user, ServiceID: "weather", ProductID: "pro",
			PeriodStart: now.Add(-time.Hour), Threshold: fmt.Sprintf("quota %d%%", 80+10*i), Value: billing.Whole(int64(800 + 100*i)),
			Limit: billing.Whole(int64(800 + 100*i)), Created: now})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			a.Attempts, a.Status, a.DeliveredAt = 1, store.AlertDelivered, now
			if _, err := ds.UpdateAlert(context.Background(), a, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := cliMust(t, "alerts", "--limit", "1")
	if !strings.HasPrefix(out, "ALERT") || strings.Count(out, "\n") != 4 || !strings.Contains(out, "quota 100%") {
		t.Errorf("alerts printed:\n%s", out)
	}
	out = cliMust(t, "alerts", "--user", "ann", "--status", "pending")
	if strings.Count(out, "\n") != 2 || !strings.Contains(out, "alt_3") || !strings.Contains(out, "PENDING") {
		t.Errorf("alerts --user ann --status pending printed:\n%s", out)
	}
	out = cliMust(t, "alerts", "--status", "DELIVERED", "--json")
	var page ops.AlertPage
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Alerts) != 1 || page.Alerts[0].ID != "alt_1" {
		t.Errorf("alerts --json printed %s (%v)", out, err)
	}
	if _, err := cliRun(t, "alerts", "--status", "SENT"); err == nil || !strings.Contains(err.Error(), "status must be one of PENDING, DELIVERED, FAILED") {
		t.Errorf("a bad status: %v", err)
	}
}

// TestCLIAlertsNameWhatValueCounts: the VALUE column of `caddy platform
// alerts` writes a spending cap's spend with its currency and credits as
// credits, as the alert records them (docs/alerts.md). It wrote them bare
// ("45.5"): money without its currency, credits not told from money.
func TestCLIAlertsNameWhatValueCounts(t *testing.T) {
	env := admStart(t)
	ds := env.app.DataStore()
	now := time.Now().UTC()
	for _, a := range []store.Alert{
		{UserID: "ann", Threshold: "spending_cap 90%", Value: billing.Whole(91) / 2, Limit: billing.Whole(45), Currency: "EUR"},
		{UserID: "bob", Threshold: "credits_below 10", Value: billing.Whole(7), Limit: billing.Whole(10), Unit: "credits"},
		{UserID: "cat", Threshold: "quota 80%", Value: billing.Whole(800), Limit: billing.Whole(800), Unit: "request"},
		{UserID: "dan", Threshold: "spending_cap 80%", Value: billing.Whole(8), Limit: billing.Whole(8)},
	} {
		a.ServiceID, a.ProductID, a.PeriodStart, a.Created = "weather", "pro", now.Add(-time.Hour), now
		if _, err := ds.CreateAlert(context.Background(), a); err != nil {
			t.Fatal(err)
		}
	}
	out := cliMust(t, "alerts")
	for _, want := range []string{"spending_cap 90%  45.5 EUR ", "credits_below 10  7 credits ", "quota 80%         800 request ",
		"spending_cap 80%  8 (currency not named) "} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}

// TestAlertsStoppedRoundEvaluatedAgain: a subscription whose evaluation a
// stop cut short (a reload stops the old config's loop, which takes the
// changed subscriptions and then reads them under a cancelled context) is
// evaluated by the next round. It was dropped: the balance below its
// credits_below threshold, refused every call after, was never alerted.
func TestAlertsStoppedRoundEvaluatedAgain(t *testing.T) {
	env := &admEnv{t: t}
	config := env.config(t.TempDir(), "")
	config = strings.Replace(config, `"store":`, `"alerts": {"webhook": "http://127.0.0.1:1/hook",
		"secret": "0123456789abcdef0123456789abcdef", "interval": "1h"}, "store":`, 1)
	config = strings.Replace(config, `"endpoints": [{"id": "forecast"}],`, `"endpoints": [{"id": "forecast"}],
		"alerts": [{"product": "basic", "thresholds": [{"metric": "credits_below", "credits": 5}]}],`, 1)
	admTester(t).InitServer(config, "json")
	if t.Failed() {
		t.FailNow()
	}
	env.app = admActiveApp(t)
	t.Cleanup(env.stop)
	ds := env.app.DataStore()
	now := time.Now().UTC()
	if _, err := ds.PutSubscription(context.Background(), store.Subscription{UserID: "ann", ServiceID: "weather",
		ProductID: "basic", Status: "ACTIVE", StartedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := ds.AddCredits(context.Background(), "ann", "weather", billing.Whole(3), now); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	close(stopped)
	// The round a reload stops: its context is over before it reads.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	env.app.evaluateAlerts(cancelled, stopped)
	// The next round, the new config's.
	env.app.evaluateAlerts(context.Background(), stopped)
	got, _, err := ds.ListAlerts(context.Background(), store.AlertFilter{UserID: "ann"}, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Threshold != "credits_below 5" {
		t.Fatalf("alerts after the stopped round and the next: %+v, want credits_below 5", got)
	}
}
