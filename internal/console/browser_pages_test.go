package console

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/platformgw/gateway/internal/browsertest"
)

// open navigates to a console page and waits for sel.
func (w *world) open(t *testing.T, ctx context.Context, path, sel string) {
	t.Helper()
	do(t, ctx, "open "+path, chromedp.Navigate(w.url+path), chromedp.WaitVisible(chromedp.CSS(sel)))
}

// texts reads the text of every element matching sel.
func texts(t *testing.T, ctx context.Context, sel string) []string {
	t.Helper()
	return eval[[]string](t, ctx, `Array.from(document.querySelectorAll(`+jsString(sel)+`)).map(e => (e.innerText ?? e.textContent).replace(/\s+/g, " ").trim())`)
}

func jsString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// TestConsoleChartsInBrowser: the usage explorer draws one chart per unit
// of measure (requests and tokens never on one scale, money on its own),
// each with a labelled value axis and the figures in a table under it,
// split by endpoint or user, with quick ranges.
func TestConsoleChartsInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	w := newWorld(t)
	w.open(t, ctx, "/usage?from="+w.now.AddDate(0, 0, -6).Format(time.DateOnly)+"&group=endpoint", "#usage-chart svg")

	titles := texts(t, ctx, "#usage-chart figcaption strong")
	want := []string{"request per day", "token per day", "cost in EUR per day", "cost in USD per day"}
	if strings.Join(titles, "|") != strings.Join(want, "|") {
		t.Fatalf("charts %q, want one per measure %q", titles, want)
	}
	// Each chart has a value axis with labelled steps.
	for _, id := range []string{"chart-0", "chart-1", "chart-2"} {
		if ticks := texts(t, ctx, "#"+id+" text.tick"); len(ticks) != 5 || ticks[0] != "0" {
			t.Errorf("%s axis labels %q", id, ticks)
		}
	}
	// The token chart's scale is its own: its top step is at least its
	// largest day, 2400 tokens; the request chart's is not.
	if top := texts(t, ctx, "#chart-1 text.tick"); top[4] != "2500" {
		t.Errorf("token axis tops at %q, want 2500", top[4])
	}
	if top := texts(t, ctx, "#chart-0 text.tick"); top[4] != "250" {
		t.Errorf("request axis tops at %q, want 250 (228 requests today)", top[4])
	}
	// The figures are readable without a mouse: the table under each chart.
	if data := text(t, ctx, "#chart-1-data"); !strings.Contains(data, "2400") || !strings.Contains(data, "1500") || !strings.Contains(data, "900") {
		t.Errorf("token table %q", data)
	}
	// By endpoint: the request chart has a series per endpoint.
	if heads := texts(t, ctx, "#chart-0-data thead th"); len(heads) != 4 || !strings.Contains(strings.Join(heads, "|"), "weather / forecast") {
		t.Errorf("request table by endpoint has columns %q", heads)
	}
	if total := text(t, ctx, "#usage-total"); !strings.Contains(total, "228 request, 4800 token") {
		t.Errorf("totals %q: requests and tokens must be shown apart", total)
	}

	// By user, then a quick range.
	do(t, ctx, "group by user", chromedp.SetValue(chromedp.CSS("#f-group"), "user"),
		chromedp.Submit(chromedp.CSS("#f-group")), chromedp.WaitReady(chromedp.CSS(`#f-group option[value="user"][selected]`)))
	if heads := strings.Join(texts(t, ctx, "#chart-0-data thead th"), "|"); !strings.Contains(heads, "alice") || !strings.Contains(heads, "carol") {
		t.Errorf("request table by user has columns %q", heads)
	}
	do(t, ctx, "this month", chromedp.Click(chromedp.CSS(`#quick-ranges a:nth-of-type(4)`)),
		chromedp.WaitVisible(chromedp.CSS(`#quick-ranges a:nth-of-type(4)[aria-current="true"]`)))
	if cur := text(t, ctx, `#quick-ranges a[aria-current="true"]`); cur != "This month" {
		t.Errorf("current range %q", cur)
	}
	if g := eval[string](t, ctx, `document.querySelector("#f-group").value`); g != "user" {
		t.Errorf("a quick range dropped the grouping: %q", g)
	}
	do(t, ctx, "24 hours", chromedp.Click(chromedp.CSS(`#quick-ranges a:nth-of-type(1)`)),
		chromedp.WaitVisible(chromedp.CSS(`#quick-ranges a:nth-of-type(1)[aria-current="true"]`)))
	if titles := texts(t, ctx, "#usage-chart figcaption strong"); len(titles) == 0 || !strings.HasSuffix(titles[0], "per hour") {
		t.Errorf("last 24 hours charts %q, want per hour", titles)
	}
	// A mistyped date: the form again as typed, and what is wrong.
	w.open(t, ctx, "/usage?user=alice&from=2026-13-01", "#filter-error")
	if msg := text(t, ctx, "#filter-error"); !strings.HasPrefix(msg, "The start must be a date such as 2026-11-01") {
		t.Errorf("a bad start says %q", msg)
	}
	if v := eval[[]string](t, ctx, `[document.querySelector("#f-user").value, document.querySelector("#f-from").value]`); v[0] != "alice" || v[1] != "2026-13-01" {
		t.Errorf("the form after a bad start holds %q", v)
	}
}

