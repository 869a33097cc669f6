package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

var usageReportURL = gwBase + "/api/usage/report"

func usageReportBody(user, service, units string, ts any) string {
	if s, ok := ts.(string); ok {
		ts = strconv.Quote(s)
	}
	return fmt.Sprintf(`{"userId":%q,"serviceId":%q,"unitsUsed":%s,"timestamp":%v}`, user, service, units, ts)
}

func TestUsageReport(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	g := startGateway(t, t.TempDir(), usageCatalog(be.URL, be.URL))
	g.subscribe("u-rep", "svc", "tiny", "ACTIVE")
	now := time.Now()

	t.Run("records and describes the subscription", func(t *testing.T) {
		resp, body := usagePost(t, usageSigned{URL: usageReportURL, Secret: usageSecret,
			Body: usageReportBody("u-rep", "svc", "1.5", now.UTC().Format(time.RFC3339))})
		if resp.StatusCode != 200 {
			t.Fatalf("report: %d %s", resp.StatusCode, body)
		}
		want := `{"reportSchemaVersion":2,"status":"ok","warning":null,"userId":"u-rep","serviceId":"svc",` +
			`"billingModelType":"SUBSCRIPTION","measurementType":"PER_REQUEST","unitLabel":"request",` +
			`"breakdown":{"unitsUsed":1.5,"unitsRemaining":0.5,"totalUnitsUsedThisCycle":1.5,"isOverLimit":false,"isOverage":false,"isOverageAllowed":false}}`
		if string(body) != want {
			t.Errorf("body\n got %s\nwant %s", body, want)
		}
		es := g.ledger("u-rep")
		if len(es) != 1 || es[0].Units != 1_500_000 || es[0].Source != store.SourceReport || es[0].ProductID != "tiny" ||
			es[0].OccurredAt.Unix() != now.Unix() {
			t.Errorf("ledger %+v", es)
		}
	})

	t.Run("over the quota it is still recorded, with a warning", func(t *testing.T) {
		resp, body := usagePost(t, usageSigned{URL: gwBase + "/usage/api/v1/report", Secret: usageOldSecret,
			Body: usageReportBody("u-rep", "svc", "1", now.UnixMilli())})
		m := usageJSON(t, body)
		bd, _ := m["breakdown"].(map[string]any)
		if resp.StatusCode != 200 || m["warning"] == nil || !strings.Contains(m["warning"].(string), "quota") ||
			bd["isOverLimit"] != true || bd["totalUnitsUsedThisCycle"] != 2.5 || bd["unitsRemaining"] != 0.0 {
			t.Fatalf("over limit: %d %s", resp.StatusCode, body)
		}
		if got := ledgerSum(g.ledger("u-rep")); got != 2_500_000 {
			t.Errorf("ledger sum %v", got)
		}
	})

	t.Run("timestamp forms", func(t *testing.T) {
		g.subscribe("u-ts", "svc", "basic", "ACTIVE")
		for _, ts := range []any{
			now.Unix(),
			fmt.Sprintf("%d.25", now.Unix()),
			now.UnixMilli(),
			strconv.Quote(strconv.FormatInt(now.Unix(), 10)),
			strconv.Quote(now.UTC().Format("2006-01-02T15:04:05.000Z")),
			strconv.Quote(now.In(time.FixedZone("", 2*3600)).Format("2006-01-02T15:04:05-07:00")),
			strconv.Quote(now.UTC().Format("2006-01-02T15:04:05")),
		} {
			body := fmt.Sprintf(`{"userId":"u-ts","serviceId":"svc","unitsUsed":1,"timestamp":%v}`, ts)
			resp, out := usagePost(t, usageSigned{URL: usageReportURL, Secret: usageSecret, Body: body})
			if resp.StatusCode != 200 {
				t.Errorf("timestamp %v: %d %s", ts, resp.StatusCode, out)
			}
		}
		for _, e := range g.ledger("u-ts") {
			if d := e.OccurredAt.Sub(now.Truncate(time.Second)); d < 0 || d > time.Second {
				t.Errorf("occurredAt %v, sent %v", e.OccurredAt, now)
			}
		}
	})

	t.Run("a service owner's usage is recorded free", func(t *testing.T) {
		resp, body := usagePost(t, usageSigned{URL: usageReportURL, Secret: usageSecret,
			Body: usageReportBody("owner-1", "svc", "7", now.Unix())})
		m := usageJSON(t, body)
		if resp.StatusCode != 200 || m["billingModelType"] != nil || m["status"] != "ok" {
			t.Fatalf("owner report: %d %s", resp.StatusCode, body)
		}
		if es := g.ledger("owner-1"); len(es) != 1 || es[0].ProductID != "" || es[0].Units != billing.Whole(7) {
			t.Errorf("owner ledger %+v", es)
		}
	})

	t.Run("an idempotent report retried 10 times in parallel counts once", func(t *testing.T) {
		g.subscribe("u-idem", "svc", "tokens", "ACTIVE")
		g.subscribe("u-idem", "other", "basic", "ACTIVE")
		body := usageReportBody("u-idem", "svc", "1234.5", now.Unix())
		var wg sync.WaitGroup
		answers := make([]string, 10)
		codes := make([]int, 10)
		replayed := make([]bool, 10)
		for i := range answers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, out := usagePost(t, usageSigned{URL: usageReportURL, Secret: usageSecret, Body: body, Header: []string{"Idempotency-Key", "batch-7"}})
				answers[i], codes[i], replayed[i] = string(out), resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true"
			}()
		}
		wg.Wait()
		n := 0
		for i := range answers {
			if codes[i] != 200 || answers[i] != answers[0] {
				t.Errorf("answer %d: %d %s, first %s", i, codes[i], answers[i], answers[0])
			}
			if !replayed[i] {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d answers were not replays, want 1", n)
		}
		es := g.ledger("u-idem")
		if len(es) != 1 || es[0].Units != 1_234_500_000 || es[0].IdempotencyKey != "batch-7" || es[0].Cost != 1_234_500 {
			t.Fatalf("ledger %+v", es)
		}
		// The key is scoped to the service: another service's report with
		// the same key is its own.
		resp, out := usagePost(t, usageSigned{URL: usageReportURL, Secret: usageSecret2, Body: usageReportBody("u-idem", "other", "1", now.Unix()), Header: []string{"Idempotency-Key", "batch-7"}})
		if resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "" || len(g.ledger("u-idem")) != 2 {
			t.Errorf("other service, same key: %d %s", resp.StatusCode, out)
		}
		// A retry signs afresh: another timestamp, the same report, replayed.
		resp, out = usagePost(t, usageSigned{URL: usageReportURL, Secret: usageSecret, Body: usageReportBody("u-idem", "svc", "1234.5", now.Unix()+1), Header: []string{"Idempotency-Key", "batch-7"}})
		if resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || string(out) != answers[0] {
			t.Errorf("a retry with a new timestamp: %d %s", resp.StatusCode, out)
		}
		// The key reused for another report (another user, other units)
		// was answered with the first report's body and counted nothing,
		// silently: it is refused, and the backend can send it again
		// under a key of its own.
		g.subscribe("u-idem2", "svc", "tokens", "ACTIVE")
		for _, body := range []string{usageReportBody("u-idem2", "svc", "5", now.Unix()), usageReportBody("u-idem", "svc", "5", now.Unix())} {
			resp, out = usagePost(t, usageSigned{URL: usageReportURL, Secret: usageSecret, Body: body, Header: []string{"Idempotency-Key", "batch-7"}})
			if resp.StatusCode != 400 || errorCode(t, resp, out) != "invalid_request" || !strings.Contains(string(out), "another report") || resp.Header.Get("Idempotent-Replayed") != "" {
				t.Errorf("the key reused for %s: %d %s", body, resp.StatusCode, out)
			}
		}
		if es := g.ledger("u-idem"); len(es) != 2 || len(g.ledger("u-idem2")) != 0 {
			t.Errorf("ledger after reused keys: %+v", es)
		}
		resp, out = usagePost(t, usageSigned{URL: usageReportURL, Secret: usageSecret, Body: usageReportBody("u-idem2", "svc", "5", now.Unix()), Header: []string{"Idempotency-Key", "batch-8"}})
		if resp.StatusCode != 200 || len(g.ledger("u-idem2")) != 1 {
			t.Errorf("the report under its own key: %d %s", resp.StatusCode, out)
		}
	})

	// docs/wire-contract.md: without an Idempotency-Key a report is counted
	// each time it arrives; the very same signed bytes posted again within
	// the timestamp's window are a second report, not a replay.
	t.Run("without a key the same signed report posted twice counts twice", func(t *testing.T) {
		g.subscribe("u-nokey", "svc", "tokens", "ACTIVE")
		s := usageSigned{URL: usageReportURL, Secret: usageSecret, Timestamp: fmt.Sprint(time.Now().Unix()),
			Body: usageReportBody("u-nokey", "svc", "3", now.Unix())}
		for i := range 2 {
			if resp, out := usagePost(t, s); resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("post %d: %d %s", i+1, resp.StatusCode, out)
			}
		}
		if es := g.ledger("u-nokey"); len(es) != 2 || ledgerSum(es) != billing.Whole(6) {
			t.Fatalf("ledger %+v, want the report counted twice", es)
		}
	})

	g.subscribe("u-bad", "svc", "basic", "ACTIVE")
	nowS := now.Unix()
	ok := usageReportBody("u-bad", "svc", "1", nowS)
	rep := func(body string) usageSigned {
		return usageSigned{URL: usageReportURL, Secret: usageSecret, Body: body}
	}
	with := func(s usageSigned, f func(*usageSigned)) usageSigned { f(&s); return s }
	usageCheckRejections(t, g, "", "u-bad", "svc", []usageRejection{
		{"unsigned", with(rep(ok), func(s *usageSigned) { s.Secret = "" }), 401, "invalid_signature", ""},
		{"wrong secret", with(rep(ok), func(s *usageSigned) { s.Secret = "not-the-secret-not-the-secret-00" }), 401, "invalid_signature", ""},
		{"another service's secret", with(rep(ok), func(s *usageSigned) { s.Secret = usageSecret2 }), 401, "invalid_signature", ""},
		{"tampered body", with(rep(usageReportBody("u-bad", "svc", "100", nowS)), func(s *usageSigned) { s.SignBody = &ok }), 401, "invalid_signature", ""},
		{"unknown service", rep(usageReportBody("u-bad", "nope", "1", nowS)), 401, "invalid_signature", ""},
		{"stale timestamp", with(rep(ok), func(s *usageSigned) { s.Timestamp = strconv.FormatInt(nowS-600, 10) }), 401, "stale_timestamp", ""},
		{"future timestamp", with(rep(ok), func(s *usageSigned) { s.Timestamp = strconv.FormatInt(nowS+600, 10) }), 401, "stale_timestamp", ""},
		{"bad JSON", rep(`{"userId":`), 400, "invalid_request", "body"},
		{"no serviceId", rep(`{"userId":"u-bad","unitsUsed":1,"timestamp":1}`), 400, "invalid_request", "serviceId"},
		{"no userId", rep(`{"serviceId":"svc","unitsUsed":1,"timestamp":` + strconv.FormatInt(nowS, 10) + `}`), 400, "invalid_request", "userId"},
		{"userId a number", rep(`{"userId":7,"serviceId":"svc","unitsUsed":1,"timestamp":` + strconv.FormatInt(nowS, 10) + `}`), 400, "invalid_request", "userId"},
		{"zero units", rep(usageReportBody("u-bad", "svc", "0", nowS)), 400, "invalid_request", "unitsUsed"},
		{"negative units", rep(usageReportBody("u-bad", "svc", "-1", nowS)), 400, "invalid_request", "unitsUsed"},
		{"units a boolean", rep(usageReportBody("u-bad", "svc", "true", nowS)), 400, "invalid_request", "unitsUsed"},
		{"seven decimals", rep(usageReportBody("u-bad", "svc", "0.0000001", nowS)), 400, "invalid_request", "unitsUsed"},
		{"no timestamp", rep(`{"userId":"u-bad","serviceId":"svc","unitsUsed":1}`), 400, "invalid_request", "timestamp"},
		{"timestamp in the future", rep(usageReportBody("u-bad", "svc", "1", nowS+3600)), 400, "invalid_request", "timestamp"},
		{"timestamp not a date", rep(usageReportBody("u-bad", "svc", "1", "last tuesday")), 400, "invalid_request", "timestamp"},
		{"no subscription", rep(usageReportBody("u-nobody", "svc", "1", nowS)), 403, "no_subscription", ""},
		{"oversized", rep(`{"userId":"u-bad","serviceId":"svc","unitsUsed":1,"timestamp":1,"pad":"` + strings.Repeat("x", 5000) + `"}`), 413, "payload_too_large", ""},
		{"bad idempotency key", with(rep(ok), func(s *usageSigned) { s.Header = []string{"Idempotency-Key", strings.Repeat("k", 300)} }), 400, "invalid_request", "Idempotency-Key"},
	})
	if es := g.ledger("u-nobody"); len(es) != 0 {
		t.Errorf("refused report recorded: %+v", es)
	}
	resp, body := call(t, "GET", usageReportURL, "", "")
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET report: %d %s", resp.StatusCode, body)
	}
}
