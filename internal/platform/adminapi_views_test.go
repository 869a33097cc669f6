package platform

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// viewPage is a listing page as the admin API sends it.
type viewPage struct {
	Subscriptions []store.Subscription `json:"subscriptions"`
	Jobs          []store.Job          `json:"jobs"`
	NextCursor    string               `json:"nextCursor"`
}

// admPages follows a listing's cursors to the end and returns every page.
func admPages(t *testing.T, path string, q url.Values) []viewPage {
	t.Helper()
	var pages []viewPage
	for range 10000 { // bounded: far more pages than any test makes
		r := admJSON(t, "GET", path+"?"+q.Encode(), "")
		if r.status != 200 {
			t.Fatalf("GET %s?%s: %d %s", path, q.Encode(), r.status, r.body)
		}
		var p viewPage
		r.decode(t, &p)
		pages = append(pages, p)
		if p.NextCursor == "" {
			return pages
		}
		q.Set("cursor", p.NextCursor)
	}
	t.Fatal("the listing never ended")
	return nil
}

// A user's subscriptions (404 before), and every user's, page by page
// over many rows; bad paging parameters are JSON errors and change nothing.
func TestAdminListSubscriptions(t *testing.T) {
	env := admStart(t)
	ctx := context.Background()
	ds := env.app.DataStore()

	if r := admJSON(t, "PUT", "/platform/subscriptions/alice/weather", `{"productId":"pro"}`); r.status != 200 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}
	const users = 257
	for i := range users {
		if _, err := ds.PutSubscription(ctx, store.Subscription{
			UserID: fmt.Sprintf("user-%03d", i), ServiceID: "weather", ProductID: "basic", Status: "ACTIVE", UpdatedAt: time.Now(),
		}); err != nil {
			t.Fatal(err)
		}
	}

	r := admJSON(t, "GET", "/platform/subscriptions/alice", "")
	var one viewPage
	r.decode(t, &one)
	if r.status != 200 || len(one.Subscriptions) != 1 || one.Subscriptions[0].ProductID != "pro" || one.NextCursor != "" {
		t.Fatalf("GET /platform/subscriptions/alice: %d %s", r.status, r.body)
	}
	r = admJSON(t, "GET", "/platform/subscriptions/nobody", "")
	if r.status != 200 || strings.TrimSpace(string(r.body)) != `{"subscriptions":[]}` {
		t.Errorf("a user without subscriptions: %d %s", r.status, r.body)
	}

	// Every user's, 50 a page: each once, in order, no page over 50.
	pages := admPages(t, "/platform/subscriptions", url.Values{"limit": {"50"}})
	var seen []string
	for _, p := range pages {
		if len(p.Subscriptions) > 50 {
			t.Fatalf("a page of %d", len(p.Subscriptions))
		}
		for _, s := range p.Subscriptions {
			seen = append(seen, s.UserID)
		}
	}
	if len(seen) != users+1 || !slices.IsSorted(seen) || len(slices.Compact(slices.Clone(seen))) != len(seen) {
		t.Fatalf("paged through %d subscriptions (%d pages), want %d distinct in order", len(seen), len(pages), users+1)
	}
	if len(pages) != (users+1+49)/50 {
		t.Errorf("%d pages for %d rows at 50", len(pages), users+1)
	}
	// One user's with a page of one, and ?userId= on the collection.
	if p := admPages(t, "/platform/subscriptions/user-007", url.Values{"limit": {"1"}}); len(p) != 1 || len(p[0].Subscriptions) != 1 {
		t.Errorf("user-007's subscriptions: %+v", p)
	}
	if p := admPages(t, "/platform/subscriptions", url.Values{"userId": {"alice"}}); len(p) != 1 || len(p[0].Subscriptions) != 1 {
		t.Errorf("?userId=alice: %+v", p)
	}

	first := admJSON(t, "GET", "/platform/subscriptions?limit=2", "")
	var fp viewPage
	first.decode(t, &fp)
	for _, bad := range []struct{ path, field string }{
		{"/platform/subscriptions?limit=0", "limit"},
		{"/platform/subscriptions?limit=1001", "limit"},
		{"/platform/subscriptions?limit=ten", "limit"},
		{"/platform/subscriptions?limit=1&limit=2", "limit"},
		{"/platform/subscriptions?cursor=%25%25not-base64", "cursor"},
		{"/platform/subscriptions/alice?cursor=" + fp.NextCursor, "cursor"}, // another listing's cursor
		{"/platform/subscriptions?user=alice", "user"},
		{"/platform/subscriptions/alice?userId=bob", "userId"},
		{"/platform/subscriptions/%20alice", "userId"},
	} {
		admExpectError(t, admJSON(t, "GET", bad.path, ""), 400, "invalid_request", bad.field)
	}
	admExpectError(t, admJSON(t, "POST", "/platform/subscriptions", `{}`), 405, "method_not_allowed", "")
	admExpectError(t, admJSON(t, "DELETE", "/platform/subscriptions/alice", ""), 405, "method_not_allowed", "")
	if subs, _, err := ds.ListSubscriptions(ctx, "", "", 1000); err != nil || len(subs) != users+1 {
		t.Errorf("after the refused requests: %d subscriptions, %v", len(subs), err)
	}
}

