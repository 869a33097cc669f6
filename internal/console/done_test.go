package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestConsoleDoneNoticeByCode: the line a user's page shows after a change
// is chosen by a fixed code; text put in ?done= by whoever wrote a link is
// never rendered, and an unknown code shows no notice at all. Each change
// redirects with its code, and the page after it says what was done.
func TestConsoleDoneNoticeByCode(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	const phish = "Your session expired: call +1 555 0100 to restore access"
	for _, done := range []string{phish, "Key k-1 revoked.", "REVOKED", "revoked ", "constructor", "__proto__", "credits<script>"} {
		w := serve(h, httptest.NewRequest("GET", "/console/users/alice?new=1&done="+url.QueryEscape(done), nil), testOperator)
		if w.Code != http.StatusOK {
			t.Fatalf("?done=%q: %d", done, w.Code)
		}
		body := w.Body.String()
		if strings.Contains(body, `class="done"`) || strings.Contains(body, "call +1 555") || strings.Contains(body, "k-1") {
			t.Errorf("?done=%q is shown:\n%s", done, body)
		}
	}

	// Each change, from its form, redirects with its code; the page shows
	// the code's message.
	_, key := createKeyFor(t, e, "alice")
	c, tok := session(t, h, "/console/users/alice", testOperator)
	for _, tc := range []struct {
		path, code, notice string
		form               url.Values
	}{
		{"subscription", "subscription", "The subscription was set.", url.Values{"serviceId": {"weather"}, "productId": {"credits"}, "status": {"ACTIVE"}}},
		{"credits", "credits", "The credits were added.", url.Values{"serviceId": {"weather"}, "amount": {"3"}}},
		{"revoke", "revoked", "The key was revoked.", url.Values{"keyId": {key.ID}, "confirm": {"yes"}}},
	} {
		tc.form.Set("csrf", tok)
		w := post(h, "/console/users/alice/"+tc.path, tc.form, c, testOperator)
		loc, _ := url.Parse(w.Header().Get("Location"))
		if w.Code != http.StatusSeeOther || loc == nil || loc.Path != "/console/users/alice" || loc.RawQuery != "done="+tc.code {
			t.Fatalf("POST %s: %d to %q", tc.path, w.Code, w.Header().Get("Location"))
		}
		page := serve(h, httptest.NewRequest("GET", loc.String(), nil), testOperator).Body.String()
		if !strings.Contains(page, `<p class="done" role="status">`+tc.notice+`</p>`) {
			t.Errorf("after %s the page does not say %q:\n%s", tc.path, tc.notice, page)
		}
	}
	sub, err := e.rt.Store().GetSubscription(context.Background(), "alice", "weather")
	if err != nil || sub.Credits.String() != "3" || sub.ProductID != "credits" {
		t.Fatalf("the changes were not made: %+v %v", sub, err)
	}
}
