package console

import (
	"context"
	"encoding/base64"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/platformgw/gateway/internal/browsertest"
	"github.com/platformgw/gateway/internal/store"
)

// text reads the text of the first element matching sel.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval runs a script in the page and returns its result.
func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAsValue, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("eval %s: %v", js, err)
	}
	return v
}

// invoke calls the weather service through the gateway with key.
func invoke(t *testing.T, e *env, key string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", e.base+"/api/service/weather/endpoint/hello/invoke", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// The operator's whole flow in a real browser: sign in through
// basic_auth, create a key (shown once), subscribe the user, a call
// through the real gateway to a backend that checks its signature, the
// usage chart and ledger show it, revoking the key stops it, the audit
// log lists the three changes; CSRF attempts from the page fail and change
// nothing; without credentials the console is 401 (basic_auth) or 403 (no
// authentication configured). With SCREENSHOTS_DIR set it saves the
// screenshot of a new key shown once (make screenshots).
func TestConsoleInBrowser(t *testing.T) {
	ctx := browsertest.New(t, 2*time.Minute)
	e := start(t)

	for path, want := range map[string]int{"/console/": 401, "/console/users": 401, "/open-console/": 403} {
		resp, err := http.Get(e.base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s without credentials: %d, want %d", path, resp.StatusCode, want)
		}
	}

	browsertest.SetHeaders(t, ctx, map[string]string{
		"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(testOperator+":"+testPassword)),
	})
	console := e.base + "/console"

	// Find the user by id from the users page: nobody yet, so the page
	// says so and offers to create them.
	do(t, ctx, "find user", chromedp.Navigate(console+"/users"),
		chromedp.SendKeys(chromedp.CSS("#find-user-q"), "alice"),
		chromedp.Submit(chromedp.CSS("#find-user-q")),
		chromedp.WaitVisible(chromedp.CSS("#no-user")))
	do(t, ctx, "create user", chromedp.Click(chromedp.CSS("#start-user")),
		chromedp.WaitVisible(chromedp.CSS("#create-key")))
	if who := text(t, ctx, ".who"); who != "Signed in as operator" {
		t.Fatalf("header says %q", who)
	}

	// Create a key: shown once, with a copy button.
	once := eval[string](t, ctx, `document.querySelector("#create-key input[name=once]").value`)
	do(t, ctx, "create key",
		chromedp.SendKeys(chromedp.CSS("#key-label"), "browser test"),
		chromedp.Click(chromedp.CSS("#create-key button")),
		chromedp.WaitVisible(chromedp.CSS("#new-key")))
	key := text(t, ctx, "#new-key")
	if len(key) < 20 {
		t.Fatalf("new key %q", key)
	}
	browsertest.Screenshot(t, ctx, "console-user-new-key")

	// The same form sent again (a reload of that answer, a second click):
	// its one-time value was taken, so no second key is made and the page
	// says the change was made already, with where to see it.
	do(t, ctx, "user page", chromedp.Navigate(console+"/users/alice"), chromedp.WaitVisible(chromedp.CSS("#create-key")))
	eval[bool](t, ctx, `(() => {
		const f = document.querySelector("#create-key");
		f.querySelector("input[name=once]").value = `+strconv.Quote(once)+`;
		f.querySelector("#key-label").value = "browser test";
		f.submit();
		return true;
	})()`)
	do(t, ctx, "the form sent again", chromedp.WaitVisible(chromedp.CSS("#notice")))
	if msg := text(t, ctx, "#notice"); !strings.Contains(msg, "This change was already made") || !strings.Contains(msg, "revoke that key") {
		t.Errorf("the form sent again answered %q", msg)
	}
	browsertest.Screenshot(t, ctx, "console-form-already-made")
	do(t, ctx, "the user's keys", chromedp.Click(chromedp.CSS("#notice-links a")), chromedp.WaitVisible(chromedp.CSS("#keys")))
	if n := eval[int](t, ctx, `document.querySelectorAll("#keys .status-active").length`); n != 1 {
		t.Fatalf("%d active keys after the form was sent twice, want 1", n)
	}

	// Subscribe alice to weather/basic.
	do(t, ctx, "subscribe",
		chromedp.SetValue(chromedp.CSS("#sub-service"), "weather"),
		chromedp.SetValue(chromedp.CSS("#sub-product"), "basic"),
		chromedp.SetValue(chromedp.CSS("#sub-status"), "ACTIVE"),
		chromedp.Click(chromedp.CSS("#subscribe button")),
		chromedp.WaitVisible(chromedp.CSS(".done")))
	if page := text(t, ctx, "main"); strings.Contains(page, key) {
		t.Fatal("the key is shown again after the next change")
	}

	// A call through the gateway.
	if status := invoke(t, e, key); status != 200 {
		t.Fatalf("invoke with the new key: %d", status)
	}
	do(t, ctx, "user page", chromedp.Navigate(console+"/users/alice"), chromedp.WaitVisible(chromedp.CSS("svg.limit")))

	// The usage explorer shows it in the chart and the ledger.
	do(t, ctx, "usage", chromedp.Navigate(console+"/usage?user=alice"), chromedp.WaitVisible(chromedp.CSS("#usage-chart")))
	if row := text(t, ctx, "#ledger tbody tr"); !strings.Contains(row, "hello") || !strings.Contains(row, "gateway") {
		t.Fatalf("ledger row %q", row)
	}
	if n := eval[int](t, ctx, `Array.from(document.querySelectorAll("rect.bar-units")).filter(r => +r.getAttribute("height") > 0).length`); n != 1 {
		t.Fatalf("%d bars with units, want 1", n)
	}

	// Revoke, confirmed on a second page: the next call is refused.
	do(t, ctx, "revoke", chromedp.Navigate(console+"/users/alice"),
		chromedp.Click(chromedp.CSS("a.danger")),
		chromedp.WaitVisible(chromedp.CSS("#confirm-form")),
		chromedp.Click(chromedp.CSS("#confirm-form button")),
		chromedp.WaitVisible(chromedp.CSS(".done")))
	if s := text(t, ctx, ".status-revoked"); !strings.HasPrefix(s, "revoked") {
		t.Fatalf("key status %q", s)
	}
	if status := invoke(t, e, key); status != 401 && status != 403 {
		t.Fatalf("invoke with the revoked key: %d", status)
	}

	// CSRF from the page itself: a POST without the token or with a wrong
	// one is refused and changes nothing.
	// (The page's CSP forbids fetch, so the forged POSTs are forms.)
	for _, fields := range []string{`{serviceId: "weather", amount: "5"}`, `{serviceId: "weather", amount: "5", csrf: "forged"}`} {
		do(t, ctx, "forged POST", chromedp.Navigate(console+"/users/alice"), chromedp.WaitVisible(chromedp.CSS("#credits")))
		eval[bool](t, ctx, `(() => {
			const f = document.createElement("form");
			f.method = "POST";
			f.action = "/console/users/alice/credits";
			for (const [k, v] of Object.entries(`+fields+`)) {
				const i = document.createElement("input");
				i.name = k; i.value = v; f.appendChild(i);
			}
			document.body.appendChild(f);
			f.submit();
			return true;
		})()`)
		do(t, ctx, "forged POST answer", chromedp.WaitNotPresent(chromedp.CSS("#credits")))
		if body := text(t, ctx, "body"); !strings.Contains(body, "Missing or wrong CSRF token") {
			t.Errorf("forged POST %s answered %q", fields, body)
		}
	}
	// Another site posting the console's form, even with a valid token
	// copied from the page: the browser sends no SameSite=Strict cookie
	// and says the request is cross-site; refused.
	do(t, ctx, "token", chromedp.Navigate(console+"/users/alice"), chromedp.WaitVisible(chromedp.CSS("#credits")))
	token := eval[string](t, ctx, `document.querySelector('#credits input[name="csrf"]').value`)
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `<!doctype html><form id="f" method="POST" action="`+console+`/users/alice/credits">
<input name="serviceId" value="weather"><input name="amount" value="5"><input name="csrf" value="`+html.EscapeString(token)+`">
</form><script>document.getElementById("f").submit()</script>`)
	}))
	defer attacker.Close()
	// localhost is another site than 127.0.0.1.
	do(t, ctx, "attacker page", chromedp.Navigate(strings.Replace(attacker.URL, "127.0.0.1", "localhost", 1)),
		chromedp.WaitVisible(chromedp.CSS("#notice")))
	if body := text(t, ctx, "body"); !strings.Contains(body, "Missing or wrong CSRF token") {
		t.Errorf("cross-site POST answered %q", body)
	}
	if sub, _ := e.rt.Store().GetSubscription(context.Background(), "alice", "weather"); sub.Credits != 0 {
		t.Fatalf("a refused POST added credits: %v", sub.Credits)
	}

	// The audit log lists the three changes, by the operator.
	do(t, ctx, "audit", chromedp.Navigate(console+"/audit"), chromedp.WaitVisible(chromedp.CSS("#audit")))
	audit := text(t, ctx, "#audit tbody")
	for _, action := range []string{"key.create", "subscription.put", "key.revoke"} {
		if !strings.Contains(audit, action) {
			t.Errorf("audit log lacks %s: %q", action, audit)
		}
	}
	if strings.Count(audit, "console:operator") != 3 || strings.Contains(audit, key) {
		t.Errorf("audit log %q: want three entries by console:operator and no key", audit)
	}

	// A running job: listed by state, its page shows the timeline.
	now := time.Now().UTC()
	if err := e.rt.Store().CreateJob(context.Background(), store.Job{
		ID: "job-browser-1", UserID: "alice", ServiceID: "weather", EndpointID: "hello", ProductID: "basic",
		Status: store.JobRunning, Stage: "rendering", PercentageComplete: 40,
		CreatedAt: now.Add(-time.Minute), UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
	}); err != nil {
		t.Fatal(err)
	}
	do(t, ctx, "jobs", chromedp.Navigate(console+"/jobs?status=RUNNING"),
		chromedp.Click(chromedp.CSS(`a[href$="/jobs/job-browser-1"]`)),
		chromedp.WaitVisible(chromedp.CSS("ol.timeline")))
	if tl := text(t, ctx, "ol.timeline"); !strings.Contains(tl, "created") || !strings.Contains(tl, "stage rendering") {
		t.Fatalf("job timeline %q", tl)
	}

	// The other pages render (TestConsolePhonesInBrowser takes the
	// docs' screenshots, over a store with more in it).
	for _, p := range []struct{ path, sel string }{
		{"/", "#calls-per-second"},
		{"/services", "#svc-weather"},
		{"/users", "#find-user"},
		{"/jobs", "main table"},
	} {
		do(t, ctx, p.path, chromedp.Navigate(console+p.path), chromedp.WaitVisible(chromedp.CSS(p.sel)))
	}
	if n := text(t, ctx, "header"); !strings.Contains(n, "Audit log") {
		t.Errorf("navigation %q", n)
	}
}
