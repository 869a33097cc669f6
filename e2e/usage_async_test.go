package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/platform"
	"github.com/platformgw/gateway/internal/store"
)

// usagePayload has everything JSON.stringify and encoding/json disagree
// on, and everything a careless escaper gets wrong: <, >, &, quotes,
// backslashes, newlines and tabs, non-ASCII, an astral character, U+2028,
// U+2029, a control character and DEL.
const usagePayload = "{\"q\":\"a<b & c>d\", \"quote\":\"say \\\"hi\\\"\", \"path\":\"C:\\\\tmp\"}\n\tline2 \u00e9 \U0001F600 \u2028 \u2029 \x01 \x7f end"

func TestUsageCanonicalGolden(t *testing.T) {
	// JSON.stringify({payload, request_id}) computed with Node.
	const golden = "7b227061796c6f6164223a227b5c22715c223a5c22613c62202620633e645c222c205c2271756f74655c223a5c22736179205c5c5c2268695c5c5c225c222c205c22706174685c223a5c22433a5c5c5c5c746d705c227d5c6e5c746c696e653220c3a920f09f988020e280a820e280a9205c7530303031207f20656e64222c22726571756573745f6964223a2237663063326134652d316239642d346333652d386636612d326435623965316330613737227d"
	want, _ := hex.DecodeString(golden)
	if got := usageCanonical(usagePayload, "7f0c2a4e-1b9d-4c3e-8f6a-2d5b9e1c0a77"); string(got) != string(want) {
		t.Fatalf("test backend's canonical string disagrees with Node:\n got %q\nwant %q", got, want)
	}
}

func asyncURL(prefix, service, endpoint string) string {
	return gwBase + prefix + "/service/" + service + "/endpoint/" + endpoint + "/invoke/async"
}

