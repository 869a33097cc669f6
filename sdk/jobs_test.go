package sdk_test

import (
	"context"
	"encoding/json"
	"math"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/platformgw/gateway/sdk"
)

const jobID = "7f0c2a4e-1b9d-4c3e-8f6a-2d5b9e1c0a77"

// handedOut is a progress_url or callback_url as the gateway puts it in
// the async envelope: the signature and timestamp of its forward in the
// query. The timestamp is an hour old, as for a job that ran that long.
func handedOut(base, kind string) (u, ts string) {
	ts = strconv.Itoa(nowUnix - 3600)
	q := url.Values{"signature": {"gw+forward/signature=="}, "timestamp": {ts}}.Encode()
	return base + "/api/usage/" + kind + "/" + jobID + "?" + q, ts
}

func TestReportProgressWithHandedOutURL(t *testing.T) {
	s := newUsageServer(t)
	c := newClient(t, s, newSleeps())
	progressURL, ts := handedOut(s.srv.URL, "progress")
	ack, err := c.ReportProgress(context.Background(), progressURL, sdk.Progress{Stage: "thinking", PercentageComplete: 40})
	if err != nil {
		t.Fatalf("ReportProgress: %v", err)
	}
	if ack.RequestID != jobID || ack.Status != "RUNNING" || ack.Attempts != 1 {
		t.Errorf("ack = %+v", ack)
	}
	req := s.sent("progress")[0]
	if got := req.Header.Get("X-Platform-Timestamp"); got != ts {
		t.Errorf("header timestamp %s, want the query's %s", got, ts)
	}
	if req.URL.RawQuery != "" || req.URL.Path != "/api/usage/progress/"+jobID {
		t.Errorf("posted to %s, want the path without the query", req.URL)
	}
	// The server checked the signature over body + that timestamp; check
	// it here too, by hand.
	body := s.body("progress", 0)
	if req.Header.Get("X-Platform-Signature") != hmacBase64(secret, body+ts) {
		t.Error("signature is not HMAC(body + query timestamp)")
	}
	want := `{"stage":"thinking","percentageComplete":40,"timestamp":"2026-01-01T00:00:00.000Z"}`
	if body != want {
		t.Errorf("body = %s\nwant   %s", body, want)
	}
}

func TestReportCompletionWithHandedOutURL(t *testing.T) {
	s := newUsageServer(t)
	// The first attempt is recorded, then its answer lost: the retry is
	// the same completion, answered 200 and charged nothing more.
	s.faults = func(route string, n int) fault {
		if n == 1 {
			return dropAfterRecord
		}
		return noFault
	}
	sl := newSleeps()
	c := newClient(t, s, sl)
	callbackURL, ts := handedOut(s.srv.URL, "complete")
	u := units(t, "1.5")
	ack, err := c.ReportCompletion(context.Background(), callbackURL, sdk.Completion{
		Result: "42 words", ContentType: "text/plain", ResultURL: "https://files.example/out/1", Units: &u,
	})
	if err != nil {
		t.Fatalf("ReportCompletion: %v", err)
	}
	if ack.Status != "COMPLETED" || s.count("complete") != 2 || len(sl.recorded()) != 1 {
		t.Errorf("ack %+v after %d requests, waits %v", ack, s.count("complete"), sl.recorded())
	}
	if s.charged(jobID) != u {
		t.Errorf("charged %s, want 1.5 once", s.charged(jobID))
	}
	for i, req := range s.sent("complete") {
		if req.Header.Get("X-Platform-Timestamp") != ts || req.URL.RawQuery != "" {
			t.Errorf("attempt %d: timestamp %s, query %q", i+1, req.Header.Get("X-Platform-Timestamp"), req.URL.RawQuery)
		}
	}
	if a, b := []byte(s.body("complete", 0)), []byte(s.body("complete", 1)); string(a) != string(b) {
		t.Errorf("a retry changed the body:\n%s\n%s", a, b)
	}
	want := `{"status":"COMPLETED","result":"42 words","resultUrl":"https://files.example/out/1","contentType":"text/plain","units":1.5,"timestamp":"2026-01-01T00:00:00.000Z"}`
	if got := s.body("complete", 0); got != want {
		t.Errorf("body = %s\nwant   %s", got, want)
	}
}

