package console

import (
	"context"
	"encoding/csv"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/onceform"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// direct builds a console handler around the running app, as Provision
// would, for httptest requests that skip Caddy's routing.
func direct(t *testing.T, e *env, allowAnon bool) *Handler {
	t.Helper()
	h := &Handler{Prefix: "/console", AllowUnauthenticated: allowAnon}
	if err := h.setup(e.rt, e.ops, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	return h
}

// serve sends r as the operator who (none when empty), as Caddy's
// basic_auth would have signed them in, from a loopback client (plain
// HTTP from elsewhere is refused; serveFrom keeps r's address).
func serve(h *Handler, r *http.Request, who string) *httptest.ResponseRecorder {
	r.RemoteAddr = "127.0.0.1:40000"
	return serveFrom(h, r, who)
}

// serveFrom is serve from r's own RemoteAddr (httptest's is 192.0.2.1).
func serveFrom(h *Handler, r *http.Request, who string) *httptest.ResponseRecorder {
	repl := caddy.NewReplacer()
	if who != "" {
		repl.Set("http.auth.user.id", who)
	}
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r, nil)
	return w
}

var tokenRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// session GETs a page and returns its CSRF cookie and form token.
func session(t *testing.T, h *Handler, path, who string) (*http.Cookie, string) {
	t.Helper()
	w := serve(h, httptest.NewRequest("GET", path, nil), who)
	if w.Code != 200 {
		t.Fatalf("GET %s: %d %s", path, w.Code, w.Body)
	}
	var c *http.Cookie
	for _, ck := range w.Result().Cookies() {
		if ck.Name == csrfCookie {
			c = ck
		}
	}
	m := tokenRE.FindStringSubmatch(w.Body.String())
	if c == nil || m == nil {
		t.Fatalf("GET %s: no CSRF cookie or token", path)
	}
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
		t.Errorf("CSRF cookie %+v: want HttpOnly, SameSite=Strict", c)
	}
	return c, m[1]
}

