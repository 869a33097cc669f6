package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// usageRejection is one request the usage service must refuse without
// changing anything.
type usageRejection struct {
	name   string
	req    usageSigned
	status int
	code   string
	field  string
}

func usageCheckRejections(t *testing.T, g *gateway, jobID, user, service string, cases []usageRejection) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := usageSnapshot(t, g, jobID, user, service)
			resp, body := usagePost(t, tc.req)
			if resp.StatusCode != tc.status || errorCode(t, resp, body) != tc.code {
				t.Fatalf("got %d %s, want %d %s", resp.StatusCode, body, tc.status, tc.code)
			}
			if tc.field != "" {
				var e struct{ Field string }
				json.Unmarshal(body, &e)
				if e.Field != tc.field {
					t.Errorf("field %q, want %q", e.Field, tc.field)
				}
			}
			usageUnchanged(t, tc.name, before, usageSnapshot(t, g, jobID, user, service))
		})
	}
}

func TestUsageJobRejections(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	other := newUsageBackend(t, usageSecret2)
	g := startGateway(t, t.TempDir(), usageCatalog(be.URL, other.URL))
	key, _ := g.newKey("u-rej")
	g.subscribe("u-rej", "svc", "basic", "ACTIVE")
	g.subscribe("u-rej", "other", "basic", "ACTIVE")

	acc, env := usageStart(t, be, asyncURL("/api", "svc", "job"), key, "x")
	ts := usageURLTimestamp(t, env.CallbackURL)
	progressURL, _, _ := strings.Cut(env.ProgressURL, "?")
	resp, body := usagePost(t, usageSigned{URL: progressURL, Body: `{"stage":"one","percentageComplete":5,"timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts})
	if resp.StatusCode != 200 {
		t.Fatalf("progress: %d %s", resp.StatusCode, body)
	}
	otherJob, _ := usageStart(t, other, asyncURL("/api", "other", "job"), key, "x")

	now := time.Now().Unix()
	good := `{"stage":"two","percentageComplete":50,"timestamp":` + ts + `}`
	tampered := `{"stage":"two","percentageComplete":99,"timestamp":` + ts + `}`
	prog := func(body string) usageSigned {
		return usageSigned{URL: progressURL, Body: body, Secret: usageSecret, Timestamp: ts}
	}
	with := func(s usageSigned, f func(*usageSigned)) usageSigned { f(&s); return s }
	cases := []usageRejection{
		{"unsigned", with(prog(good), func(s *usageSigned) { s.Secret = "" }), 401, "invalid_signature", ""},
		{"wrong secret", with(prog(good), func(s *usageSigned) { s.Secret = "not-the-secret-not-the-secret-00" }), 401, "invalid_signature", ""},
		{"tampered body", with(prog(tampered), func(s *usageSigned) { s.SignBody = &good }), 401, "invalid_signature", ""},
		{"signature not base64", with(prog(good), func(s *usageSigned) {
			s.Secret = ""
			s.Header = []string{"X-Platform-Signature", "abc", "X-Platform-Timestamp", ts}
		}), 401, "invalid_signature", ""},
		{"timestamp before the job", with(prog(good), func(s *usageSigned) { s.Timestamp = strconv.FormatInt(now-3600, 10) }), 401, "stale_timestamp", ""},
		{"timestamp in the future", with(prog(good), func(s *usageSigned) { s.Timestamp = strconv.FormatInt(now+3600, 10) }), 401, "stale_timestamp", ""},
		{"timestamp not a number", with(prog(good), func(s *usageSigned) { s.Timestamp = "yesterday" }), 401, "stale_timestamp", ""},
		{"unknown job", with(prog(good), func(s *usageSigned) { s.URL = gwBase + "/api/usage/progress/00000000-0000-4000-8000-000000000000" }), 404, "request_not_found", ""},
		{"another service's signature", with(prog(good), func(s *usageSigned) { s.Secret = usageSecret2 }), 401, "invalid_signature", ""},
		{"another service's job", with(prog(good), func(s *usageSigned) { s.URL = gwBase + "/api/usage/progress/" + otherJob.RequestID }), 401, "invalid_signature", ""},
		{"bad JSON", prog(`{"stage":"two",`), 400, "invalid_request", "body"},
		{"not an object", prog(`[1,2]`), 400, "invalid_request", "body"},
		{"oversized body", prog(usageBig), 413, "payload_too_large", ""},
		{"percentage 120", prog(`{"stage":"two","percentageComplete":120,"timestamp":` + ts + `}`), 400, "invalid_request", "percentageComplete"},
		{"percentage negative", prog(`{"stage":"two","percentageComplete":-1,"timestamp":` + ts + `}`), 400, "invalid_request", "percentageComplete"},
		{"percentage a string", prog(`{"stage":"two","percentageComplete":"50","timestamp":` + ts + `}`), 400, "invalid_request", "percentageComplete"},
		{"no stage", prog(`{"percentageComplete":50,"timestamp":` + ts + `}`), 400, "invalid_request", "stage"},
		{"stage a number", prog(`{"stage":2,"percentageComplete":50,"timestamp":` + ts + `}`), 400, "invalid_request", "stage"},
		{"no timestamp", prog(`{"stage":"two","percentageComplete":50}`), 400, "invalid_request", "timestamp"},
		{"body timestamp in the future", prog(`{"stage":"two","percentageComplete":50,"timestamp":"2999-01-01T00:00:00Z"}`), 400, "invalid_request", "timestamp"},
		{"completion with an ftp resultUrl", with(prog(`{"status":"COMPLETED","resultUrl":"ftp://x/y","timestamp":`+ts+`}`), func(s *usageSigned) { s.URL = acc.CallbackURL }), 400, "invalid_request", "resultUrl"},
		{"completion with a javascript resultUrl", with(prog(`{"status":"COMPLETED","resultUrl":"javascript:alert(1)","timestamp":`+ts+`}`), func(s *usageSigned) { s.URL = acc.CallbackURL }), 400, "invalid_request", "resultUrl"},
		{"completion with negative units", with(prog(`{"status":"COMPLETED","units":-1,"timestamp":`+ts+`}`), func(s *usageSigned) { s.URL = acc.CallbackURL }), 400, "invalid_request", "units"},
		{"completion with units as a boolean", with(prog(`{"status":"COMPLETED","units":true,"timestamp":`+ts+`}`), func(s *usageSigned) { s.URL = acc.CallbackURL }), 400, "invalid_request", "units"},
		{"completion unsigned", with(prog(`{"status":"COMPLETED","timestamp":`+ts+`}`), func(s *usageSigned) { s.URL = acc.CallbackURL; s.Secret = "" }), 401, "invalid_signature", ""},
	}
	usageCheckRejections(t, g, acc.RequestID, "u-rej", "svc", cases)

	t.Run("wrong method", func(t *testing.T) {
		for _, c := range []struct{ method, url, allow string }{
			{"GET", gwBase + "/api/usage/report", "POST"},
			{"GET", acc.CallbackURL, "POST"},
			{"PUT", progressURL, "GET, HEAD, POST"},
			{"POST", gwBase + "/api/requests/" + acc.RequestID + "/result", "GET, HEAD"},
		} {
			resp, body := call(t, c.method, c.url, key, "")
			if resp.StatusCode != 405 || errorCode(t, resp, body) != "method_not_allowed" || resp.Header.Get("Allow") != c.allow {
				t.Errorf("%s %s: %d %s Allow %q", c.method, c.url, resp.StatusCode, body, resp.Header.Get("Allow"))
			}
		}
		resp, body := call(t, "GET", gwBase+"/api/usage/nothing-here", key, "")
		if resp.StatusCode != 404 || errorCode(t, resp, body) != "not_found" {
			t.Errorf("unknown usage route: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("terminal jobs stay as they are", func(t *testing.T) {
		done := `{"status":"COMPLETED","result":"42","units":2,"timestamp":` + ts + `}`
		resp, body := usagePost(t, usageSigned{URL: acc.CallbackURL, Body: done, Secret: usageSecret, Timestamp: ts})
		if resp.StatusCode != 200 {
			t.Fatalf("complete: %d %s", resp.StatusCode, body)
		}
		usageCheckRejections(t, g, acc.RequestID, "u-rej", "svc", []usageRejection{
			{"a different status", usageSigned{URL: acc.CallbackURL, Body: `{"status":"FAILED","result":"42","units":2,"timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts}, 409, "request_already_completed", ""},
			{"different units", usageSigned{URL: acc.CallbackURL, Body: `{"status":"COMPLETED","result":"42","units":3,"timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts}, 409, "request_already_completed", ""},
			{"progress after completion", prog(good), 409, "request_already_completed", ""},
		})
		// The same completion, written differently and signed at another
		// time, is the same completion.
		same := fmt.Sprintf(`{ "timestamp": %d, "units": "2.0", "result": "42", "status": "completed" }`, time.Now().Unix())
		before := usageSnapshot(t, g, acc.RequestID, "u-rej", "svc")
		resp, body = usagePost(t, usageSigned{URL: acc.CallbackURL, Body: same, Secret: usageSecret})
		if resp.StatusCode != 200 {
			t.Fatalf("same completion again: %d %s", resp.StatusCode, body)
		}
		usageUnchanged(t, "same completion again", before, usageSnapshot(t, g, acc.RequestID, "u-rej", "svc"))
		if es := g.ledger("u-rej"); len(es) != 1 || es[0].Units != 2_000_000 {
			t.Errorf("ledger %+v", es)
		}
	})

	resp, body = call(t, "GET", gwBase+"/api/requests/"+acc.RequestID+"/status", key, "")
	if st := usageJSON(t, body); resp.StatusCode != http.StatusOK || st["status"] != "COMPLETED" || st["currentCost"] != 0.0 {
		t.Errorf("final status: %d %s", resp.StatusCode, body)
	}
}