// TestConsoleAttentionInBrowser: the overview lists what needs an
// operator: a quota at 133% is a red bar saying until when calls are
// refused, a spending cap at 100% is red, 85% is amber, a prepaid balance
// at zero, a pending alert delivery and a job that stopped reporting. The
// user's page shows the same bars.
func TestConsoleAttentionInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	w := newWorld(t)
	w.open(t, ctx, "/", "#attention")
	items := texts(t, ctx, "#attention li")
	find := func(sub string) string {
		for _, it := range items {
			if strings.Contains(it, sub) {
				return it
			}
		}
		t.Errorf("needs attention lacks %q: %q", sub, items)
		return ""
	}
	end := w.now.AddDate(0, 1, 0).Format("2006-01") // alice's period ends next month
	if it := find("alice on weather"); !strings.Contains(it, "133%") || !strings.Contains(it, "refused until "+end) {
		t.Errorf("alice's quota: %q", it)
	}
	find("erin on weather (capped): spending cap at 100%")
	find("carol on weather (basic): quota at 85%")
	find("dave on weather (credits): credit balance 0")
	find("1 alert delivery pending")
	find("job job-2")
	for who, want := range map[string]string{"alice on": "level-red", "erin on": "level-red", "carol on": "level-amber", "dave on": "level-red"} {
		level := eval[string](t, ctx, `Array.from(document.querySelectorAll("#attention li")).find(l => l.textContent.includes(`+jsString(who)+`)).className`)
		if level != want {
			t.Errorf("%s is %q, want %s", who, level, want)
		}
	}
	// The red bar is full and red, never a green bar with "0 left".
	bar := eval[[]string](t, ctx, `(() => { const li = Array.from(document.querySelectorAll("#attention li")).find(l => l.textContent.includes("alice on")); const r = li.querySelectorAll("svg.limit rect")[1]; return [r.getAttribute("class"), r.getAttribute("width"), getComputedStyle(r).fill] })()`)
	if bar[0] != "level-red" || bar[1] != "100" || bar[2] != "rgb(164, 0, 0)" {
		t.Errorf("alice's bar %q", bar)
	}
	if body := text(t, ctx, "main"); strings.Contains(body, "0 left") {
		t.Error("the overview says 0 left")
	}

	w.open(t, ctx, "/users/alice", "#subscriptions")
	if lim := text(t, ctx, "#subscriptions .limitbar"); !strings.Contains(lim, "133 of 100 requests (133%), refused until "+end) {
		t.Errorf("alice's page: %q", lim)
	}
	w.open(t, ctx, "/users/carol", "#subscriptions")
	if cls := eval[string](t, ctx, `document.querySelectorAll("#subscriptions svg.limit rect")[1].getAttribute("class")`); cls != "level-amber" {
		t.Errorf("carol's bar is %q, want amber", cls)
	}
}

