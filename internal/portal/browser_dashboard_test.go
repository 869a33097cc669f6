package portal

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// The dashboard in a browser, on a portal served with no Caddy (local)
// over a catalog of several services, each priced another way: bars and
// the banner, plain words, usage by endpoint and day, refused calls,
// copy buttons, the revocation's two steps, phones and keyboards.

// Colours of the bars' fill (assets/portal.css).
const (
	amberFill = "rgb(180, 95, 0)"
	redFill   = "rgb(168, 7, 26)"
	blueFill  = "rgb(31, 95, 191)"
)

// marketServices are a catalog of five services, one per way of pricing:
// echo (a monthly quota of 100 requests, blocked past it), chat (pay as
// you go per token under a spending cap, 10 calls a minute per key),
// prepaid (credits per request), words (a quota of words) and old (a
// subscription that gets suspended).
func marketServices() []*catalog.Service {
	quota, cap10, words := billing.Whole(100), billing.Whole(10), billing.Whole(5000)
	ep := func(ids ...string) []*catalog.Endpoint {
		var out []*catalog.Endpoint
		for _, id := range ids {
			out = append(out, &catalog.Endpoint{ID: id, Methods: []string{"POST"}, Path: "/" + id})
		}
		return out
	}
	svc := func(id string, eps []*catalog.Endpoint, p *billing.Product) *catalog.Service {
		return &catalog.Service{ID: id, Backend: "http://127.0.0.1:9", Secrets: []string{echoSecret}, Endpoints: eps, Products: []*billing.Product{p}}
	}
	return []*catalog.Service{
		svc("echo", ep("hello", "shout"), &billing.Product{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
			UnitLabel: "request", Quota: &quota, Overage: "block"}),
		svc("chat", ep("complete"), &billing.Product{ID: "tokens", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken,
			UnitLabel: "token", Price: billing.Whole(2) / 1000, SpendingCap: &cap10, RateLimit: &billing.RateLimit{Requests: 10, WindowSeconds: 60}}),
		svc("prepaid", ep("lookup"), &billing.Product{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest,
			UnitLabel: "request", Price: billing.Whole(1)}),
		svc("words", ep("translate"), &billing.Product{ID: "wordplan", BillingModel: billing.Subscription, MeasurementType: billing.PerTimeUnit,
			UnitLabel: "word", Quota: &words, Overage: "block"}),
		svc("old", ep("legacy"), &billing.Product{ID: "legacy", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
			UnitLabel: "request"}),
	}
}

// market is a local portal over marketServices.
func market(t *testing.T, options string) *env {
	t.Helper()
	return localWith(t, options, marketServices()...)
}