// The period summary: units used, quota left, credits, spend against the
// cap, period bounds; and the answer to a product change shows the
// current period under the new product.
func TestAdminUserSummary(t *testing.T) {
	env := admStartProducts(t, `,{"id": "capped", "billing_model": "USAGE_POSTPAID", "measurement_type": "PER_TOKEN", "unit_label": "token", "price": 0.5, "spending_cap": 10, "period": "day"}`)
	ctx := context.Background()
	ds := env.app.DataStore()

	r := admJSON(t, "PUT", "/platform/subscriptions/alice/weather", `{"productId":"pro"}`)
	var sub ops.SubscriptionChange
	r.decode(t, &sub)
	if r.status != 200 || sub.CurrentPeriod == nil || sub.PreviousProductID != "" || sub.CurrentPeriod.UnitsUsed != 0 {
		t.Fatalf("subscribe: %d %s", r.status, r.body)
	}
	pro, _ := mustService(t, env).Product("pro")
	for range 3 {
		a := store.Account{UserID: "alice", ServiceID: "weather", Product: *pro}
		e := store.LedgerEntry{Time: time.Now(), UserID: "alice", ServiceID: "weather", ProductID: "pro", Units: billing.Whole(5), Source: store.SourceReport}
		if _, err := ds.Record(ctx, a, e, func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
			t.Fatal(err)
		}
	}

	r = admJSON(t, "GET", "/platform/users/alice/summary", "")
	var sum ops.UserSummary
	r.decode(t, &sum)
	if r.status != 200 || len(sum.Subscriptions) != 1 {
		t.Fatalf("summary: %d %s", r.status, r.body)
	}
	ps := sum.Subscriptions[0]
	if ps.ProductID != "pro" || ps.UnitsUsed != billing.Whole(15) || ps.Quota == nil || *ps.Quota != billing.Whole(1000) ||
		ps.UnitsRemaining == nil || *ps.UnitsRemaining != billing.Whole(985) || ps.BillingModel != "SUBSCRIPTION" ||
		!ps.PeriodStart.Equal(sub.StartedAt) || !ps.PeriodEnd.Equal(sub.StartedAt.AddDate(0, 1, 0)) {
		t.Errorf("summary of pro: %s", r.body)
	}

	// A change of product: the answer says from what, and what the
	// current period now is: the 15 units stay, now against basic.
	r = admJSON(t, "PUT", "/platform/subscriptions/alice/weather", `{"productId":"basic"}`)
	sub = ops.SubscriptionChange{}
	r.decode(t, &sub)
	if r.status != 200 || sub.PreviousProductID != "pro" || sub.CurrentPeriod == nil ||
		sub.CurrentPeriod.ProductID != "basic" || sub.CurrentPeriod.UnitsUsed != billing.Whole(15) || sub.CurrentPeriod.Quota != nil {
		t.Errorf("product change answer: %s", r.body)
	}
	if !strings.Contains(string(r.body), `"startedAt"`) || !strings.Contains(string(r.body), `"credits"`) {
		t.Errorf("the change answer lost the subscription's fields: %s", r.body)
	}
	if _, err := ds.AddCredits(ctx, "alice", "weather", -billing.Whole(2), time.Now()); err != nil {
		t.Fatal(err)
	}
	// A daily product with a spending cap: spend against it.
	if r = admJSON(t, "PUT", "/platform/subscriptions/alice/weather", `{"productId":"capped"}`); r.status != 200 {
		t.Fatalf("change to capped: %d %s", r.status, r.body)
	}
	capped, _ := mustService(t, env).Product("capped")
	a := store.Account{UserID: "alice", ServiceID: "weather", Product: *capped}
	e := store.LedgerEntry{Time: time.Now(), UserID: "alice", ServiceID: "weather", ProductID: "capped", Units: billing.Whole(4), Source: store.SourceReport}
	if _, err := ds.Record(ctx, a, e, func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
		t.Fatal(err)
	}
	// Decoded as the CLI does: credits below zero are no billing.Units.
	r = admJSON(t, "GET", "/platform/users/alice/summary?serviceId=weather", "")
	var exact struct{ Subscriptions []cliPeriod }
	r.decode(t, &exact)
	if cp := exact.Subscriptions[0]; cp.Spend != "2" || cp.SpendingCap != "10" || cp.SpendRemaining != "8" || cp.Credits != "-2" ||
		cp.Quota != "" || cp.PeriodEnd.Sub(cp.PeriodStart) != 24*time.Hour || cp.UnitLabel != "token" {
		t.Errorf("summary of capped: %s", r.body)
	}
	if cp := exact.Subscriptions[0]; cp.CallsCutAtLimit != 0 {
		t.Errorf("calls cut before any was: %s", r.body)
	}
	// A call whose backend states 30 tokens with 16 left under the cap:
	// 16 are charged, the row says 30 were stated and 14 went uncharged,
	// and the summary counts the call.
	res, err := ds.Reserve(ctx, a, billing.Whole(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("hold: %v %+v", err, res.Decision)
	}
	cut, err := ds.Settle(ctx, res, billing.Whole(30), store.LedgerEntry{Time: time.Now(), UserID: "alice", ServiceID: "weather",
		ProductID: "capped", Source: store.SourceGateway})
	if err != nil || cut.Units != billing.Whole(16) || cut.UnitsClaimed != billing.Whole(30) {
		t.Fatalf("settle past the cap: %v %+v", err, cut)
	}
	r = admJSON(t, "GET", "/platform/users/alice/summary?serviceId=weather", "")
	exact.Subscriptions = nil
	r.decode(t, &exact)
	if cp := exact.Subscriptions[0]; cp.CallsCutAtLimit != 1 || cp.SpendRemaining != "0" {
		t.Errorf("summary after a call cut at the cap: %s", r.body)
	}
	r = admJSON(t, "GET", "/platform/usage?userId=alice&format=ndjson", "")
	if lines := strings.Split(strings.TrimSpace(string(r.body)), "\n"); r.status != 200 ||
		!strings.Contains(lines[len(lines)-1], `"units":16,`) || !strings.Contains(lines[len(lines)-1], `"unitsClaimed":30,"unitsUncharged":14}`) {
		t.Errorf("the export of a cut call: %d %s", r.status, r.body)
	}
	// A time before the subscription: that period, nothing used.
	r = admJSON(t, "GET", "/platform/users/alice/summary?at=2020-01-01", "")
	var old struct {
		At            time.Time
		Subscriptions []cliPeriod
	}
	r.decode(t, &old)
	if r.status != 200 || old.Subscriptions[0].UnitsUsed != "0" || !old.At.Equal(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("summary at 2020-01-01: %s", r.body)
	}
	if r = admJSON(t, "GET", "/platform/users/bob/summary", ""); r.status != 200 || !strings.Contains(string(r.body), `"subscriptions":[]`) {
		t.Errorf("summary of a user without subscriptions: %d %s", r.status, r.body)
	}

	before, _ := ds.GetSubscription(ctx, "alice", "weather")
	for _, bad := range []struct{ path, field string }{
		{"/platform/users/alice/summary?at=yesterday", "at"},
		{"/platform/users/alice/summary?serviceId=a%20b", "serviceId"},
		{"/platform/users/alice/summary?service=weather", "service"},
		{"/platform/users/alice/summary?at=2026-01-01&at=2026-02-01", "at"},
	} {
		admExpectError(t, admJSON(t, "GET", bad.path, ""), 400, "invalid_request", bad.field)
	}
	admExpectError(t, admJSON(t, "GET", "/platform/users/alice/summary?serviceId=other", ""), 404, "not_found", "")
	admExpectError(t, admJSON(t, "POST", "/platform/users/alice/summary", "{}"), 405, "method_not_allowed", "")
	// A refused product change leaves the subscription as it was.
	admExpectError(t, admJSON(t, "PUT", "/platform/subscriptions/alice/weather", `{"productId":"gold"}`), 400, "invalid_request", "productId")
	if after, _ := ds.GetSubscription(ctx, "alice", "weather"); after != before {
		t.Errorf("refused requests changed the subscription: %+v, was %+v", after, before)
	}
}

// Jobs by user, service and state, page by page over many.
func TestAdminListJobs(t *testing.T) {
	env := admStart(t)
	ctx := context.Background()
	ds := env.app.DataStore()
	now := time.Now().UTC()
	const n = 240
	want := map[string]int{}
	for i := range n {
		user := []string{"u1", "u2", "u3"}[i%3]
		status := []string{store.JobPending, store.JobRunning, store.JobCompleted, store.JobFailed}[i%4]
		j := store.Job{
			ID: fmt.Sprintf("job-%04d", i), UserID: user, ServiceID: "weather", EndpointID: "forecast",
			Status: status, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
		}
		if err := ds.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
		want[user+"/"+status]++
		want[user+"/"]++
		want["/"+status]++
	}

	count := func(q url.Values) (int, int) {
		rows := 0
		pages := admPages(t, "/platform/jobs", q)
		for _, p := range pages {
			for _, j := range p.Jobs {
				if (q.Get("userId") != "" && j.UserID != q.Get("userId")) || (q.Get("status") != "" && j.Status != strings.ToUpper(q.Get("status"))) {
					t.Fatalf("%v listed %+v", q, j)
				}
			}
			rows += len(p.Jobs)
		}
		return rows, len(pages)
	}
	if rows, pages := count(url.Values{"limit": {"25"}}); rows != n || pages != n/25+1 && pages != n/25 {
		t.Errorf("all jobs: %d in %d pages", rows, pages)
	}
	for _, q := range []url.Values{
		{"status": {"PENDING"}, "limit": {"7"}},
		{"status": {"failed"}},
		{"userId": {"u2"}, "limit": {"10"}},
		{"userId": {"u3"}, "status": {"RUNNING"}, "serviceId": {"weather"}, "limit": {"3"}},
	} {
		key := q.Get("userId") + "/" + strings.ToUpper(q.Get("status"))
		if rows, _ := count(q); rows != want[key] {
			t.Errorf("%v: %d jobs, want %d", q, rows, want[key])
		}
	}
	if rows, _ := count(url.Values{"serviceId": {"other"}}); rows != 0 {
		t.Errorf("jobs of another service: %d", rows)
	}
	for _, bad := range []struct{ path, field string }{
		{"/platform/jobs?status=DONE", "status"},
		{"/platform/jobs?limit=-1", "limit"},
		{"/platform/jobs?cursor=***", "cursor"},
		{"/platform/jobs?userId=a%2Fb", "userId"},
		{"/platform/jobs?state=PENDING", "state"},
	} {
		admExpectError(t, admJSON(t, "GET", bad.path, ""), 400, "invalid_request", bad.field)
	}
	// The single-job route still answers.
	if r := admJSON(t, "GET", "/platform/jobs/job-0001", ""); r.status != 200 {
		t.Errorf("GET /platform/jobs/job-0001: %d %s", r.status, r.body)
	}
}

// admStartProducts is admStart with extra products on the service.
func admStartProducts(t *testing.T, extraProducts string) *admEnv {
	t.Helper()
	env := &admEnv{t: t}
	admTester(t).InitServer(env.config(t.TempDir(), extraProducts), "json")
	if t.Failed() {
		t.FailNow()
	}
	env.app = admActiveApp(t)
	t.Cleanup(env.stop)
	return env
}

func mustService(t *testing.T, env *admEnv) *catalog.Service {
	t.Helper()
	svc, ok := env.app.Catalog().Service("weather")
	if !ok {
		t.Fatal("no service weather")
	}
	return svc
}

// TestSummaryNamesCostUnit: the period summary's spend and spending cap
// are money in the product's listing currency, or credits for PREPAID.
// The summary, and `caddy platform subscription show` reading it, gave
// bare numbers ("Spend: 2 of cap 10, 8 left"), where the usage export
// names the cost's unit beside every cost (costUnit).
func TestSummaryNamesCostUnit(t *testing.T) {
	env := admStartProducts(t, `,{"id": "capped", "billing_model": "USAGE_POSTPAID", "measurement_type": "PER_TOKEN", "unit_label": "token", "price": 0.5, "spending_cap": 10}],
		"product_listings": [{"product": "capped", "currency": "EUR"}`)
	ctx := context.Background()
	ds := env.app.DataStore()
	cliMust(t, "subscribe", "--user", "alice", "--service", "weather", "--product", "capped")
	capped, _ := mustService(t, env).Product("capped")
	a := store.Account{UserID: "alice", ServiceID: "weather", Product: *capped}
	e := store.LedgerEntry{Time: time.Now(), UserID: "alice", ServiceID: "weather", ProductID: "capped", Units: billing.Whole(4), Source: store.SourceReport}
	if _, err := ds.Record(ctx, a, e, func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
		t.Fatal(err)
	}
	r := admJSON(t, "GET", "/platform/users/alice/summary", "")
	if !strings.Contains(string(r.body), `"spend":2,`) || !strings.Contains(string(r.body), `"costUnit":"EUR"`) {
		t.Errorf("summary of a EUR product: %d %s", r.status, r.body)
	}
	if out := cliMust(t, "subscription", "show", "--user", "alice", "--service", "weather"); !strings.Contains(out, "Spend:   2 EUR of cap 10 EUR, 8 EUR left") {
		t.Errorf("subscription show:\n%s", out)
	}
	cliMust(t, "subscribe", "--user", "bob", "--service", "weather", "--product", "basic")
	r = admJSON(t, "GET", "/platform/users/bob/summary", "")
	if !strings.Contains(string(r.body), `"costUnit":"credits"`) {
		t.Errorf("summary of a PREPAID product: %d %s", r.status, r.body)
	}
	if out := cliMust(t, "subscription", "show", "--user", "bob", "--service", "weather"); !strings.Contains(out, "Spend:   0 credits") {
		t.Errorf("subscription show of PREPAID:\n%s", out)
	}
	// A product whose listing names no currency: a bare number, as before.
	cliMust(t, "subscribe", "--user", "carol", "--service", "weather", "--product", "pro")
	if r = admJSON(t, "GET", "/platform/users/carol/summary", ""); strings.Contains(string(r.body), "costUnit") {
		t.Errorf("summary without a currency: %s", r.body)
	}
}

// TestJobNamesCostUnit: a job's cost in GET /platform/jobs/{id} and
// GET /platform/jobs is named by its unit (costUnit), as a row of the
// usage export is: money in the listing's currency, credits for PREPAID.
func TestJobNamesCostUnit(t *testing.T) {
	env := admStartProducts(t, `,{"id": "capped", "billing_model": "USAGE_POSTPAID", "measurement_type": "PER_TOKEN", "unit_label": "token", "price": 0.5}],
		"product_listings": [{"product": "capped", "currency": "EUR"}`)
	ctx := context.Background()
	now := time.Now().UTC()
	for id, product := range map[string]string{"job-eur": "capped", "job-credits": "basic"} {
		j := store.Job{ID: id, UserID: "alice", ServiceID: "weather", EndpointID: "forecast", ProductID: product,
			Status: store.JobCompleted, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour), Units: billing.Whole(4), Cost: billing.Whole(2)}
		if err := env.app.DataStore().CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	if r := admJSON(t, "GET", "/platform/jobs/job-eur", ""); !strings.Contains(string(r.body), `"cost":2,"costUnit":"EUR"`) {
		t.Errorf("job of a EUR product: %d %s", r.status, r.body)
	}
	if r := admJSON(t, "GET", "/platform/jobs/job-credits", ""); !strings.Contains(string(r.body), `"cost":2,"costUnit":"credits"`) {
		t.Errorf("job of a PREPAID product: %d %s", r.status, r.body)
	}
	if r := admJSON(t, "GET", "/platform/jobs?userId=alice", ""); strings.Count(string(r.body), `"costUnit"`) != 2 {
		t.Errorf("job list: %d %s", r.status, r.body)
	}
}