// TestConsoleUsersInBrowser: the users list says each user's standing,
// spend this month (money and credits apart) and when they were last
// seen, and its search box filters on the server; a mistyped id says
// there is nobody by it, with a link to create them.
func TestConsoleUsersInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	w := newWorld(t)
	w.open(t, ctx, "/users", "#users")
	rows := map[string]string{}
	for _, r := range texts(t, ctx, "#users tbody tr") {
		rows[strings.Fields(r)[0]] = r
	}
	if r := rows["bob"]; !strings.Contains(r, "active") || !strings.Contains(r, "4.80 USD") || strings.Contains(r, "not this month") {
		t.Errorf("bob's row %q", r)
	}
	if r := rows["erin"]; !strings.Contains(r, "10.00 EUR") {
		t.Errorf("erin's row %q", r)
	}
	do(t, ctx, "search", chromedp.SendKeys(chromedp.CSS("#find-user-q"), "ar"), chromedp.Submit(chromedp.CSS("#find-user-q")),
		chromedp.WaitVisible(chromedp.CSS(`#find-user-q[value="ar"]`)))
	if got := texts(t, ctx, "#users tbody td:first-child"); strings.Join(got, ",") != "User: carol" && strings.Join(got, ",") != "carol" {
		t.Errorf("search for ar lists %q", got)
	}
	w.open(t, ctx, "/users/alicee", "#no-user")
	if msg := text(t, ctx, "#no-user"); !strings.HasPrefix(msg, "No user named alicee") {
		t.Errorf("a mistyped id says %q", msg)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("form").length`); n != 0 {
		t.Errorf("a mistyped id shows %d forms of a new user", n)
	}
	do(t, ctx, "create", chromedp.Click(chromedp.CSS("#start-user")), chromedp.WaitVisible(chromedp.CSS("#create-key")))
}

// TestConsoleJobsInBrowser: jobs are listed newest first; a long inline
// result stays in its box (a preview and a link to all of it); a failed
// job shows its error; a running one its progress.
func TestConsoleJobsInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	w := newWorld(t)
	w.open(t, ctx, "/jobs", "#jobs")
	ids := texts(t, ctx, "#jobs tbody td:last-child code")
	if strings.Join(ids, ",") != "job-3,job-2,job-1" {
		t.Errorf("jobs in order %q, want newest first", ids)
	}
	if st := texts(t, ctx, "#jobs tbody tr"); !strings.Contains(st[0], "failed: backend timed out after 30s") {
		t.Errorf("the failed job's row %q", st[0])
	}
	w.open(t, ctx, "/jobs/job-3", "#job-error")
	if e := text(t, ctx, "#job-error"); e != "The job failed: backend timed out after 30s." {
		t.Errorf("failed job says %q", e)
	}
	if body := text(t, ctx, "main"); strings.Contains(body, "No result yet") {
		t.Error("a failed job says No result yet")
	}
	w.open(t, ctx, "/jobs/job-1", "#job-result")
	if wide := eval[int](t, ctx, `document.documentElement.scrollWidth`); wide > 1280 {
		t.Errorf("the page of a long result is %d px wide", wide)
	}
	if n := eval[int](t, ctx, `document.querySelector("#job-result").textContent.length`); n != previewBytes {
		t.Errorf("preview of %d bytes", n)
	}
	href := eval[string](t, ctx, `document.querySelector("#full-result").href`)
	resp, err := http.Get(href)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if len(b) != 64000 || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Errorf("the whole result: %d bytes, %s", len(b), resp.Header.Get("Content-Type"))
	}
	w.open(t, ctx, "/jobs/job-2", "#job-progress")
	if st := text(t, ctx, "#job-state"); st != "running" {
		t.Errorf("running job says %q", st)
	}
}

// TestConsoleConfirmInBrowser: revoking a key takes a second step, with no
// script: the first click only asks; Cancel goes back with the key still
// active; Confirm revokes it. Suspending a subscription and taking
// credits ask the same way.
func TestConsoleConfirmInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	w := newWorld(t)
	keys, _ := w.rt.Store().ListKeys(context.Background(), "bob")
	active := func() bool {
		k, _ := w.rt.Store().KeyByID(context.Background(), keys[0].ID)
		return k.RevokedAt.IsZero()
	}
	w.open(t, ctx, "/users/bob", "#keys")
	do(t, ctx, "revoke", chromedp.Click(chromedp.CSS("#keys a.danger")), chromedp.WaitVisible(chromedp.CSS("#confirm-form")))
	if !active() {
		t.Fatal("the first click revoked the key")
	}
	if q := text(t, ctx, "#confirm"); !strings.Contains(q, "Revoke key "+keys[0].ID) || !strings.Contains(q, "cannot be undone") {
		t.Errorf("confirmation says %q", q)
	}
	do(t, ctx, "cancel", chromedp.Click(chromedp.CSS("#cancel")), chromedp.WaitVisible(chromedp.CSS("#keys")))
	if !active() {
		t.Fatal("cancel revoked the key")
	}
	do(t, ctx, "revoke again", chromedp.Click(chromedp.CSS("#keys a.danger")), chromedp.WaitVisible(chromedp.CSS("#confirm-form")),
		chromedp.Click(chromedp.CSS("#confirm-form button")), chromedp.WaitVisible(chromedp.CSS(".done")))
	if active() {
		t.Fatal("confirm did not revoke the key")
	}

	// Suspending a customer asks first too; so does taking credits.
	status := func() string {
		sub, _ := w.rt.Store().GetSubscription(context.Background(), "alice", "weather")
		return sub.Status
	}
	w.open(t, ctx, "/users/alice", "#sub-weather")
	do(t, ctx, "suspend", chromedp.SetValue(chromedp.CSS("#sub-weather-status"), "SUSPENDED"),
		chromedp.Click(chromedp.CSS("#sub-weather button")), chromedp.WaitVisible(chromedp.CSS("#confirm-form")))
	if q := text(t, ctx, "#confirm"); status() != "ACTIVE" || !strings.Contains(q, "refused from now on") {
		t.Fatalf("suspending asked %q, status now %s", q, status())
	}
	do(t, ctx, "confirm suspend", chromedp.Click(chromedp.CSS("#confirm-form button")), chromedp.WaitVisible(chromedp.CSS(".done")))
	if status() != "SUSPENDED" {
		t.Fatalf("confirmed suspension left %s", status())
	}
	credits := func() string {
		sub, _ := w.rt.Store().GetSubscription(context.Background(), "dave", "weather")
		return sub.Credits.String()
	}
	w.open(t, ctx, "/users/dave", "#credits")
	do(t, ctx, "take credits", chromedp.SendKeys(chromedp.CSS("#cr-amount"), "-2"),
		chromedp.Click(chromedp.CSS("#credits button")), chromedp.WaitVisible(chromedp.CSS("#confirm-form")))
	if q := text(t, ctx, "#confirm"); credits() != "0" || !strings.Contains(q, "Take 2 credits from dave") {
		t.Fatalf("taking credits asked %q, balance now %s", q, credits())
	}
	do(t, ctx, "cancel", chromedp.Click(chromedp.CSS("#cancel")), chromedp.WaitVisible(chromedp.CSS("#credits")))
	if credits() != "0" {
		t.Fatalf("cancel changed the balance to %s", credits())
	}
}

// TestConsoleFormsInBrowser: the form that changes a subscription starts
// at the user's product and status (saving it unchanged changes nothing);
// a refused form keeps what was typed and says what is wrong in words.
func TestConsoleFormsInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	w := newWorld(t)
	if _, err := w.ops.PutSubscription(context.Background(), "test", "carol", "weather", "capped", "TRIAL"); err != nil {
		t.Fatal(err)
	}
	w.open(t, ctx, "/users/carol", "#sub-weather")
	sel := eval[[]string](t, ctx, `[document.querySelector("#sub-weather-product").value, document.querySelector("#sub-weather-status").value]`)
	if sel[0] != "capped" || sel[1] != "TRIAL" {
		t.Fatalf("the form starts at %q, want the current capped, TRIAL", sel)
	}
	do(t, ctx, "save unchanged", chromedp.Click(chromedp.CSS("#sub-weather button")), chromedp.WaitVisible(chromedp.CSS(".done")))
	if sub, _ := w.rt.Store().GetSubscription(context.Background(), "carol", "weather"); sub.ProductID != "capped" || sub.Status != "TRIAL" {
		t.Fatalf("saving the form unchanged made it %s %s", sub.ProductID, sub.Status)
	}
	// A new subscription starts at no service and no product.
	if v := eval[[]string](t, ctx, `[document.querySelector("#sub-service").value, document.querySelector("#sub-product").value]`); v[0] != "" || v[1] != "" {
		t.Errorf("a new subscription starts at %q", v)
	}
	do(t, ctx, "bad amount", chromedp.SendKeys(chromedp.CSS("#cr-amount"), "12,5"), chromedp.Click(chromedp.CSS("#credits button")),
		chromedp.WaitVisible(chromedp.CSS("#form-error")))
	if msg := text(t, ctx, "#form-error"); !strings.HasPrefix(msg, "The amount must be a number such as 10.5") || !strings.Contains(msg, "Nothing was changed.") {
		t.Errorf("bad amount says %q", msg)
	}
	if v := eval[string](t, ctx, `document.querySelector("#cr-amount").value`); v != "12,5" {
		t.Errorf("the amount field holds %q after the error", v)
	}
	// A fresh page, so the error waited for is the next answer's.
	w.open(t, ctx, "/users/carol", "#create-key")
	do(t, ctx, "past expiry", chromedp.SendKeys(chromedp.CSS("#key-label"), "ci runner"),
		chromedp.SetValue(chromedp.CSS("#key-expires"), "2001-02-03"), chromedp.Click(chromedp.CSS("#create-key button")),
		chromedp.WaitVisible(chromedp.CSS("#form-error")))
	if msg := text(t, ctx, "#form-error"); msg != "The expiry date is in the past. Nothing was changed." {
		t.Errorf("past expiry says %q", msg)
	}
	if v := eval[[]string](t, ctx, `[document.querySelector("#key-label").value, document.querySelector("#key-expires").value]`); v[0] != "ci runner" || v[1] != "2001-02-03" {
		t.Errorf("the key form holds %q after the error", v)
	}
}

// TestConsoleAuditInBrowser: the audit log filters by who, action, target
// and dates, and shows each change's before and after.
func TestConsoleAuditInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	w := newWorld(t)
	w.open(t, ctx, "/audit?action=credits.add", "#audit")
	rows := texts(t, ctx, "#audit tbody tr")
	if len(rows) != 2 {
		t.Fatalf("credits.add rows %q", rows)
	}
	ba := texts(t, ctx, "#audit tbody td.before, #audit tbody td.after")
	if strings.Join(ba, "|") != "Before: balance 5|After: balance 0 (-5)|Before: balance 0|After: balance 5 (+5)" &&
		strings.Join(ba, "|") != "balance 5|balance 0 (-5)|balance 0|balance 5 (+5)" {
		t.Errorf("before and after %q", ba)
	}
	do(t, ctx, "filter", chromedp.Navigate(w.url+"/audit"), chromedp.WaitVisible(chromedp.CSS("#audit-filter")),
		chromedp.SendKeys(chromedp.CSS("#a-actor"), "admin-api"), chromedp.SendKeys(chromedp.CSS("#a-target"), "dave"),
		chromedp.Submit(chromedp.CSS("#a-actor")), chromedp.WaitVisible(chromedp.CSS(`#a-actor[value="admin-api"]`)))
	rows = texts(t, ctx, "#audit tbody tr")
	if len(rows) != 1 || !strings.Contains(rows[0], "subscription.put") || !strings.Contains(rows[0], "product basic, status ACTIVE") ||
		!strings.Contains(rows[0], "product credits, status ACTIVE") {
		t.Errorf("dave's change by the admin API %q", rows)
	}
	today := w.now.Format(time.DateOnly)
	w.open(t, ctx, "/audit?to="+w.now.AddDate(0, 0, -1).Format(time.DateOnly), "#audit")
	if rows := texts(t, ctx, "#audit tbody tr"); len(rows) != 1 || !strings.Contains(rows[0], "No changes match") {
		t.Errorf("changes before today %q", rows)
	}
	w.open(t, ctx, "/audit?from="+today, "#audit")
	if rows := texts(t, ctx, "#audit tbody tr"); len(rows) != 11 {
		t.Errorf("%d changes today, want 11", len(rows))
	}
	w.open(t, ctx, "/audit?target=dave&from="+today+"&to=2001-01-01", "#filter-error")
	if msg := text(t, ctx, "#filter-error"); !strings.HasPrefix(msg, "The end date must be after the start date.") {
		t.Errorf("dates the wrong way round say %q", msg)
	}
	if v := eval[string](t, ctx, `document.querySelector("#a-target").value`); v != "dave" {
		t.Errorf("the audit form after an error holds %q", v)
	}
}

