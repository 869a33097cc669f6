package platform

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/ops"
)

// Every change made through the admin API is in the audit log, newest
// first, with the caller and what changed; a refused change adds nothing,
// and no key is ever in it.
func TestAdminAuditLog(t *testing.T) {
	admStart(t)
	var audit auditPage
	admJSON(t, "GET", "/platform/audit", "").decode(t, &audit)
	if len(audit.Entries) != 0 {
		t.Fatalf("fresh store has audit entries: %+v", audit.Entries)
	}
	var key ops.KeyView
	r := admJSON(t, "POST", "/platform/keys", `{"userId": "alice"}`)
	r.decode(t, &key)
	if r.status != 201 || key.Key == "" {
		t.Fatalf("create key: %d %s", r.status, r.body)
	}
	if r := admJSON(t, "PUT", "/platform/subscriptions/alice/weather", `{"productId": "basic"}`); r.status != 200 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}
	if r := admJSON(t, "POST", "/platform/subscriptions/alice/weather/credits", `{"amount": 2.5}`); r.status != 200 {
		t.Fatalf("credits: %d %s", r.status, r.body)
	}
	if r := admJSON(t, "DELETE", "/platform/keys/"+key.ID, ""); r.status != 200 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	// Refused changes: not audited.
	admExpectError(t, admJSON(t, "POST", "/platform/subscriptions/alice/weather/credits", `{"amount": 0}`), 400, "invalid_request", "amount")
	admExpectError(t, admJSON(t, "PUT", "/platform/subscriptions/alice/weather", `{"productId": "nope"}`), 400, "invalid_request", "productId")
	admExpectError(t, admJSON(t, "DELETE", "/platform/keys/no-such-key", ""), 404, "not_found", "")

	r = admJSON(t, "GET", "/platform/audit", "")
	if strings.Contains(string(r.body), key.Key) {
		t.Fatal("the audit log holds the key")
	}
	r.decode(t, &audit)
	var actions []string
	for _, e := range audit.Entries {
		actions = append(actions, e.Action)
		if !strings.HasPrefix(e.Actor, "admin-api 127.0.0.1:") || e.Time.IsZero() || e.UserID != "alice" {
			t.Errorf("entry %+v: want actor admin-api <addr>, a time and user alice", e)
		}
	}
	if got := strings.Join(actions, " "); got != "key.revoke credits.add subscription.put key.create" {
		t.Fatalf("audit actions %q", got)
	}
	if e := audit.Entries[1]; e.ServiceID != "weather" || e.Detail != "amount 2.5, balance 2.5" {
		t.Errorf("credits entry %+v", e)
	}
	if audit.Entries[0].KeyID != key.ID || audit.Entries[3].KeyID != key.ID {
		t.Errorf("key entries do not name key %s: %+v", key.ID, audit.Entries)
	}

	// Paging: one at a time, the cursor leads to the older entries.
	var page auditPage
	admJSON(t, "GET", "/platform/audit?limit=3", "").decode(t, &page)
	if len(page.Entries) != 3 || page.NextCursor == "" {
		t.Fatalf("first page %+v", page)
	}
	var page2 auditPage
	admJSON(t, "GET", "/platform/audit?limit=3&cursor="+page.NextCursor, "").decode(t, &page2)
	if len(page2.Entries) != 1 || page2.Entries[0].Action != "key.create" || page2.NextCursor != "" {
		t.Fatalf("second page %+v", page2)
	}
	admExpectError(t, admJSON(t, "GET", "/platform/audit?cursor=zz", ""), 400, "invalid_request", "cursor")
	admExpectError(t, admJSON(t, "GET", "/platform/audit?user=alice", ""), 400, "invalid_request", "user")
}

// A prune of the usage ledger removes billing data: it is audited with
// the caller and the cutoff, as any other change of billing data; a
// refused prune adds nothing.
func TestAdminAuditUsagePrune(t *testing.T) {
	admStart(t)
	admExpectError(t, admJSON(t, "POST", "/platform/usage/prune?before=tomorrow", ""), 400, "invalid_request", "before")
	admExpectError(t, admJSON(t, "POST", "/platform/usage/prune", ""), 400, "invalid_request", "before")
	if r := admJSON(t, "POST", "/platform/usage/prune?before=2026-01-01", ""); r.status != 200 {
		t.Fatalf("prune: %d %s", r.status, r.body)
	}
	var audit auditPage
	admJSON(t, "GET", "/platform/audit", "").decode(t, &audit)
	if len(audit.Entries) != 1 {
		t.Fatalf("audit entries %+v, want the one prune", audit.Entries)
	}
	e := audit.Entries[0]
	if e.Action != ops.AuditUsagePrune || !strings.HasPrefix(e.Actor, "admin-api 127.0.0.1:") || e.Time.IsZero() ||
		e.Detail != "raw ledger rows before 2026-01-01T00:00:00Z: 0 segments, 0 rows, 0 bytes removed" {
		t.Fatalf("prune entry %+v", e)
	}
}