func TestUsageAsyncRoundTrip(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	other := newUsageBackend(t, usageSecret2)
	g := startGateway(t, t.TempDir(), usageCatalog(be.URL, other.URL))
	key, _ := g.newKey("u-async")
	g.subscribe("u-async", "svc", "basic", "ACTIVE")

	acc, env := usageStart(t, be, asyncURL("/api", "svc", "job"), key, usagePayload)

	// The caller's answer.
	if acc.Status != "ACCEPTED" || acc.RequestID == "" ||
		acc.ProgressURL != gwBase+"/api/requests/"+acc.RequestID+"/status" ||
		acc.CallbackURL != gwBase+"/api/usage/complete/"+acc.RequestID {
		t.Fatalf("202 body %+v", acc)
	}

	// What the backend got: the envelope, signed over the canonical string
	// its own JSON.stringify-style code rebuilds.
	if !env.SigOK {
		t.Fatalf("backend could not verify the async signature; envelope %s", env.Raw)
	}
	if env.Path != "/job" || env.RequestID != acc.RequestID || env.Payload != usagePayload {
		t.Errorf("envelope path %s id %s payload %q", env.Path, env.RequestID, env.Payload)
	}
	if ct := env.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("envelope content type %q", ct)
	}
	// The payload inside the envelope is written byte for byte as in the
	// canonical string: <, & and U+2028 raw, quotes and newlines escaped.
	if !strings.Contains(string(env.Raw), `"payload":`+usageJSString(usagePayload)+`,`) {
		t.Errorf("envelope payload not escaped as JSON.stringify: %s", env.Raw)
	}
	ts := usageURLTimestamp(t, env.CallbackURL)
	if ts != env.Header.Get("X-Platform-Timestamp") || usageURLTimestamp(t, env.ProgressURL) != ts {
		t.Errorf("URL timestamp %s, header %s", ts, env.Header.Get("X-Platform-Timestamp"))
	}
	if !strings.HasPrefix(env.ProgressURL, gwBase+"/api/usage/progress/"+acc.RequestID+"?") ||
		!strings.HasPrefix(env.CallbackURL, acc.CallbackURL+"?") ||
		!strings.Contains(env.CallbackURL, "signature="+url.QueryEscape(env.Header.Get("X-Platform-Signature"))) {
		t.Errorf("progress_url %s callback_url %s", env.ProgressURL, env.CallbackURL)
	}

	// The caller polls: pending.
	resp, body := call(t, "GET", acc.ProgressURL, key, "")
	if resp.StatusCode != 200 || usageJSON(t, body)["status"] != "PENDING" {
		t.Fatalf("status: %d %s", resp.StatusCode, body)
	}
	resp, body = call(t, "GET", gwBase+"/api/requests/"+acc.RequestID+"/result", key, "")
	if resp.StatusCode != http.StatusAccepted || usageJSON(t, body)["status"] != "PENDING" {
		t.Fatalf("result while pending: %d %s", resp.StatusCode, body)
	}

	// The backend reports progress to the full progress_url, signing with
	// the timestamp it was handed, as existing SDKs do.
	progress := `{"stage":"thinking","percentageComplete":40,"timestamp":"` + time.Now().UTC().Format(time.RFC3339Nano) + `"}`
	resp, body = usagePost(t, usageSigned{URL: env.ProgressURL, Body: progress, Secret: usageSecret, Timestamp: ts})
	if resp.StatusCode != 200 || usageJSON(t, body)["status"] != "RUNNING" {
		t.Fatalf("progress: %d %s", resp.StatusCode, body)
	}
	resp, body = call(t, "GET", acc.ProgressURL, key, "")
	st := usageJSON(t, body)
	if resp.StatusCode != 200 || st["status"] != "RUNNING" || st["currentStage"] != "thinking" || st["percentageComplete"] != 40.0 ||
		st["requestId"] != acc.RequestID || st["startTime"] == nil || st["errorMessage"] != nil || st["currentCost"] != 0.0 {
		t.Fatalf("status while running: %d %s", resp.StatusCode, body)
	}
	for _, h := range []string{"Content-Security-Policy", "X-Content-Type-Options", "Content-Type"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("status without %s", h)
		}
	}

	// Completion, signed with the previous (rotation) secret, with an HTML
	// result: the caller gets it as JSON data that a browser never renders.
	html := `<h1>done</h1><script>alert(1)</script>`
	complete := fmt.Sprintf(`{"status":"completed","result":%q,"contentType":"text/html","timestamp":%d,"sdk":"x"}`, html, time.Now().UnixMilli())
	resp, body = usagePost(t, usageSigned{URL: env.CallbackURL, Body: complete, Secret: usageOldSecret, Timestamp: ts})
	if resp.StatusCode != 200 || usageJSON(t, body)["status"] != "COMPLETED" {
		t.Fatalf("complete: %d %s", resp.StatusCode, body)
	}
	resp, body = call(t, "GET", gwBase+"/api/requests/"+acc.RequestID+"/result", key, "")
	res := usageJSON(t, body)
	if resp.StatusCode != 200 || res["status"] != "COMPLETED" || res["result"] != html || res["contentType"] != "text/html" ||
		res["size"] != float64(len(html)) || res["resultUrl"] != nil || res["completedAt"] == nil || res["requestId"] != acc.RequestID {
		t.Fatalf("result: %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("X-Content-Type-Options") != "nosniff" ||
		resp.Header.Get("Content-Security-Policy") != "default-src 'none'; sandbox" {
		t.Errorf("result headers %v", resp.Header)
	}

	// One call's units, charged once, at completion.
	es := g.ledger("u-async")
	if len(es) != 1 || es[0].Units != billing.Whole(1) || es[0].Source != store.SourceCompletion || es[0].RequestID != acc.RequestID || es[0].EndpointID != "job" {
		t.Errorf("ledger %+v", es)
	}
	// The same completion again (a backend retry) is fine and charges
	// nothing more.
	resp, body = usagePost(t, usageSigned{URL: env.CallbackURL, Body: complete, Secret: usageSecret, Timestamp: ts})
	if resp.StatusCode != 200 {
		t.Errorf("repeated completion: %d %s", resp.StatusCode, body)
	}
	if es := g.ledger("u-async"); len(es) != 1 {
		t.Errorf("repeated completion charged again: %+v", es)
	}

	t.Run("ECS prefixes, GET on the progress URL, POST on the status URL", func(t *testing.T) {
		acc, env := usageStart(t, be, asyncURL("/gateway/api/v1", "svc", "job"), key, "")
		if acc.ProgressURL != gwBase+"/gateway/api/v1/requests/"+acc.RequestID+"/status" ||
			acc.CallbackURL != gwBase+"/usage/api/v1/complete/"+acc.RequestID ||
			!strings.HasPrefix(env.ProgressURL, gwBase+"/usage/api/v1/progress/"+acc.RequestID+"?") || env.Payload != "" || !env.SigOK {
			t.Fatalf("ECS URLs %+v / %s", acc, env.ProgressURL)
		}
		// A backend following the spec's "progress URL" posts to the
		// status URL the caller was given.
		ts := usageURLTimestamp(t, env.ProgressURL)
		resp, body := usagePost(t, usageSigned{URL: acc.ProgressURL, Body: `{"stage":"s1","percentageComplete":10.5,"timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts})
		if resp.StatusCode != 200 {
			t.Fatalf("progress on the status URL: %d %s", resp.StatusCode, body)
		}
		progressURL, _, _ := strings.Cut(env.ProgressURL, "?")
		resp, body = call(t, "GET", progressURL, key, "")
		if st := usageJSON(t, body); resp.StatusCode != 200 || st["currentStage"] != "s1" || st["percentageComplete"] != 10.5 {
			t.Fatalf("GET on the progress URL: %d %s", resp.StatusCode, body)
		}
		// A result above the cap is cut at a character boundary.
		long := strings.Repeat("é", 40) // 80 bytes, cap 64
		resp, body = usagePost(t, usageSigned{URL: env.CallbackURL, Body: `{"status":"COMPLETED","result":"` + long + `","units":3,"resultUrl":"https://files.example/out.bin","timestamp":"` + time.Now().UTC().Format("2006-01-02T15:04:05") + `"}`, Secret: usageSecret, Timestamp: ts})
		if resp.StatusCode != 200 {
			t.Fatalf("complete: %d %s", resp.StatusCode, body)
		}
		resp, body = call(t, "GET", gwBase+"/gateway/api/v1/requests/"+acc.RequestID+"/result", key, "")
		res := usageJSON(t, body)
		if resp.StatusCode != 200 || res["result"] != strings.Repeat("é", 32) || res["truncated"] != true || res["size"] != 80.0 ||
			res["resultUrl"] != "https://files.example/out.bin" {
			t.Fatalf("capped result: %d %s", resp.StatusCode, body)
		}
		if es := g.ledger("u-async"); len(es) != 2 || es[1].Units != billing.Whole(3) {
			t.Errorf("stated units: %+v", es)
		}
	})

	t.Run("a backend that refuses fails the job", func(t *testing.T) {
		resp, body := call(t, "POST", asyncURL("/api", "svc", "refuse"), key, "x")
		be.next(t)
		if resp.StatusCode != http.StatusBadGateway || errorCode(t, resp, body) != "service_error" {
			t.Fatalf("refused job: %d %s", resp.StatusCode, body)
		}
		id, _ := usageJSON(t, body)["requestId"].(string)
		if id == "" || resp.Header.Get("X-Platform-Request-ID") != id {
			t.Fatalf("no request id: %s", body)
		}
		resp, body = call(t, "GET", gwBase+"/api/requests/"+id+"/result", key, "")
		st := usageJSON(t, body)
		if resp.StatusCode != 500 || st["status"] != "FAILED" || !strings.Contains(fmt.Sprint(st["errorMessage"]), "500") {
			t.Fatalf("failed job result: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("an unreachable backend fails the job", func(t *testing.T) {
		g.subscribe("u-async", "gone", "basic", "ACTIVE")
		resp, body := call(t, "POST", asyncURL("/api", "gone", "job"), key, "x")
		if resp.StatusCode != http.StatusBadGateway || errorCode(t, resp, body) != "service_error" {
			t.Fatalf("unreachable: %d %s", resp.StatusCode, body)
		}
		id, _ := usageJSON(t, body)["requestId"].(string)
		resp, body = call(t, "GET", gwBase+"/api/requests/"+id+"/status", key, "")
		if st := usageJSON(t, body); resp.StatusCode != 200 || st["status"] != "FAILED" || st["errorMessage"] == nil {
			t.Fatalf("status: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("another user's job is not found", func(t *testing.T) {
		stranger, _ := g.newKey("u-stranger")
		for _, u := range []string{acc.ProgressURL, gwBase + "/api/requests/" + acc.RequestID + "/result"} {
			resp, body := call(t, "GET", u, stranger, "")
			if resp.StatusCode != 404 || errorCode(t, resp, body) != "request_not_found" {
				t.Errorf("%s: %d %s", u, resp.StatusCode, body)
			}
		}
		resp, body := call(t, "GET", acc.ProgressURL, "", "")
		if resp.StatusCode != 401 || errorCode(t, resp, body) != "missing_key" {
			t.Errorf("no key: %d %s", resp.StatusCode, body)
		}
		resp, body = call(t, "DELETE", acc.ProgressURL, key, "")
		if resp.StatusCode != 405 || errorCode(t, resp, body) != "method_not_allowed" || resp.Header.Get("Allow") == "" {
			t.Errorf("DELETE: %d %s %v", resp.StatusCode, body, resp.Header)
		}
	})

	t.Run("a subscription out of quota starts no job", func(t *testing.T) {
		tkey, _ := g.newKey("u-tiny")
		g.subscribe("u-tiny", "svc", "tiny", "ACTIVE")
		for range 2 {
			usageStart(t, be, asyncURL("/api", "svc", "job"), tkey, "")
		}
		// The two jobs in flight hold the whole quota of 2.
		resp, body := call(t, "POST", asyncURL("/api", "svc", "job"), tkey, "")
		if resp.StatusCode != 429 || errorCode(t, resp, body) != "quota_exceeded" || resp.Header.Get("Retry-After") == "" || resp.Header.Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("over quota: %d %s %v", resp.StatusCode, body, resp.Header)
		}
		select {
		case env := <-be.jobs:
			t.Fatalf("refused job reached the backend: %s", env.Raw)
		default:
		}
	})

	t.Run("the service owner's job is recorded free", func(t *testing.T) {
		okey, _ := g.newKey("owner-1")
		acc, env := usageStart(t, be, asyncURL("/api", "svc", "job"), okey, "{}")
		if env.Header.Get("X-Platform-Service-Product-ID") != "" || !env.SigOK {
			t.Fatalf("owner envelope headers %v", env.Header)
		}
		ts := usageURLTimestamp(t, env.CallbackURL)
		resp, body := usagePost(t, usageSigned{URL: acc.CallbackURL, Body: `{"status":"FAILED","result":"boom","timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts})
		if resp.StatusCode != 200 || usageJSON(t, body)["status"] != "FAILED" {
			t.Fatalf("failed completion: %d %s", resp.StatusCode, body)
		}
		resp, body = call(t, "GET", gwBase+"/api/requests/"+acc.RequestID+"/result", okey, "")
		if st := usageJSON(t, body); resp.StatusCode != 500 || st["errorMessage"] != "boom" {
			t.Fatalf("failed result: %d %s", resp.StatusCode, body)
		}
		if es := g.ledger("owner-1"); len(es) != 0 {
			t.Errorf("a failed job was charged: %+v", es)
		}
	})
}

// TestUsageJobExpiry moves the app's clock past a job's TTL: the job
// shows as expired at once, the maintenance sweep stores it FAILED, and a
// late completion is refused.
func TestUsageJobExpiry(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	g := startGateway(t, t.TempDir(), usageCatalog(be.URL, be.URL))
	key, _ := g.newKey("u-exp")
	g.subscribe("u-exp", "svc", "basic", "ACTIVE")
	acc, env := usageStart(t, be, asyncURL("/api", "svc", "job"), key, "x")
	fresh, _ := usageStart(t, be, asyncURL("/api", "svc", "job"), key, "y")

	g.app().SetClock(func() time.Time { return time.Now().Add(59 * time.Minute) })
	g.app().RunMaintenance(context.Background())
	if j, _ := g.store().GetJob(context.Background(), acc.RequestID); j.Status != store.JobPending {
		t.Fatalf("job expired before its TTL: %+v", j)
	}

	g.app().SetClock(func() time.Time { return time.Now().Add(61 * time.Minute) })
	resp, body := call(t, "GET", acc.ProgressURL, key, "")
	if st := usageJSON(t, body); st["status"] != "FAILED" || st["errorMessage"] != platform.JobExpiredMessage {
		t.Fatalf("overdue job before the sweep: %d %s", resp.StatusCode, body)
	}
	ts := usageURLTimestamp(t, env.CallbackURL)
	before := usageSnapshot(t, g, acc.RequestID, "u-exp", "svc")
	resp, body = usagePost(t, usageSigned{URL: env.ProgressURL, Body: `{"stage":"late","percentageComplete":99,"timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts})
	if resp.StatusCode != 409 || errorCode(t, resp, body) != "request_already_completed" {
		t.Fatalf("progress on an overdue job: %d %s", resp.StatusCode, body)
	}
	usageUnchanged(t, "progress on an overdue job", before, usageSnapshot(t, g, acc.RequestID, "u-exp", "svc"))
	g.app().RunMaintenance(context.Background())
	for _, id := range []string{acc.RequestID, fresh.RequestID} {
		j, err := g.store().GetJob(context.Background(), id)
		if err != nil || j.Status != store.JobFailed || j.ErrorMessage != platform.JobExpiredMessage {
			t.Fatalf("after the sweep: %+v %v", j, err)
		}
	}
	resp, body = call(t, "GET", gwBase+"/api/requests/"+acc.RequestID+"/result", key, "")
	if st := usageJSON(t, body); resp.StatusCode != 500 || st["status"] != "FAILED" {
		t.Fatalf("expired result: %d %s", resp.StatusCode, body)
	}
	before = usageSnapshot(t, g, acc.RequestID, "u-exp", "svc")
	resp, body = usagePost(t, usageSigned{URL: acc.CallbackURL, Body: `{"status":"COMPLETED","timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts})
	if resp.StatusCode != 409 || errorCode(t, resp, body) != "request_already_completed" {
		t.Fatalf("late completion: %d %s", resp.StatusCode, body)
	}
	usageUnchanged(t, "late completion", before, usageSnapshot(t, g, acc.RequestID, "u-exp", "svc"))
}

// TestUsageRestartKeepsJobs stops the server (a config without the app
// closes the store) and starts it again on the same file.
func TestUsageRestartKeepsJobs(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	dir := t.TempDir()
	g := startGateway(t, dir, usageCatalog(be.URL, be.URL))
	key, _ := g.newKey("u-restart-job")
	g.subscribe("u-restart-job", "svc", "basic", "ACTIVE")
	acc, env := usageStart(t, be, asyncURL("/api", "svc", "job"), key, "x")
	ts := usageURLTimestamp(t, env.CallbackURL)
	resp, body := usagePost(t, usageSigned{URL: env.ProgressURL, Body: `{"stage":"half","percentageComplete":50,"timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts})
	if resp.StatusCode != 200 {
		t.Fatalf("progress: %d %s", resp.StatusCode, body)
	}
	report := fmt.Sprintf(`{"userId":"u-restart-job","serviceId":"svc","unitsUsed":"0.25","timestamp":%d}`, time.Now().Unix())
	resp, first := usagePost(t, usageSigned{URL: gwBase + "/api/usage/report", Body: report, Secret: usageSecret, Header: []string{"Idempotency-Key", "restart-1"}})
	if resp.StatusCode != 200 {
		t.Fatalf("report: %d %s", resp.StatusCode, first)
	}

	g.tester.InitServer(fmt.Sprintf("{\n\tadmin localhost:%d\n}\n", adminPort), "caddyfile")
	g = startGateway(t, dir, usageCatalog(be.URL, be.URL))

	resp, body = call(t, "GET", acc.ProgressURL, key, "")
	if st := usageJSON(t, body); resp.StatusCode != 200 || st["status"] != "RUNNING" || st["currentStage"] != "half" {
		t.Fatalf("job after restart: %d %s", resp.StatusCode, body)
	}
	resp, again := usagePost(t, usageSigned{URL: gwBase + "/api/usage/report", Body: report, Secret: usageSecret, Header: []string{"Idempotency-Key", "restart-1"}})
	if resp.StatusCode != 200 || string(again) != string(first) {
		t.Fatalf("idempotent retry after restart: %d %s, first %s", resp.StatusCode, again, first)
	}
	resp, body = usagePost(t, usageSigned{URL: env.CallbackURL, Body: `{"status":"COMPLETED","timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts})
	if resp.StatusCode != 200 {
		t.Fatalf("completion after restart: %d %s", resp.StatusCode, body)
	}
	if got := ledgerSum(g.ledger("u-restart-job")); got != billing.Whole(1)+billing.Scale/4 {
		t.Errorf("ledger after restart: %v", got)
	}
}