// subscribe subscribes user to service under product with status.
func (e *env) subscribe(user, service, product, status string) store.Subscription {
	e.t.Helper()
	sub, err := e.store().PutSubscription(context.Background(), store.Subscription{
		UserID: user, ServiceID: service, ProductID: product, Status: status, UpdatedAt: time.Now().UTC(),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return sub
}

// charge records units of usage of user's at an endpoint, as a usage
// report does (charged even past a limit); claimed above units makes it
// a row a hard limit cut short.
func (e *env) charge(user, service, endpoint string, units billing.Units, at time.Time, claimed billing.Units) {
	e.t.Helper()
	svc, _ := e.rt.Catalog.Service(service)
	p := svc.Products[0]
	en := store.LedgerEntry{Time: at, UserID: user, ServiceID: service, EndpointID: endpoint, ProductID: p.ID,
		Source: store.SourceReport, Units: units, RequestID: fmt.Sprintf("req-%s-%d", user, at.UnixNano())}
	if claimed > units {
		en.UnitsClaimed = claimed
	}
	if _, err := e.store().Record(context.Background(), store.Account{UserID: user, ServiceID: service, Product: *p}, en,
		func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
		e.t.Fatal(err)
	}
}

// openDashboard signs in at e's portal by keyboard and waits for the
// dashboard.
func openDashboard(t *testing.T, ctx context.Context, e *env, key string) {
	t.Helper()
	step(t, ctx, "open the portal", chromedp.Navigate(e.base+"/portal/"), chromedp.WaitVisible(chromedp.ID("key")))
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(c, chromedp.WaitEvent(cdppage.LoadEventFired, nil, chromedp.SendKeys(chromedp.ID("key"), key+"\r"))); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	step(t, ctx, "the dashboard", chromedp.WaitVisible(chromedp.ID("subscriptions")))
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return v
}

// TestBrowserStanding: a quota at 133% shows a red bar that says "quota
// used up until" the period's end, a spending cap at 85% an amber bar,
// and the banner at the top names every subscription whose calls are
// refused now with its fix (quota used up until the date, add credits,
// suspended); plans and statuses are in words, money with its unit.
func TestBrowserStanding(t *testing.T) {
	ctx := newBrowser(t)
	e := market(t, "")
	key, _ := e.user("alice", "basic") // echo under basic
	e.subscribe("alice", "chat", "tokens", "CANCELLING")
	e.subscribe("alice", "prepaid", "credits", "ACTIVE")
	e.subscribe("alice", "words", "wordplan", "ACTIVE")
	e.subscribe("alice", "old", "legacy", "SUSPENDED")
	now := time.Now().UTC()
	e.charge("alice", "echo", "hello", billing.Whole(133), now, 0)
	e.charge("alice", "chat", "complete", billing.Whole(4250), now, 0) // 8.50 of a cap of 10
	e.charge("alice", "words", "translate", billing.Whole(1000), now, 0)
	sub, _ := e.store().GetSubscription(context.Background(), "alice", "echo")
	ps, err := e.ops.Summarize(context.Background(), sub, now)
	if err != nil {
		t.Fatal(err)
	}
	until := untilWords(ps.PeriodEnd)
	if !strings.HasSuffix(until, " UTC") {
		t.Fatalf("until %q", until)
	}

	openDashboard(t, ctx, e, key)
	checkPage(t, ctx, "the dashboard")
	shot(t, ctx, "standing")

	// The bars: red at 133%, amber at 85%, blue at 20%.
	fills := eval[map[string]string](t, ctx, `Object.fromEntries([...document.querySelectorAll('article.sub')].flatMap(a =>
		[...a.querySelectorAll('.gauge')].map(g => [a.querySelector('h3').firstChild.textContent.trim() + ' ' + g.querySelector('.gauge-name').textContent,
			getComputedStyle(g.querySelector('rect.fill')).fill])))`)
	for name, want := range map[string]string{"echo Quota:": redFill, "chat Spending cap:": amberFill, "words Quota:": blueFill} {
		if fills[name] != want {
			t.Errorf("the %s bar is %q, want %q (all: %v)", name, fills[name], want, fills)
		}
	}
	doc := html(t, ctx)
	for _, want := range []string{
		"133% used (133 requests of 100 requests)", "quota used up until " + until,
		"85% used (8.50 in your plan's currency of 10.00 in your plan's currency)",
		"monthly quota of 100 requests.",
		"pay as you go, 2.00 in your plan's currency per 1,000 tokens, spending cap of 10.00 in your plan's currency a month.",
		"prepaid credits, 1 credit per request.", "monthly quota of 5,000 words.",
		">Active<", ">Cancelling at period end<", ">Suspended<", "Rate limit: 10/min per key.",
		"0 credits",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the dashboard lacks %q", want)
		}
	}
	for _, raw := range []string{">ACTIVE<", ">CANCELLING<", "USAGE_POSTPAID", "PER_TOKEN", "SUBSCRIPTION,"} {
		if strings.Contains(doc, raw) {
			t.Errorf("the dashboard shows the enum %q", raw)
		}
	}

	// The banner: above everything else on the page, one line per
	// refused subscription with its fix; none for chat and words.
	banner := eval[[]string](t, ctx, `[...document.querySelectorAll('.banner li')].map(li => li.textContent.trim())`)
	want := []string{
		"echo: quota used up until " + until + ". To fix: wait for the next period, or ask your provider for a larger plan.",
		"old: your subscription is suspended. To fix: ask your provider to lift the suspension.",
		"prepaid: you have 0 credits left. To fix: add credits.",
	}
	if strings.Join(banner, "\n") != strings.Join(want, "\n") {
		t.Errorf("the banner:\n%s\nwant\n%s", strings.Join(banner, "\n"), strings.Join(want, "\n"))
	}
	if first := eval[bool](t, ctx, `document.querySelector('.banner').getBoundingClientRect().top < document.querySelector('#subscriptions').getBoundingClientRect().top`); !first {
		t.Error("the banner is not at the top")
	}
}

// addOutcomes adds call outcome rows to the store as the gateway's
// counter does, one batch of a writer of the test's own.
func (e *env) addOutcomes(rows ...store.OutcomeRow) {
	e.t.Helper()
	o, ok := e.store().(store.Outcomes)
	if !ok {
		e.t.Fatal("the store keeps no call outcomes")
	}
	e.outcomeSeq++
	if _, err := o.AddOutcomes(context.Background(), store.OutcomeBatch{Writer: "test", Seq: e.outcomeSeq, Rows: rows}); err != nil {
		e.t.Fatal(err)
	}
}

// TestBrowserRefusedCalls: over a store without call outcomes, "What
// became of your calls" lists the ledger's charged and cut calls and says
// plainly that refused calls are not recorded; over the outcome rollups
// it lists the caller's refused and failed calls in words, never
// another user's, and a rate-limited service gets a "slow down: 10/min"
// banner.
func TestBrowserRefusedCalls(t *testing.T) {
	ctx := newBrowser(t)
	e := market(t, "")
	e.user("bob", "basic")
	key, _ := e.user("alice", "basic")
	e.subscribe("alice", "chat", "tokens", "ACTIVE")
	now := time.Now().UTC()
	e.charge("alice", "echo", "hello", billing.Whole(2), now, 0)
	e.charge("alice", "echo", "hello", billing.Whole(1), now, billing.Whole(3))
	e.charge("bob", "echo", "shout", billing.Whole(7), now, 0)

	// A store without outcomes: the same store with its Outcomes hidden.
	real := outcomesFor
	outcomesFor = func(st store.Store, o Operations, l []store.Rollup) outcomesSource {
		return real(struct{ store.Store }{st}, o, l)
	}
	t.Cleanup(func() { outcomesFor = real })
	openDashboard(t, ctx, e, key)
	rows := eval[[]string](t, ctx, `[...document.querySelectorAll('table.outcomes tbody tr')].map(r => [...r.cells].map(c => c.textContent).join('|'))`)
	if strings.Join(rows, "\n") != "echo|hello|Charged|1\necho|hello|Cut at a limit (charged in part)|1" {
		t.Errorf("outcomes from the ledger:\n%s", strings.Join(rows, "\n"))
	}
	if note := eval[string](t, ctx, `(document.getElementById('refusals-note') || {}).textContent || ''`); !strings.Contains(note, "their history appears here once it does") {
		t.Errorf("no plain note that refused calls are not recorded: %q", note)
	}
	if doc := html(t, ctx); strings.Contains(doc, "req-bob") || strings.Contains(doc, "slow down") {
		t.Error("bob's calls, or a rate-limit banner with no refusal")
	}

	// The outcome rollups, as the gateway counts them: alice's two
	// answered calls to echo (one of them cut at a limit, the ledger
	// says), refusals and failures; bob's refusals in the same hours.
	outcomesFor = real
	hour := now.Truncate(time.Hour)
	row := func(user, svc, ep, outcome string, calls int64) store.OutcomeRow {
		return store.OutcomeRow{OutcomeKey: store.OutcomeKey{Hour: hour, UserID: user, ServiceID: svc, EndpointID: ep, Outcome: outcome}, Calls: calls}
	}
	e.addOutcomes(
		row("alice", "chat", "complete", store.Outcome2xx, 40),
		row("alice", "chat", "complete", apierror.RateLimited, 12),
		row("alice", "echo", "hello", store.Outcome2xx, 2),
		row("alice", "echo", "hello", store.Outcome5xx, 4),
		row("alice", "echo", "hello", apierror.QuotaExceeded, 3),
		row("bob", "echo", "shout", store.Outcome2xx, 7),
		row("bob", "echo", "shout", apierror.SubscriptionInactive, 55),
		row("", "echo", "hello", apierror.InvalidKey, 66),
	)
	step(t, ctx, "reload", chromedp.Navigate(e.base+"/portal/?m=none#calls"), chromedp.WaitVisible(chromedp.ID("calls")))
	rows = eval[[]string](t, ctx, `[...document.querySelectorAll('table.outcomes tbody tr')].map(r => [...r.cells].map(c => c.textContent).join('|') + (r.classList.contains('refused') ? ' (refused)' : ''))`)
	want := "chat|complete|Charged|40\nchat|complete|Refused: too fast (rate limit)|12 (refused)\n" +
		"echo|hello|Failed at the service (not charged)|4\necho|hello|Charged|1\necho|hello|Cut at a limit (charged in part)|1\n" +
		"echo|hello|Refused: quota used up or spending cap reached|3 (refused)"
	if strings.Join(rows, "\n") != want {
		t.Errorf("outcomes with refusals:\n%s\nwant\n%s", strings.Join(rows, "\n"), want)
	}
	doc := html(t, ctx)
	for _, leak := range []string{"subscription not active", "key missing", ">55<", ">66<", ">7<"} {
		if strings.Contains(doc, leak) {
			t.Errorf("alice's page shows bob's outcomes, or a refused call of nobody's: %q", leak)
		}
	}
	banner := eval[[]string](t, ctx, `[...document.querySelectorAll('.banner li')].map(li => li.textContent.trim())`)
	if len(banner) != 1 || banner[0] != "chat: some of your calls were refused for going too fast. To fix: slow down: 10/min." {
		t.Errorf("the banner: %q", banner)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('#refusals-note').length`); n != 0 {
		t.Error("the not-recorded note with a source that records refusals")
	}
	checkPage(t, ctx, "the dashboard with refusals")
	shot(t, ctx, "outcomes")
}

// TestBrowserUsageByEndpoint: usage by endpoint and day has one chart
// with axes and one table per unit of measure (requests, tokens and
// words never summed), and none of another user's rows.
func TestBrowserUsageByEndpoint(t *testing.T) {
	ctx := newBrowser(t)
	e := market(t, "")
	key, _ := e.user("alice", "basic")
	e.subscribe("alice", "chat", "tokens", "ACTIVE")
	e.subscribe("alice", "words", "wordplan", "ACTIVE")
	e.user("bob", "basic")
	now := time.Now().UTC()
	today := now.Truncate(24 * time.Hour)
	// Today and two days ago; the period started today, so the older
	// rows are in an earlier period but within the usage section's days.
	// The ledger's times only go forward: the older row first.
	e.charge("alice", "echo", "hello", billing.Whole(4), today.Add(-48*time.Hour+time.Hour), 0)
	e.charge("alice", "echo", "hello", billing.Whole(3), now, 0)
	e.charge("alice", "echo", "shout", billing.Whole(2), now, 0)
	e.charge("alice", "chat", "complete", billing.Whole(1500), now, 0)
	e.charge("alice", "words", "translate", billing.Whole(250), now, 0)
	e.charge("bob", "echo", "hello", billing.Whole(50), now, 0)

	openDashboard(t, ctx, e, key)
	heads := eval[[]string](t, ctx, `[...document.querySelectorAll('#usage .unit h3')].map(h => h.textContent)`)
	if strings.Join(heads, "|") != "requests: 9 in all|tokens: 1,500 in all|words: 250 in all" {
		t.Errorf("units: %q", heads)
	}
	// Each chart has its own y axis: the top of requests' scale is 5, of
	// tokens' 2k, of words' 500; x labels from 30 days ago to today.
	axes := eval[[]string](t, ctx, `[...document.querySelectorAll('#usage figure.axis svg')].map(s =>
		[...s.querySelectorAll('text.ytick')].map(x => x.textContent).join(',') + ' / ' + [...s.querySelectorAll('text.xtick')].map(x => x.textContent).join(','))`)
	first, last := today.AddDate(0, 0, -(usageDays-1)).Format("2 Jan"), today.Format("2 Jan")
	mid := today.AddDate(0, 0, -(usageDays-1)+usageDays/2).Format("2 Jan")
	wantAxes := []string{
		"0,2.5,5 / " + first + "," + mid + "," + last,
		"0,1,000,2,000 / " + first + "," + mid + "," + last,
		"0,250,500 / " + first + "," + mid + "," + last,
	}
	if strings.Join(axes, "\n") != strings.Join(wantAxes, "\n") {
		t.Errorf("axes:\n%s\nwant\n%s", strings.Join(axes, "\n"), strings.Join(wantAxes, "\n"))
	}
	// Every label lies whole inside its chart: the last day's, under the
	// last bar, is not cut off at the chart's right edge.
	if cut := eval[[]string](t, ctx, `[...document.querySelectorAll('#usage figure.axis svg')].flatMap(s => { const b = s.getBoundingClientRect();
		return [...s.querySelectorAll('text')].filter(x => { const r = x.getBoundingClientRect(); return r.left < b.left - 0.5 || r.right > b.right + 0.5 }).map(x => x.textContent) })`); len(cut) > 0 {
		t.Errorf("chart labels cut off at the chart's edge: %q", cut)
	}
	rows := eval[[]string](t, ctx, `[...document.querySelectorAll('#usage table.usage')].map(t => [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.textContent).join('|')).join(';'))`)
	d0, d2 := today.Format("2 Jan 2006"), today.AddDate(0, 0, -2).Format("2 Jan 2006")
	wantRows := []string{
		d0 + "|echo|hello|1|3;" + d0 + "|echo|shout|1|2;" + d2 + "|echo|hello|1|4",
		d0 + "|chat|complete|1|1,500",
		d0 + "|words|translate|1|250",
	}
	if strings.Join(rows, "\n") != strings.Join(wantRows, "\n") {
		t.Errorf("usage tables:\n%s\nwant\n%s", strings.Join(rows, "\n"), strings.Join(wantRows, "\n"))
	}
	if doc := html(t, ctx); strings.Contains(doc, "1,759") || strings.Contains(doc, ">50<") {
		t.Error("units of different measures summed, or bob's usage shown")
	}
	checkPage(t, ctx, "usage")

	// The CSV the export form asks for, with the browser's session: the
	// five rows of alice's, none of bob's.
	query := eval[string](t, ctx, `new URLSearchParams(new FormData(document.querySelector('form.export'))).toString()`)
	csvText := e.getWithBrowserSession(t, ctx, "/portal/usage.csv?"+query)
	lines := strings.Split(strings.TrimSpace(csvText), "\n")
	if len(lines) != 6 || lines[0] != strings.Join(exportHeader, ",") {
		t.Fatalf("the CSV:\n%s", csvText)
	}
	for _, l := range lines[1:] {
		if !strings.Contains(l, ",req-alice-") || strings.Contains(l, "bob") {
			t.Errorf("a CSV line not of alice's: %q", l)
		}
	}
	if strings.Contains(csvText, "bob") || !strings.Contains(csvText, ",chat,complete,tokens,") || !strings.Contains(csvText, ",1500,tokens,0,3,money,") {
		t.Errorf("the CSV:\n%s", csvText)
	}
	// Today only: the row of two days ago is left out.
	day := today.Format(time.DateOnly)
	if got := strings.Count(strings.TrimSpace(e.getWithBrowserSession(t, ctx, "/portal/usage.csv?from="+day+"&to="+day)), "\n"); got != 4 {
		t.Errorf("today's CSV has %d rows, want 4", got)
	}
	step(t, ctx, "to usage", chromedp.Navigate(e.base+"/portal/#usage"), chromedp.WaitVisible(chromedp.ID("usage")))
	shot(t, ctx, "usage")
}

// TestBrowserCopyAndRevoke: copy buttons copy a curl line and a new key
// under the CSP (the script is the portal's own file); without script
// they stay hidden and the text selectable. Keys show when they were
// last used. Revoking a key takes two steps, both by keyboard.
func TestBrowserCopyAndRevoke(t *testing.T) {
	ctx := newBrowser(t)
	e := market(t, "allow_key_management")
	key, rec := e.user("alice", "basic")
	if _, err := chromedp.Call(ctx, cdpbrowser.SetPermission, cdpbrowser.SetPermissionParams{
		Permission: &cdpbrowser.PermissionDescriptor{Name: "clipboard-read"}, Setting: cdpbrowser.PermissionSettingGranted, Origin: e.base,
	}); err != nil {
		t.Fatalf("grant clipboard-read: %v", err)
	}
	openDashboard(t, ctx, e, key)

	// A curl line: the button is shown by copy.js and copies the line.
	step(t, ctx, "open try a call", chromedp.Click(chromedp.CSS("details.try summary")))
	line := eval[string](t, ctx, `document.getElementById('curl-echo-hello').textContent`)
	if !strings.HasPrefix(line, "curl -X POST '"+e.base+"/api/service/echo/endpoint/hello/invoke'") || !strings.Contains(line, "$PLATFORM_KEY") {
		t.Errorf("curl line %q", line)
	}
	step(t, ctx, "copy the curl line", chromedp.Click(chromedp.CSS(`button[data-copy="curl-echo-hello"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#curl-echo-hello-status`)))
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	status, _ := chromedp.Run(c, chromedp.Poll[string](`document.getElementById('curl-echo-hello-status').textContent || null`, chromedp.WithPollingTimeout(5*time.Second)))
	cancel()
	if status != "Copied" {
		t.Errorf("status after copy %q", status)
	}
	if got := eval2[string](t, ctx, `navigator.clipboard.readText()`); got != line {
		t.Errorf("the clipboard holds %q, want the curl line", got)
	}

	// Last used: the key signed in with authenticated just now; a key
	// never used says so.
	lastUsed := eval[string](t, ctx, `[...document.querySelectorAll('table.keys tbody tr')].find(r => r.textContent.includes('`+rec.ID+`')).querySelector('td[data-label="Last used"]').textContent`)
	if !strings.HasPrefix(lastUsed, time.Now().UTC().Format("2 Jan 2006")) {
		t.Errorf("last used of the session's key %q", lastUsed)
	}

	// A new key, copied from its card.
	step(t, ctx, "label", chromedp.SendKeys(chromedp.ID("label"), "laptop"))
	submit(t, ctx, "create a key", `form[action="/portal/keys"] button[type=submit]`)
	step(t, ctx, "the new key", chromedp.WaitVisible(chromedp.ID("newkey")))
	newKey := eval[string](t, ctx, `document.getElementById('newkey').value`)
	step(t, ctx, "copy the key", chromedp.Click(chromedp.CSS(`button[data-copy="newkey"]`)))
	c, cancel = context.WithTimeout(ctx, 10*time.Second)
	_, _ = chromedp.Run(c, chromedp.Poll[string](`document.getElementById('newkey-status').textContent || null`, chromedp.WithPollingTimeout(5*time.Second)))
	cancel()
	if got := eval2[string](t, ctx, `navigator.clipboard.readText()`); got != newKey || !strings.HasPrefix(got, "psk_") {
		t.Errorf("the clipboard holds %q, want the new key", got)
	}
	if curl := eval[string](t, ctx, `document.getElementById('newkey-curl').textContent`); !strings.Contains(curl, "Bearer "+newKey) {
		t.Errorf("the new key's curl line %q", curl)
	}
	checkPage(t, ctx, "the new key")
	keys, _ := e.store().ListKeys(context.Background(), "alice")
	var newID string
	for _, k := range keys {
		if k.ID != rec.ID {
			newID = k.ID
		}
	}
	step(t, ctx, "reload", chromedp.Navigate(e.base+"/portal/#keys"), chromedp.WaitVisible(chromedp.ID("keys")))
	never := eval[string](t, ctx, `[...document.querySelectorAll('table.keys tbody tr')].find(r => r.textContent.includes('`+newID+`')).querySelector('td[data-label="Last used"]').textContent`)
	if never != "Not since the gateway started" {
		t.Errorf("last used of a key never used: %q", never)
	}

	// Revoke by keyboard: focus the link, Enter; the confirmation changes
	// nothing; Enter on its button revokes.
	pressEnter(t, ctx, "open the confirmation", `a[aria-label="Revoke key `+newID+`"]`)
	step(t, ctx, "the confirmation", chromedp.WaitVisible(chromedp.CSS("form.actions")))
	checkPage(t, ctx, "the confirmation")
	shot(t, ctx, "revoke")
	if k := e.keyByID(newID); !k.RevokedAt.IsZero() {
		t.Fatal("revoked before the confirmation")
	}
	pressEnter(t, ctx, "confirm", `form.actions button[type=submit]`)
	step(t, ctx, "revoked", chromedp.WaitVisible(chromedp.CSS("p.notice")))
	if k := e.keyByID(newID); k.RevokedAt.IsZero() {
		t.Fatal("not revoked after the confirmation")
	}

	// Without script: no copy button shows, and the curl line is text a
	// caller can select.
	if _, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true}); err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "reload without script", chromedp.Navigate(e.base+"/portal/"), chromedp.WaitVisible(chromedp.ID("subscriptions")))
	if _, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: false}); err != nil {
		t.Fatal(err)
	}
	// Script runs again for the checks below, but the page was built
	// without it: copy.js never ran on it.
	shown := eval[int](t, ctx, `[...document.querySelectorAll('button[data-copy]')].filter(b => !b.hidden && b.offsetParent !== null).length`)
	selectable := eval[string](t, ctx, `getComputedStyle(document.querySelector('pre.curl')).userSelect`)
	if shown != 0 || selectable == "none" {
		t.Errorf("without script: %d copy buttons shown, user-select %q", shown, selectable)
	}
}