// post sends a form as the operator who with cookie c. A form with a
// CSRF token and no one-time value gets a fresh one, as a form of a page
// just rendered has (once.go); the tests of the one-time values
// (once_test.go) post the values their pages carry.
func post(h *Handler, path string, form url.Values, c *http.Cookie, who string) *httptest.ResponseRecorder {
	if form.Has("csrf") && !form.Has(onceform.Field) {
		form = maps.Clone(form)
		form.Set(onceform.Field, h.once.Mint(who))
	}
	r := httptest.NewRequest("POST", path, strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if c != nil {
		r.AddCookie(c)
	}
	return serve(h, r, who)
}

// The console refuses a request no authentication handler signed in,
// unless allow_unauthenticated says otherwise; every answer carries the
// strict Content-Security-Policy.
func TestConsoleRefusesUnauthenticated(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	for _, path := range []string{"/console/", "/console/users", "/console/audit", "/console/usage/export?format=csv"} {
		w := serve(h, httptest.NewRequest("GET", path, nil), "")
		if w.Code != http.StatusForbidden {
			t.Errorf("GET %s without a user: %d", path, w.Code)
		}
		if !strings.Contains(w.Header().Get("Content-Security-Policy"), "default-src 'none'") {
			t.Errorf("GET %s: CSP %q", path, w.Header().Get("Content-Security-Policy"))
		}
	}
	w := serve(direct(t, e, true), httptest.NewRequest("GET", "/console/", nil), "")
	if w.Code != 200 || !strings.Contains(w.Body.String(), "Signed in as anonymous") {
		t.Fatalf("allow_unauthenticated: %d", w.Code)
	}
	w = serve(h, httptest.NewRequest("GET", "/console/", nil), "alice")
	csp := w.Header().Get("Content-Security-Policy")
	if w.Code != 200 || csp != "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'" {
		t.Fatalf("overview: %d, CSP %q", w.Code, csp)
	}
	if strings.Contains(w.Body.String(), "<script>") || strings.Contains(w.Body.String(), "style=") {
		t.Error("a page has inline script or style")
	}
}

// A POST without the CSRF token, with a wrong one, with another
// operator's or without the cookie is refused and changes nothing; with
// the right one the change is made, through the admin API's code, and
// audited under the operator's name.
func TestConsoleCSRF(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	ctx := context.Background()
	if _, err := e.ops.PutSubscription(ctx, "test", "alice", "weather", "credits", ""); err != nil {
		t.Fatal(err)
	}
	c, token := session(t, h, "/console/users/alice", "bob")
	const path = "/console/users/alice/credits"
	form := func(tok string) url.Values {
		v := url.Values{"serviceId": {"weather"}, "amount": {"5"}}
		if tok != "" {
			v.Set("csrf", tok)
		}
		return v
	}
	_, aliceToken := session(t, h, "/console/users/alice", "alice")
	for name, w := range map[string]*httptest.ResponseRecorder{
		"no token":            post(h, path, form(""), c, "bob"),
		"wrong token":         post(h, path, form(token[:len(token)-2]+"xx"), c, "bob"),
		"no cookie":           post(h, path, form(token), nil, "bob"),
		"another's token":     post(h, path, form(aliceToken), c, "bob"),
		"another's operator":  post(h, path, form(token), c, "alice"),
		"unauthenticated":     post(h, path, form(token), c, ""),
		"cookie as the token": post(h, path, form(c.Value), c, "bob"),
	} {
		if w.Code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, w.Code)
		}
	}
	r := httptest.NewRequest("POST", path, strings.NewReader(form(token).Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Sec-Fetch-Site", "cross-site")
	r.AddCookie(c)
	if w := serve(h, r, "bob"); w.Code != http.StatusForbidden {
		t.Errorf("cross-site POST: %d", w.Code)
	}
	sub, _ := e.rt.Store().GetSubscription(ctx, "alice", "weather")
	entries, _, _ := e.ops.AuditLog(ctx, "", 10)
	if sub.Credits != 0 || len(entries) != 1 {
		t.Fatalf("refused POSTs changed something: credits %v, %d audit entries", sub.Credits, len(entries))
	}

	w := post(h, path, form(token), c, "bob")
	if w.Code != http.StatusSeeOther {
		t.Fatalf("good POST: %d %s", w.Code, w.Body)
	}
	sub, _ = e.rt.Store().GetSubscription(ctx, "alice", "weather")
	entries, _, _ = e.ops.AuditLog(ctx, "", 10)
	if sub.Credits.String() != "5" || entries[0].Actor != "console:bob" || entries[0].Action != ops.AuditCreditsAdd {
		t.Fatalf("credits %v, audit %+v", sub.Credits, entries[0])
	}
	// The admin API's validation, and its message, on a bad amount.
	w = post(h, path, url.Values{"serviceId": {"weather"}, "amount": {"0"}, "csrf": {token}}, c, "bob")
	if w.Code != 400 || !strings.Contains(w.Body.String(), "amount must not be zero") {
		t.Fatalf("zero amount: %d %s", w.Code, w.Body)
	}
}

// A key is shown on the answer that created it and never again; its
// user, label and roles are escaped by the templates.
func TestConsoleKeyShownOnce(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	user := `<b onclick="x">`
	c, token := session(t, h, "/console/users/"+url.PathEscape(user)+"?new=1", "bob")
	w := post(h, "/console/users/"+url.PathEscape(user)+"/keys", url.Values{"csrf": {token}, "label": {"<i>ci</i>"}, "roles": {"a, b"}}, c, "bob")
	body := w.Body.String()
	m := regexp.MustCompile(`<code id="new-key">([^<]+)</code>`).FindStringSubmatch(body)
	if w.Code != 200 || m == nil {
		t.Fatalf("create key: %d %s", w.Code, body)
	}
	if strings.Contains(body, "<b onclick") || strings.Contains(body, "<i>ci") {
		t.Fatal("user id or label not escaped")
	}
	keys, _ := e.rt.Store().ListKeys(context.Background(), user)
	if len(keys) != 1 || keys[0].Label != "<i>ci</i>" || strings.Join(keys[0].Roles, ",") != "a,b" {
		t.Fatalf("stored keys %+v", keys)
	}
	for _, path := range []string{"/console/users/" + url.PathEscape(user), "/console/users", "/console/audit", "/console/"} {
		if w := serve(h, httptest.NewRequest("GET", path, nil), "bob"); strings.Contains(w.Body.String(), m[1]) {
			t.Errorf("%s shows the key after its creation", path)
		}
	}
	// A bad expiry is the admin API's error in the form's words, on the
	// user's page, with what was typed kept.
	w = post(h, "/console/users/alice/keys", url.Values{"csrf": {token}, "form": {"key"}, "expires": {"2001-01-01"}, "label": {"kept label"}}, c, "bob")
	if w.Code != 400 || !strings.Contains(w.Body.String(), "The expiry date is in the past.") ||
		!strings.Contains(w.Body.String(), `value="kept label"`) || !strings.Contains(w.Body.String(), `value="2001-01-01"`) {
		t.Fatalf("past expiry: %d\n%s", w.Code, w.Body)
	}
}

// The export streams exactly the selection the explorer shows, endpoint
// and source filters included; bad filters are refused.
func TestConsoleUsageExport(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	ctx := context.Background()
	if _, err := e.ops.PutSubscription(ctx, "test", "alice", "weather", "basic", ""); err != nil {
		t.Fatal(err)
	}
	svc, _ := e.rt.Catalog.Service("weather")
	p, _ := svc.Product("basic")
	now := time.Now().UTC()
	for i, ep := range []string{"hello", "other", "hello"} {
		src := store.SourceReport
		if i == 2 {
			src = store.SourceCompletion
		}
		_, err := e.rt.Store().Record(ctx, store.Account{UserID: "alice", ServiceID: "weather", Product: *p},
			store.LedgerEntry{ID: "e" + ep + string(rune('0'+i)), Time: now, UserID: "alice", ServiceID: "weather", EndpointID: ep,
				ProductID: "basic", Source: src, Units: 1000000},
			func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil })
		if err != nil {
			t.Fatal(err)
		}
	}
	w := serve(h, httptest.NewRequest("GET", "/console/usage/export?format=csv&user=alice&endpoint=hello&source=report", nil), "bob")
	rows, err := csv.NewReader(w.Body).ReadAll()
	if w.Code != 200 || err != nil || len(rows) != 2 || rows[1][4] != "hello" || rows[1][7] != "report" {
		t.Fatalf("csv export: %d %v %v", w.Code, err, rows)
	}
	w = serve(h, httptest.NewRequest("GET", "/console/usage?user=alice&endpoint=hello", nil), "bob")
	if !strings.Contains(w.Body.String(), "<strong>2</strong> entries") || !strings.Contains(w.Body.String(), `class="bar-units `) {
		t.Fatalf("explorer: %d", w.Code)
	}
	w = serve(h, httptest.NewRequest("GET", "/console/usage/export?format=json&service=weather", nil), "bob")
	b, _ := io.ReadAll(w.Body)
	if w.Code != 200 || strings.Count(string(b), `"seq"`) != 3 {
		t.Fatalf("json export: %d %s", w.Code, b)
	}
	for _, q := range []string{"format=xml", "format=csv&source=nope", "format=csv&from=yesterday", "format=csv&from=2026-02-02&to=2026-01-01"} {
		if w := serve(h, httptest.NewRequest("GET", "/console/usage/export?"+q, nil), "bob"); w.Code != 400 {
			t.Errorf("%s: %d, want 400", q, w.Code)
		}
	}
}