// TestConsoleOutcomesInBrowser: from the call outcome rollups, the usage
// explorer grouped by outcome charts calls per day by outcome with its
// table; the overview shows the range's calls, errors by code and the
// gateway's and backends' p50 and p99, and lists weather's backend as
// failing (12 of 192 calls, at least 5% of at least 20) but not writer's
// (1 of 51).
func TestConsoleOutcomesInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	w := newWorld(t)
	w.open(t, ctx, "/usage?from="+w.now.AddDate(0, 0, -6).Format(time.DateOnly)+"&group=outcome", "#usage-chart svg")
	titles := texts(t, ctx, "#usage-chart figcaption strong")
	if len(titles) == 0 || titles[0] != "calls per day" {
		t.Fatalf("charts %q, want calls per day first", titles)
	}
	if cap := text(t, ctx, "#chart-0-figure figcaption"); !strings.Contains(cap, "256 calls in all, by outcome") {
		t.Errorf("the calls chart says %q", cap)
	}
	heads := texts(t, ctx, "#chart-0-data thead th")
	if strings.Join(heads, "|") != "Day (UTC)|2xx|5xx|rate_limited|quota_exceeded|calls" {
		t.Errorf("calls by outcome table columns %q", heads)
	}
	if row := texts(t, ctx, "#chart-0-data tbody tr"); len(row) != 1 || row[0] != w.now.Format("01-02")+" 230 13 9 4 256" {
		t.Errorf("calls by outcome table rows %q", row)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("#chart-0 rect.bar-calls").length`); n != 4 {
		t.Errorf("today's bar has %d segments, want one per outcome", n)
	}

	w.open(t, ctx, "/", "#call-figures")
	for id, want := range map[string]string{"range-calls": "256", "gateway-p50": "≤ 100µs", "gateway-p99": "≤ 2.5ms",
		"backend-p50": "≤ 25ms", "backend-p99": "≤ 1s"} {
		if got := text(t, ctx, "#"+id); got != want {
			t.Errorf("#%s is %q, want %q", id, got, want)
		}
	}
	errs := texts(t, ctx, "#errors-by-code tbody tr")
	if strings.Join(errs, "|") != "5xx 13 5.1%|rate_limited 9 3.5%|quota_exceeded 4 1.6%" {
		t.Errorf("errors by code %q", errs)
	}
	if cur := text(t, ctx, `#overview-ranges a[aria-current="true"]`); cur != "Last 24 hours" {
		t.Errorf("current range %q", cur)
	}
	items := texts(t, ctx, "#attention li")
	var failing []string
	for _, it := range items {
		if strings.HasPrefix(it, "Backend failing:") {
			failing = append(failing, it)
		}
	}
	if len(failing) != 1 || !strings.Contains(failing[0], "weather: 12 of 192 calls to its backend failed") || !strings.Contains(failing[0], "(6%)") {
		t.Errorf("failing backends %q", failing)
	}
	do(t, ctx, "last 7 days", chromedp.Click(chromedp.CSS(`#overview-ranges a:nth-of-type(2)`)),
		chromedp.WaitVisible(chromedp.CSS(`#overview-ranges a:nth-of-type(2)[aria-current="true"]`)))
	if title := text(t, ctx, "#calls-chart-figure figcaption strong"); title != "calls per day" {
		t.Errorf("7 days chart %q", title)
	}
	do(t, ctx, "the failing backend's calls", chromedp.Click(chromedp.CSS(`#attention a[href*="group=outcome"]`)),
		chromedp.WaitReady(chromedp.CSS(`#f-group option[value="outcome"][selected]`)))
	if heads := strings.Join(texts(t, ctx, "#chart-0-data thead th"), "|"); heads != "Hour (UTC)|2xx|5xx|rate_limited|quota_exceeded|calls" {
		t.Errorf("weather's calls by outcome columns %q", heads)
	}
}