// eval2 evaluates a promise.
func eval2[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return v
}

// pressEnter focuses the element sel and presses Enter on it, as a
// keyboard user does, and waits for the page it loads.
func pressEnter(t *testing.T, ctx context.Context, what, sel string) {
	t.Helper()
	step(t, ctx, what+": focus", chromedp.Focus(chromedp.CSS(sel)))
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(c, chromedp.WaitEvent(cdppage.LoadEventFired, nil, chromedp.KeyEvent("\r"))); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Sizes the pages are checked at: a desktop window and a phone's.
const (
	phoneWidth, phoneHeight = 390, 844
	wideWidth, wideHeight   = 1200, 900
)

// TestBrowserPhonesAndKeyboards: at 390×844 no portal page is wider than
// the screen (sign-in, a full dashboard with the banner, usage and many
// keys, a job, the revocation's confirmation, a new key, a page that is
// not found), and the keys table becomes stacked rows with each Revoke
// in reach; each page is also shot at 1200×900. On the dashboard, Tab
// alone reaches every link, button, field and disclosure.
func TestBrowserPhonesAndKeyboards(t *testing.T) {
	ctx := newBrowser(t)
	e := market(t, "allow_key_management")
	key, rec := e.user("alice", "basic")
	e.subscribe("alice", "chat", "tokens", "ACTIVE")
	e.subscribe("alice", "prepaid", "credits", "ACTIVE")
	now := time.Now().UTC()
	e.charge("alice", "echo", "hello", billing.Whole(101), now, 0)
	e.charge("alice", "chat", "complete", billing.Whole(123456), now, billing.Whole(200000))
	for i := range 3 {
		_, h, err := servicekey.Generate()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.store().CreateKey(context.Background(), store.KeyRecord{ID: fmt.Sprintf("key-with-a-rather-long-identifier-%d-0123456789abcdef", i),
			Hash: h, UserID: "alice", Label: "a label that goes on for quite a while " + strings.Repeat("x", 40), Created: now}); err != nil {
			t.Fatal(err)
		}
	}
	job := e.job("alice", "FAILED", "the backend timed out after a long wait "+strings.Repeat("and more ", 20))

	type pageAt struct {
		name string
		open func()
	}
	goTo := func(path, wait string) func() {
		return func() { step(t, ctx, path, chromedp.Navigate(e.base+path), chromedp.WaitVisible(chromedp.CSS(wait))) }
	}
	pages := []pageAt{
		{"signin", goTo("/portal/", "#key")},
		{"dashboard", func() { openDashboard(t, ctx, e, key) }},
		{"job", goTo("/portal/jobs/"+job.ID, "dl.figures")},
		{"revoke", goTo("/portal/keys/revoke?key_id="+rec.ID, "form.actions")},
		{"notfound", goTo("/portal/nowhere", "h1")},
		{"newkey", func() {
			goTo("/portal/#keys", "#label")()
			submit(t, ctx, "create a key", `form[action="/portal/keys"] button[type=submit]`)
			step(t, ctx, "the new key", chromedp.WaitVisible(chromedp.ID("newkey")))
		}},
	}
	for _, size := range []struct {
		suffix string
		w, h   int64
	}{{"-390", phoneWidth, phoneHeight}, {"-1200", wideWidth, wideHeight}} {
		step(t, ctx, "viewport", chromedp.EmulateViewport(size.w, size.h))
		for _, p := range pages {
			if p.name == "signin" {
				// Signed out first, so the sign-in form shows.
				if _, err := chromedp.Call(ctx, network.ClearBrowserCookies, cdp.Empty{}); err != nil {
					t.Fatal(err)
				}
			}
			p.open()
			if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); size.w == phoneWidth && w > phoneWidth {
				wide := eval[[]string](t, ctx, `[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 390.5).slice(0, 5).map(e => e.outerHTML.slice(0, 100))`)
				t.Errorf("%s at %dpx is %dpx wide: %q", p.name, phoneWidth, w, wide)
			}
			shot(t, ctx, p.name+size.suffix)
			if p.name == "dashboard" && size.w == phoneWidth {
				// The keys table: stacked rows, every Revoke inside the screen.
				display := eval[string](t, ctx, `getComputedStyle(document.querySelector('table.keys td')).display`)
				right := eval[float64](t, ctx, `Math.max(...[...document.querySelectorAll('table.keys a.button')].map(a => a.getBoundingClientRect().right))`)
				if display == "table-cell" || right > phoneWidth {
					t.Errorf("keys on a phone: cells %q, a Revoke button reaching %.0fpx", display, right)
				}
				// The "this session" mark beside the key id stays one
				// line of words, not squeezed a letter or two a line.
				if lines := eval[float64](t, ctx, `(() => { const s = document.querySelector('table.keys .tag');
					return s.getBoundingClientRect().height / parseFloat(getComputedStyle(s).fontSize) })()`); lines > 2 {
					t.Errorf("the key's \"this session\" mark is %.1f times its font size high on a phone", lines)
				}
			}
		}
	}

	// Every control of the dashboard by Tab alone (desktop size).
	step(t, ctx, "dashboard", chromedp.Navigate(e.base+"/portal/"), chromedp.WaitVisible(chromedp.ID("subscriptions")))
	want := eval[int](t, ctx, `(() => { const all = [...document.querySelectorAll('a[href], button, input:not([type=hidden]), summary, select, textarea')]
		.filter(e => !e.closest('[hidden]') && !e.hidden && e.getClientRects().length > 0 && !(e.closest('details:not([open])') && e.tagName !== 'SUMMARY'));
		all.forEach((e, i) => e.dataset.kbd = i); return all.length })()`)
	if want < 10 {
		t.Fatalf("only %d controls on the dashboard", want)
	}
	reached := map[string]bool{}
	for range 2 * want {
		step(t, ctx, "tab", chromedp.KeyEvent("\t"))
		if k := eval[string](t, ctx, `document.activeElement.dataset.kbd || ''`); k != "" {
			reached[k] = true
		}
	}
	if len(reached) != want {
		missed := eval[[]string](t, ctx, `[...document.querySelectorAll('[data-kbd]')].map(e => e.dataset.kbd + ' ' + e.outerHTML.slice(0, 80))`)
		var out []string
		for _, m := range missed {
			if !reached[strings.Fields(m)[0]] {
				out = append(out, m)
			}
		}
		t.Errorf("Tab reached %d of %d controls; not: %q", len(reached), want, out)
	}
}

// getWithBrowserSession GETs path of e's site with the browser's cookies
// (its portal session) and returns the body of a 200 answer.
func (e *env) getWithBrowserSession(t *testing.T, ctx context.Context, path string) string {
	t.Helper()
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{e.base + "/portal/"}})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, e.base+path, nil)
	for _, c := range res.Cookies {
		req.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value})
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/csv") {
		t.Fatalf("GET %s: %d %s\n%s", path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return string(b)
}