// A call a hard limit cut short shows as such: the explorer's totals
// count it, its row says how much of what the backend stated went
// uncharged.
func TestConsoleUsageShowsCutCalls(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	ctx := context.Background()
	if _, err := e.ops.PutSubscription(ctx, "test", "alice", "weather", "basic", ""); err != nil {
		t.Fatal(err)
	}
	svc, _ := e.rt.Catalog.Service("weather")
	p, _ := svc.Product("basic")
	a := store.Account{UserID: "alice", ServiceID: "weather", Product: *p}
	now := time.Now().UTC()
	for _, claim := range []int64{98, 5} { // 98 of 100, then 5 with 2 left
		res, err := e.rt.Store().Reserve(ctx, a, billing.Whole(1), now)
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("hold: %v %+v", err, res.Decision)
		}
		if _, err := e.rt.Store().Settle(ctx, res, billing.Whole(claim), store.LedgerEntry{Time: now, UserID: "alice",
			ServiceID: "weather", EndpointID: "hello", ProductID: "basic", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	body := serve(h, httptest.NewRequest("GET", "/console/usage?user=alice", nil), "bob").Body.String()
	if !strings.Contains(body, `<span id="usage-cut" class="cut"><strong>1</strong> cut at a hard limit`) ||
		!strings.Contains(body, "3 of 5 stated left uncharged") || strings.Count(body, "left uncharged") != 1 {
		t.Errorf("the explorer does not show the call cut at the quota:\n%s", body)
	}
	body = serve(h, httptest.NewRequest("GET", "/console/usage?user=alice&source=gateway", nil), "bob").Body.String()
	if !strings.Contains(body, `<strong>1</strong> cut at a hard limit`) {
		t.Errorf("the explorer filtered by source does not count the cut call")
	}
}

// Calls through the real gateway show in the overview's figures: each
// invoke call is counted once with the status its caller got.
func TestOverviewCountsGatewayCalls(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	if _, err := e.ops.PutSubscription(ctx, "test", "alice", "weather", "basic", ""); err != nil {
		t.Fatal(err)
	}
	k, err := e.ops.CreateKey(ctx, "test", ops.CreateKeyRequest{UserID: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	before := e.rt.Calls.Recent()
	if s := invoke(t, e, k.Key); s != 200 {
		t.Fatalf("invoke: %d", s)
	}
	if s := invoke(t, e, "psk_not-a-key"); s != 401 {
		t.Fatalf("invoke with a bad key: %d", s)
	}
	after := e.rt.Calls.Recent()
	fours := func(c engine.CallStats) float64 { return c.Share4xx * float64(c.Calls) }
	if after.Calls-before.Calls != 2 || int(fours(after)+0.5)-int(fours(before)+0.5) != 1 || after.P50 == 0 {
		t.Fatalf("figures before %+v, after %+v: want 2 more calls, 1 more 4xx", before, after)
	}
	w := serve(direct(t, e, false), httptest.NewRequest("GET", "/console/", nil), "bob")
	if !strings.Contains(w.Body.String(), `id="calls-per-second"`) || !strings.Contains(w.Body.String(), `http-equiv="refresh" content="10"`) {
		t.Fatalf("overview: %d", w.Code)
	}
}

// TestConsoleAlerts: the alerts page lists what the store recorded, through
// the admin API's ListAlerts: filters narrow it, a bad filter is the same
// error as the admin API's, and the page never carries a secret.
func TestConsoleAlerts(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	ctx := context.Background()
	period := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for _, a := range []store.Alert{
		{UserID: "alice", ServiceID: "weather", ProductID: "basic", PeriodStart: period, Threshold: "quota 80%",
			Value: billing.Whole(8), Limit: billing.Whole(8), Created: period.Add(time.Hour), Status: "PENDING"},
		{UserID: "bob", ServiceID: "weather", ProductID: "basic", PeriodStart: period, Threshold: "quota 100%",
			Value: billing.Whole(10), Limit: billing.Whole(10), Created: period.Add(2 * time.Hour), Status: "PENDING"},
	} {
		if _, err := e.rt.Store().CreateAlert(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	w := serve(h, httptest.NewRequest("GET", "/console/alerts", nil), testOperator)
	body := w.Body.String()
	if w.Code != 200 || !strings.Contains(body, "quota 80%") || !strings.Contains(body, "quota 100%") ||
		!strings.Contains(body, `aria-current="page">Alerts`) {
		t.Fatalf("alerts page: %d\n%s", w.Code, body)
	}
	if strings.Contains(body, testSecret) {
		t.Error("the alerts page shows the service secret")
	}
	w = serve(h, httptest.NewRequest("GET", "/console/alerts?userId=bob", nil), testOperator)
	if body := w.Body.String(); w.Code != 200 || strings.Contains(body, "quota 80%") || !strings.Contains(body, "quota 100%") {
		t.Errorf("filtered by bob: %d\n%s", w.Code, body)
	}
	w = serve(h, httptest.NewRequest("GET", "/console/alerts?status=LOST", nil), testOperator)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "Status must be one of") {
		t.Errorf("a bad status filter: %d\n%s", w.Code, w.Body)
	}
	w = serve(h, httptest.NewRequest("GET", "/console/alerts", nil), "")
	if w.Code != http.StatusForbidden {
		t.Errorf("without an operator: %d, want 403", w.Code)
	}
}

// TestConsoleKeyLastUsed: a key's last use is shown once it authenticated
// a call, and "not since start" before.
func TestConsoleKeyLastUsed(t *testing.T) {
	e := start(t)
	h := direct(t, e, false)
	key, v := createKeyFor(t, e, "lu-user")
	w := serve(h, httptest.NewRequest("GET", "/console/users/lu-user", nil), testOperator)
	if !strings.Contains(w.Body.String(), "not since start") {
		t.Fatalf("before any call: %d\n%s", w.Code, w.Body)
	}
	if _, ok := e.ops.KeyLastUsed(v.ID); ok {
		t.Fatal("a key never used has a last use")
	}
	r, _ := http.NewRequest("GET", e.base+"/api/service/weather/endpoint/hello/invoke", nil)
	r.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	at, ok := e.ops.KeyLastUsed(v.ID)
	if !ok || time.Since(at) > time.Minute {
		t.Fatalf("after a call: %v %v", at, ok)
	}
	w = serve(h, httptest.NewRequest("GET", "/console/users/lu-user", nil), testOperator)
	if strings.Contains(w.Body.String(), "not since start") {
		t.Errorf("after a call the page still says not used:\n%s", w.Body)
	}
}

// createKeyFor makes a key through the operations the admin API uses.
func createKeyFor(t *testing.T, e *env, user string) (string, ops.KeyView) {
	t.Helper()
	v, err := e.ops.CreateKey(context.Background(), "test", ops.CreateKeyRequest{UserID: user})
	if err != nil {
		t.Fatal(err)
	}
	return v.Key, v
}

// A subscription with an end shows it, and the status it ended in after;
// saving the change form sets the status chosen and clears the end, as
// its help text says.
func TestConsoleSubscriptionEnd(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	ctx := context.Background()
	ends := time.Now().UTC().Add(72 * time.Hour)
	if _, err := e.ops.PutSubscriptionUntil(ctx, "test", "alice", "weather", "basic", "CANCELLING",
		ops.End{At: ends, Status: "CANCELLED"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ops.PutSubscriptionUntil(ctx, "test", "bob", "weather", "basic", "TRIAL",
		ops.End{At: time.Now().UTC().Add(-time.Hour), Status: "EXPIRED"}); err != nil {
		t.Fatal(err)
	}
	body := serve(h, httptest.NewRequest("GET", "/console/users/alice", nil), "op").Body.String()
	for _, want := range []string{"Cancelling — ends " + ends.Format(time.DateOnly), "Saving sets the status you choose and clears any end"} {
		if !strings.Contains(body, want) {
			t.Errorf("alice's page lacks %q", want)
		}
	}
	body = serve(h, httptest.NewRequest("GET", "/console/users/bob", nil), "op").Body.String()
	if !strings.Contains(body, `<td data-label="Status">EXPIRED</td>`) || !strings.Contains(body, "this one ended") {
		t.Errorf("bob's ended trial is not shown as EXPIRED:\n%s", body)
	}
	c, token := session(t, h, "/console/users/alice", "op")
	w := post(h, "/console/users/alice/subscription", url.Values{"csrf": {token}, "form": {"sub-weather"},
		"serviceId": {"weather"}, "productId": {"basic"}, "status": {"CANCELLING"}}, c, "op")
	if w.Code != http.StatusSeeOther {
		t.Fatalf("save: %d %s", w.Code, w.Body)
	}
	if s, err := e.rt.Store().GetSubscription(ctx, "alice", "weather"); err != nil || s.Status != "CANCELLING" || !s.EndsAt.IsZero() {
		t.Errorf("after saving: %+v, %v; want CANCELLING with no end", s, err)
	}
}

// TestConsoleCSRFRefusalPage: a form the CSRF check refuses (sent after
// the gateway restarted or its configuration was reloaded, so under an
// old key; or forged) is answered with the console's own page, not a line
// of plain text: it says what happened, that nothing was changed and to
// open the page again, with a link back to the user; and it sets no
// cookie, so a POST from another site cannot replace the operator's.
func TestConsoleCSRFRefusalPage(t *testing.T) {
	e := local(t)
	if _, err := e.ops.PutSubscription(context.Background(), "test", "alice", "weather", "credits", ""); err != nil {
		t.Fatal(err)
	}
	old := direct(t, e, false)
	c, token := session(t, old, "/console/users/alice", "bob")
	reloaded := direct(t, e, false) // a config reload provisions a new handler
	form := url.Values{"serviceId": {"weather"}, "amount": {"5"}, "csrf": {token}}
	w := post(reloaded, "/console/users/alice/credits", form, c, "bob")
	if w.Code != http.StatusForbidden {
		t.Fatalf("a form of before the reload: %d", w.Code)
	}
	body := w.Body.String()
	if ct := w.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q:\n%s", ct, body)
	}
	for _, want := range []string{`<nav`, `id="notice"`, "Missing or wrong CSRF token", "Nothing was changed", "open the page again",
		`href="/console/users/alice"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the refusal lacks %q:\n%s", want, body)
		}
	}
	if sc := w.Header().Values("Set-Cookie"); len(sc) > 0 {
		t.Errorf("the refusal sets cookies %q", sc)
	}
	if sub, _ := e.rt.Store().GetSubscription(context.Background(), "alice", "weather"); sub.Credits != 0 {
		t.Errorf("credits added: %v", sub.Credits)
	}
}

// TestConsoleUnknownPage: an address below the console that is no page of
// it (a mistyped link, an old bookmark) gets the console's own error page,
// 404, with its header and navigation and a way back, as a job that does
// not exist does; not Go's bare "404 page not found".
func TestConsoleUnknownPage(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	for _, path := range []string{"/console/nope", "/console/users/alice/nope", "/console/servces"} {
		w := serve(h, httptest.NewRequest("GET", path, nil), "bob")
		body := w.Body.String()
		if w.Code != http.StatusNotFound || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
			t.Errorf("GET %s: %d %q", path, w.Code, w.Header().Get("Content-Type"))
		}
		for _, want := range []string{"<nav", "There is no such page in the console", `href="/console/"`} {
			if !strings.Contains(body, want) {
				t.Errorf("GET %s lacks %q:\n%s", path, want, body)
			}
		}
	}
}
