package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/ops"
)

// TestAccessRequests: a request made in the portal waits on the
// requests page; approving is the set-subscription form, prefilled, and
// settles it; declining is audited as the operator and settles it too.
func TestAccessRequests(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	ctx := context.Background()
	if err := e.ops.RequestAccess(ctx, "portal:ann", "ann", "weather", "credits"); err != nil {
		t.Fatal(err)
	}
	w := serve(h, httptest.NewRequest("GET", "/console/requests", nil), "alice")
	body := w.Body.String()
	for _, want := range []string{`href="/console/users/ann"`, `action="/console/users/ann/subscription"`,
		`name="productId" value="credits"`, "Approve: credits, ACTIVE", "Decline"} {
		if w.Code != 200 || !strings.Contains(body, want) {
			t.Errorf("the requests page lacks %q (%d)", want, w.Code)
		}
	}

	c, token := session(t, h, "/console/requests", "alice")
	w = post(h, "/console/users/ann/subscription", url.Values{"csrf": {token}, "form": {"subscription"},
		"serviceId": {"weather"}, "productId": {"credits"}, "status": {"ACTIVE"}}, c, "alice")
	if w.Code != http.StatusSeeOther {
		t.Fatalf("approve: %d %s", w.Code, w.Body)
	}
	if sub, err := e.rt.Store().GetSubscription(ctx, "ann", "weather"); err != nil || sub.ProductID != "credits" || sub.Status != "ACTIVE" {
		t.Errorf("after approving: %+v %v", sub, err)
	}
	if rs, err := e.ops.PendingAccessRequests(ctx, ""); err != nil || len(rs) != 0 {
		t.Errorf("still waiting after approval: %+v %v", rs, err)
	}

	if err := e.ops.RequestAccess(ctx, "portal:bob", "bob", "weather", "credits"); err != nil {
		t.Fatal(err)
	}
	c, token = session(t, h, "/console/requests", "alice")
	decline := url.Values{"csrf": {token}, "userId": {"bob"}, "serviceId": {"weather"}, "productId": {"credits"}}
	w = post(h, "/console/requests/decline", decline, c, "alice")
	if w.Code != http.StatusSeeOther || !strings.HasSuffix(w.Header().Get("Location"), "done=declined") {
		t.Fatalf("decline: %d %s", w.Code, w.Header().Get("Location"))
	}
	if rs, err := e.ops.PendingAccessRequests(ctx, ""); err != nil || len(rs) != 0 {
		t.Errorf("still waiting after decline: %+v %v", rs, err)
	}
	entries, _, err := e.rt.Store().ListAudit(ctx, "", 10)
	if err != nil || len(entries) == 0 || entries[0].Action != ops.AuditAccessDecline || entries[0].Actor != "console:alice" {
		t.Errorf("the decline is not audited as the operator: %+v %v", entries, err)
	}
	if _, err := e.rt.Store().GetSubscription(ctx, "bob", "weather"); err == nil {
		t.Error("a declined request made a subscription")
	}
	w = post(h, "/console/requests/decline", decline, c, "alice")
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "not waiting any more") {
		t.Errorf("a second decline: %d", w.Code)
	}
	w = post(h, "/console/requests/decline", url.Values{"userId": {"bob"}}, c, "alice")
	if w.Code != http.StatusForbidden {
		t.Errorf("a decline with no token: %d", w.Code)
	}
}
