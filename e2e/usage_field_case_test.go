package e2e

import (
	"strconv"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestUsageFieldNamesInAnotherCase: a backend whose JSON serialiser
// writes PascalCase (.NET's default, a Java record without
// annotations) posts {"Status":"FAILED","ErrorMessage":"…"} or
// {"Status":"COMPLETED","Units":7}. The gateway read field names
// exactly and took them for unknown fields: the failed job was
// COMPLETED and charged its cost, the 7 tokens were never charged (no
// ledger row), both answered 200. And {"unitsUsed":1,"UnitsUsed":1000}
// was charged 1 where encoding/json, which matches names in any case
// and keeps the last, reads 1000. A name that differs from a field of
// the route only in case (Unicode simple folding, as encoding/json
// folds: "ſtatus" is status to it) is refused, naming the field, and
// changes nothing. So is a completion stating its units as
// "unitsUsed", the usage report's name for them: read as an unknown
// field, the job was COMPLETED with its 7 tokens never charged.
func TestUsageFieldNamesInAnotherCase(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	g := startGateway(t, t.TempDir(), usageCatalog(be.URL, be.URL))
	const user = "u-case"
	key, _ := g.newKey(user)
	g.subscribe(user, "svc", "tokens", "ACTIVE")
	acc, env := usageStart(t, be, asyncURL("/api", "svc", "job"), key, "x")
	ts := usageURLTimestamp(t, env.CallbackURL)
	now := strconv.FormatInt(time.Now().Unix(), 10)

	rep := func(body string) usageSigned {
		return usageSigned{URL: usageReportURL, Secret: usageSecret, Body: body}
	}
	job := func(url, body string) usageSigned {
		return usageSigned{URL: url, Secret: usageSecret, Body: body, Timestamp: ts}
	}
	usageCheckRejections(t, g, acc.RequestID, user, "svc", []usageRejection{
		{"completion Status FAILED", job(acc.CallbackURL, `{"Status":"FAILED","ErrorMessage":"out of memory","timestamp":`+ts+`}`), 400, "invalid_request", "status"},
		{"completion Units", job(acc.CallbackURL, `{"Status":"COMPLETED","Units":7,"timestamp":`+ts+`}`), 400, "invalid_request", "status"},
		{"completion Units alone", job(acc.CallbackURL, `{"status":"COMPLETED","Units":7,"timestamp":`+ts+`}`), 400, "invalid_request", "units"},
		{"completion units and UNITS", job(acc.CallbackURL, `{"status":"COMPLETED","units":1,"UNITS":1000,"timestamp":`+ts+`}`), 400, "invalid_request", "units"},
		{"completion long s", job(acc.CallbackURL, `{"ſtatus":"FAILED","units":7,"timestamp":`+ts+`}`), 400, "invalid_request", "status"},
		{"completion ErrorMessage", job(acc.CallbackURL, `{"status":"COMPLETED","units":7,"ErrorMessage":"x","timestamp":`+ts+`}`), 400, "invalid_request", "errorMessage"},
		{"completion unitsUsed", job(acc.CallbackURL, `{"status":"COMPLETED","unitsUsed":7,"timestamp":`+ts+`}`), 400, "invalid_request", "units"},
		{"completion UnitsUsed beside units", job(acc.CallbackURL, `{"status":"COMPLETED","units":7,"UnitsUsed":70,"timestamp":`+ts+`}`), 400, "invalid_request", "units"},
		{"progress Stage", job(acc.ProgressURL, `{"Stage":"a","stage":"b","percentageComplete":5,"timestamp":`+ts+`}`), 400, "invalid_request", "stage"},
		{"report UnitsUsed", rep(`{"userId":"` + user + `","serviceId":"svc","unitsUsed":1,"UnitsUsed":1000,"timestamp":` + now + `}`), 400, "invalid_request", "unitsUsed"},
		{"report UserId", rep(`{"userId":"` + user + `","serviceId":"svc","UserId":"u-other","unitsUsed":1,"timestamp":` + now + `}`), 400, "invalid_request", "userId"},
		{"report Timestamp", rep(`{"userId":"` + user + `","serviceId":"svc","unitsUsed":1,"timestamp":` + now + `,"Timestamp":1}`), 400, "invalid_request", "timestamp"},
	})

	// Names inside a result sent as a JSON object are the backend's
	// data; other names are unknown fields, allowed as before.
	resp, body := usagePost(t, job(acc.CallbackURL, `{"status":"COMPLETED","result":{"Units":1,"units":2},"units":7,"extra":{"Status":"FAILED"},"timestamp":`+ts+`}`))
	if resp.StatusCode != 200 {
		t.Fatalf("completion: %d %s", resp.StatusCode, body)
	}
	es := g.ledger(user)
	if len(es) != 1 || es[0].Source != store.SourceCompletion || es[0].Units != billing.Whole(7) {
		t.Errorf("ledger %+v; want the 7 tokens charged once", es)
	}

	// A failed job of a PER_REQUEST product: its PascalCase FAILED was
	// taken for a completion without units, charged one call.
	const failer = "u-case-failed"
	fkey, _ := g.newKey(failer)
	g.subscribe(failer, "svc", "basic", "ACTIVE")
	facc, fenv := usageStart(t, be, asyncURL("/api", "svc", "job"), fkey, "x")
	fts := usageURLTimestamp(t, fenv.CallbackURL)
	failed := func(body string) usageSigned {
		return usageSigned{URL: facc.CallbackURL, Secret: usageSecret, Body: body, Timestamp: fts}
	}
	usageCheckRejections(t, g, facc.RequestID, failer, "svc", []usageRejection{
		{"PER_REQUEST Status FAILED", failed(`{"Status":"FAILED","ErrorMessage":"out of memory","timestamp":` + fts + `}`), 400, "invalid_request", "status"},
	})
	if resp, body := usagePost(t, failed(`{"status":"FAILED","errorMessage":"out of memory","timestamp":`+fts+`}`)); resp.StatusCode != 200 {
		t.Fatalf("failure: %d %s", resp.StatusCode, body)
	}
	if es := g.ledger(failer); len(es) != 0 {
		t.Errorf("ledger %+v; a failed job is charged nothing", es)
	}
}
