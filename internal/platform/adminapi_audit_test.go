package platform

import (
	"strings"
	"testing"
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
	var key KeyView
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