func TestReportCompletionByRequestID(t *testing.T) {
	s := newUsageServer(t)
	c := newClient(t, s, newSleeps())
	id := "job 1 ü"
	_, err := c.ReportCompletion(context.Background(), id, sdk.Completion{
		Status: sdk.StatusFailed, ErrorMessage: "model overloaded", Result: map[string]any{"retry": true},
	})
	if err != nil {
		t.Fatalf("ReportCompletion: %v", err)
	}
	req := s.sent("complete")[0]
	if req.URL.EscapedPath() != "/api/usage/complete/"+url.PathEscape(id) {
		t.Errorf("path = %s", req.URL.EscapedPath())
	}
	if req.Header.Get("X-Platform-Timestamp") != strconv.Itoa(nowUnix) {
		t.Errorf("a built URL is signed with the current time, got %s", req.Header.Get("X-Platform-Timestamp"))
	}
	var body map[string]json.RawMessage
	json.Unmarshal([]byte(s.body("complete", 0)), &body)
	if string(body["status"]) != `"FAILED"` || string(body["result"]) != `{"retry":true}` || body["units"] != nil {
		t.Errorf("body = %s", []byte(s.body("complete", 0)))
	}
}

func TestReportCompletionDifferentSecondCompletion(t *testing.T) {
	s := newUsageServer(t)
	c := newClient(t, s, newSleeps())
	if _, err := c.ReportCompletion(context.Background(), jobID, sdk.Completion{Result: "a"}); err != nil {
		t.Fatal(err)
	}
	_, err := c.ReportCompletion(context.Background(), jobID, sdk.Completion{Result: "b"})
	if !sdk.IsCode(err, sdk.CodeRequestAlreadyCompleted) {
		t.Fatalf("err = %v, want request_already_completed", err)
	}
}

func TestCallbacksViaBaseURL(t *testing.T) {
	s := newUsageServer(t)
	c := newClient(t, s, newSleeps(), sdk.WithCallbacksViaBaseURL())
	// The gateway's public address, unreachable from this backend.
	progressURL, ts := handedOut("https://api.public.invalid", "progress")
	if _, err := c.ReportProgress(context.Background(), progressURL, sdk.Progress{Stage: "s", PercentageComplete: 1}); err != nil {
		t.Fatalf("ReportProgress: %v", err)
	}
	// The caller's status URL takes progress too.
	statusURL := "https://api.public.invalid/api/requests/" + jobID + "/status"
	if _, err := c.ReportProgress(context.Background(), statusURL, sdk.Progress{Stage: "s", PercentageComplete: 2}); err != nil {
		t.Fatalf("ReportProgress(status URL): %v", err)
	}
	for i, want := range []string{ts, strconv.Itoa(nowUnix)} {
		req := s.sent("progress")[i]
		if req.URL.Path != "/api/usage/progress/"+jobID || req.Header.Get("X-Platform-Timestamp") != want {
			t.Errorf("request %d: %s at %s, want timestamp %s", i+1, req.URL, req.Header.Get("X-Platform-Timestamp"), want)
		}
	}
}

func TestJobTargetsRefused(t *testing.T) {
	s := newUsageServer(t)
	c := newClient(t, s, newSleeps())
	callbackURL, _ := handedOut(s.srv.URL, "complete")
	progressURL, _ := handedOut(s.srv.URL, "progress")
	ctx := context.Background()
	p := sdk.Progress{Stage: "s", PercentageComplete: 5}
	cases := map[string]error{}
	// Progress posted to a completion URL would finish the job.
	_, cases["progress to the callback URL"] = c.ReportProgress(ctx, callbackURL, p)
	_, cases["completion to the progress URL"] = c.ReportCompletion(ctx, progressURL, sdk.Completion{})
	_, cases["empty target"] = c.ReportProgress(ctx, " ", p)
	_, cases["a path is not an id"] = c.ReportProgress(ctx, "jobs/1", p)
	_, cases["URL without an id"] = c.ReportCompletion(ctx, s.srv.URL+"/", sdk.Completion{})
	_, cases["percentage over 100"] = c.ReportProgress(ctx, jobID, sdk.Progress{Stage: "s", PercentageComplete: 101})
	_, cases["percentage NaN"] = c.ReportProgress(ctx, jobID, sdk.Progress{Stage: "s", PercentageComplete: math.NaN()})
	_, cases["empty stage"] = c.ReportProgress(ctx, jobID, sdk.Progress{PercentageComplete: 1})
	neg := sdk.Units(-1)
	_, cases["negative units"] = c.ReportCompletion(ctx, jobID, sdk.Completion{Units: &neg})
	for name, err := range cases {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if n := s.count("progress") + s.count("complete"); n != 0 {
		t.Errorf("%d refused calls were sent", n)
	}
	if strings.Contains(cases["progress to the callback URL"].Error(), "signature") {
		t.Errorf("an error quotes the URL's query: %v", cases["progress to the callback URL"])
	}
}