// configAudit is the detail of each config.change entry, oldest first.
func configAudit(t *testing.T) []string {
	t.Helper()
	var audit auditPage
	admJSON(t, "GET", "/platform/audit?limit=1000", "").decode(t, &audit)
	var out []string
	for i := len(audit.Entries) - 1; i >= 0; i-- {
		e := audit.Entries[i]
		if e.Action == ops.AuditConfigChange {
			if e.Actor != "config" || e.Time.IsZero() {
				t.Errorf("config entry %+v", e)
			}
			out = append(out, e.Detail)
		}
	}
	return out
}

// A change of where alerts go or of a retention, made through Caddy's
// /config API (or a reload, or a restart with an edited config), is in
// the audit log before the config serves: the setting and its new value,
// never the alert secret nor the webhook's query. A config that changes
// none of them, a restart with the same settings, and `caddy validate`
// add nothing.
func TestConfigChangesAudited(t *testing.T) {
	env := &admEnv{t: t}
	dir := t.TempDir()
	const secret1, secret2 = "first-alert-secret-0123456789", "second-alert-secret-987654321"
	withSettings := func(settings string) string {
		c := env.config(dir, "")
		if settings == "" {
			return c
		}
		return strings.Replace(c, `"store": `, settings+`, "store": `, 1)
	}
	alertsTo := func(hook, secret string) string {
		return fmt.Sprintf(`"alerts": {"webhook": %q, "secret": %q}`, hook, secret)
	}
	tester := admTester(t)
	tester.InitServer(withSettings(""), "json")
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(env.stop)
	if got := configAudit(t); len(got) != 0 {
		t.Fatalf("defaults recorded as changes: %q", got)
	}

	// The attack's change: the webhook set through /config.
	load := func(config string) {
		t.Helper()
		if status, body := admLoad(t, config); status != 200 {
			t.Fatalf("load: %d %s", status, body)
		}
	}
	load(withSettings(alertsTo("https://hooks.example.com/platform?token=abc123", secret1) + `, "ledger_retention": "720h"`))
	want := []string{
		"alerts webhook: https://hooks.example.com/… (path and query not recorded: fingerprint 8191045a)",
		"alerts signing: the alerts block's secret",
		"ledger_retention: 720h0m0s",
	}
	if got := configAudit(t); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("after setting alerts and ledger_retention: %q, want %q", got, want)
	}
	// Only the webhook moves (and the secret, which is never recorded).
	req, _ := http.NewRequest("PATCH", "http://"+admAddr+"/config/apps/platform/alerts", strings.NewReader(
		fmt.Sprintf(`{"webhook": "https://evil.example.net/collect", "secret": %q}`, secret2)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PATCH /config/apps/platform/alerts: %d", resp.StatusCode)
	}
	want = append(want, "alerts webhook: https://evil.example.net/… (path and query not recorded: fingerprint f7b8ad85)")
	if got := configAudit(t); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("after the /config change: %q, want %q", got, want)
	}
	// The same settings again: nothing new. Nor after a stop and a start
	// (the last recorded values are read back from the log).
	current := withSettings(`"alerts": {"webhook": "https://evil.example.net/collect", "secret": "` + secret2 + `"}, "ledger_retention": "720h"`)
	load(current)
	env.stop()
	load(current)
	if got := configAudit(t); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("after reloads without changes: %q, want %q", got, want)
	}
	// A restart without the alerts block and with another retention.
	env.stop()
	load(withSettings(`"ledger_retention": "48h", "rollup_retention": "2160h"`))
	want = append(want,
		"alerts webhook: none (no alerts block)",
		"alerts signing: none (no alerts block)",
		"ledger_retention: 48h0m0s",
		"rollup_retention: 2160h0m0s")
	if got := configAudit(t); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("after the restart with other settings: %q, want %q", got, want)
	}
	r := admJSON(t, "GET", "/platform/audit?limit=1000", "")
	for _, s := range []string{secret1, secret2, "abc123", "token"} {
		if strings.Contains(string(r.body), s) {
			t.Errorf("the audit log holds %q", s)
		}
	}
	if log, err := os.ReadFile(env.logPath); err != nil || strings.Contains(string(log), secret1) || strings.Contains(string(log), secret2) || strings.Contains(string(log), "abc123") {
		t.Errorf("the server log holds a secret (%v)", err)
	}
}
