package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
)

// TestUsageDuplicateFields sends report, progress and completion bodies
// that give a field twice. encoding/json keeps the last: a report of
// {"unitsUsed":1,"unitsUsed":1000} was charged 1000 where a proxy, a log
// or the backend's own reconciliation read 1. They are refused, as the
// admin API refuses them, and change nothing.
func TestUsageDuplicateFields(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	g := startGateway(t, t.TempDir(), usageCatalog(be.URL, be.URL))
	key, _ := g.newKey("u-dup")
	g.subscribe("u-dup", "svc", "tokens", "ACTIVE")
	acc, env := usageStart(t, be, asyncURL("/api", "svc", "job"), key, "x")
	ts := usageURLTimestamp(t, env.CallbackURL)
	now := strconv.FormatInt(time.Now().Unix(), 10)

	rep := func(body string) usageSigned {
		return usageSigned{URL: usageReportURL, Secret: usageSecret, Body: body}
	}
	job := func(url, body string) usageSigned {
		return usageSigned{URL: url, Secret: usageSecret, Body: body, Timestamp: ts}
	}
	usageCheckRejections(t, g, acc.RequestID, "u-dup", "svc", []usageRejection{
		{"report unitsUsed twice", rep(`{"userId":"u-dup","serviceId":"svc","unitsUsed":1,"unitsUsed":1000,"timestamp":` + now + `}`), 400, "invalid_request", "unitsUsed"},
		{"report userId twice", rep(`{"userId":"u-other","serviceId":"svc","userId":"u-dup","unitsUsed":1,"timestamp":` + now + `}`), 400, "invalid_request", "userId"},
		{"report serviceId twice", rep(`{"userId":"u-dup","serviceId":"other","serviceId":"svc","unitsUsed":1,"timestamp":` + now + `}`), 400, "invalid_request", "serviceId"},
		{"report name escaped", rep(`{"userId":"u-dup","serviceId":"svc","unitsUsed":1,"units\u0055sed":1000,"timestamp":` + now + `}`), 400, "invalid_request", "unitsUsed"},
		{"report timestamp twice", rep(`{"userId":"u-dup","serviceId":"svc","unitsUsed":1,"timestamp":` + now + `,"timestamp":1}`), 400, "invalid_request", "timestamp"},
		{"progress stage twice", job(acc.ProgressURL, `{"stage":"a","stage":"b","percentageComplete":5,"timestamp":`+ts+`}`), 400, "invalid_request", "stage"},
		{"completion units twice", job(acc.CallbackURL, `{"status":"COMPLETED","units":1,"units":1000,"timestamp":`+ts+`}`), 400, "invalid_request", "units"},
		{"completion status twice", job(acc.CallbackURL, `{"status":"FAILED","status":"COMPLETED","units":5,"timestamp":`+ts+`}`), 400, "invalid_request", "status"},
	})

	// A field of a nested value (a result sent as a JSON object) is the
	// backend's data, kept as it was sent; only the body's own fields
	// count.
	resp, body := usagePost(t, job(acc.CallbackURL, `{"status":"COMPLETED","result":{"a":1,"a":2},"units":3,"timestamp":`+ts+`}`))
	if resp.StatusCode != 200 {
		t.Fatalf("completion with a nested repeated name: %d %s", resp.StatusCode, body)
	}
	if es := g.ledger("u-dup"); len(es) != 1 || es[0].Units != 3_000_000 {
		t.Errorf("ledger %+v", es)
	}
}

// TestUsageRepeatedHeaders sends reports with a header that matters
// given twice. Idempotency-Key: a then b was claimed as "a" and the same
// report with b then a (a proxy that reorders, or joins and splits) as
// "b": counted twice under one logical key. Two signatures or two
// timestamps: only the first was checked. Each is refused, nothing
// recorded.
func TestUsageRepeatedHeaders(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	g := startGateway(t, t.TempDir(), usageCatalog(be.URL, be.URL))
	g.subscribe("u-hdr", "svc", "tokens", "ACTIVE")
	nowS := time.Now().Unix()
	body := usageReportBody("u-hdr", "svc", "2", nowS)
	tsNow := strconv.FormatInt(nowS, 10)
	good := func(hdr ...string) usageSigned {
		return usageSigned{URL: usageReportURL, Secret: usageSecret, Body: body, Timestamp: tsNow, Header: hdr}
	}
	sig := func(ts string) string { return e2etest.UsageSign(usageSecret, []byte(body), ts) }
	usageCheckRejections(t, g, "", "u-hdr", "svc", []usageRejection{
		{"two idempotency keys", good("Idempotency-Key", "a", "Idempotency-Key", "b"), 400, "invalid_request", "Idempotency-Key"},
		{"two idempotency keys, other order", good("Idempotency-Key", "b", "Idempotency-Key", "a"), 400, "invalid_request", "Idempotency-Key"},
		{"two signatures", good("X-Platform-Signature", sig("1")), 401, "invalid_signature", ""},
		{"two timestamps", good("X-Platform-Timestamp", "1"), 401, "invalid_signature", ""},
	})
	if es := g.ledger("u-hdr"); len(es) != 0 {
		t.Errorf("recorded: %+v", es)
	}
	// One of each is recorded.
	resp, out := usagePost(t, good("Idempotency-Key", "a"))
	if resp.StatusCode != 200 || len(g.ledger("u-hdr")) != 1 {
		t.Fatalf("report: %d %s", resp.StatusCode, out)
	}
}

// TestUsageTimestampBefore1970 sends a report whose body timestamp lies
// before the Unix epoch. "0000-01-01T00:00:00+01:00" was recorded with an
// occurredAt of year -1, and from then on the user's usage export
// (GET /platform/usage) failed with 500 for every page holding it;
// "0001-01-01T00:00:00Z" was recorded without any occurredAt. Such
// timestamps are refused, as epoch numbers before 1970 cannot be written.
func TestUsageTimestampBefore1970(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	g := startGateway(t, t.TempDir(), usageCatalog(be.URL, be.URL))
	g.subscribe("u-old", "svc", "tokens", "ACTIVE")
	rep := func(ts string) usageSigned {
		return usageSigned{URL: usageReportURL, Secret: usageSecret, Body: usageReportBody("u-old", "svc", "1", ts)}
	}
	usageCheckRejections(t, g, "", "u-old", "svc", []usageRejection{
		{"year -1", rep("0000-01-01T00:00:00+01:00"), 400, "invalid_request", "timestamp"},
		{"year 0", rep("0000-06-01T00:00:00Z"), 400, "invalid_request", "timestamp"},
		{"year 1", rep("0001-01-01T00:00:00Z"), 400, "invalid_request", "timestamp"},
		{"1969", rep("1969-12-31T23:59:59Z"), 400, "invalid_request", "timestamp"},
	})
	// The epoch itself, and a year-old report, are taken: the body's
	// timestamp says when the usage happened; the period is the one the
	// report arrives in.
	for _, ts := range []string{"1970-01-01T00:00:00Z", time.Now().AddDate(-1, 0, 0).UTC().Format(time.RFC3339)} {
		resp, out := usagePost(t, rep(ts))
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", ts, resp.StatusCode, out)
		}
	}
	resp, out := call(t, "GET", fmt.Sprintf("http://localhost:%d/platform/usage?userId=u-old", adminPort), "", "")
	if resp.StatusCode != 200 || strings.Count(string(out), `"occurredAt"`) != 2 {
		t.Errorf("export: %d %s", resp.StatusCode, out)
	}
}
