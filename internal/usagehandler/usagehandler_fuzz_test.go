package usagehandler

import (
	"math"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/wire"
)

// The fuzz targets of the bodies backends send (report, progress,
// completion) and of the route matcher. Beyond "never panics", each checks
// what the handler relies on afterwards: an accepted body satisfies every
// documented bound, a refusal is an invalid_request naming a field.

// fuzzNow is a fixed clock so that a seed's outcome does not drift.
var fuzzNow = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

const fuzzSkew = 5 * time.Minute

func checkRefusal(t *testing.T, e *apierror.Error) {
	t.Helper()
	if e.Code != apierror.InvalidRequest || e.Field == "" || e.Message == "" {
		t.Fatalf("a malformed body must be invalid_request with a field: %+v", e)
	}
}

func FuzzParseReport(f *testing.F) {
	for _, s := range []string{
		`{"userId":"u","serviceId":"s","unitsUsed":1.5,"timestamp":"2026-05-01T10:00:00Z"}`,
		`{"userId":"u","serviceId":"s","unitsUsed":"2","timestamp":1777629600}`,
		`{"userId":"u","serviceId":"s","unitsUsed":1,"timestamp":1777629600000,"requestId":"r-1"}`,
		`{"userId":"u","serviceId":"s","unitsUsed":-1,"timestamp":1}`,
		`{"userId":"u","serviceId":"s","unitsUsed":1e400,"timestamp":1}`,
		`{"userId":"u","serviceId":"s","unitsUsed":NaN,"timestamp":1}`,
		`{"userId":"u","serviceId":"s","unitsUsed":0.0000001,"timestamp":1}`,
		`{"userId":"u\u0000","serviceId":"s","unitsUsed":1,"timestamp":1}`,
		`{"userId":1,"serviceId":"s","unitsUsed":1,"timestamp":1}`,
		`{"userId":"u","serviceId":"s","unitsUsed":"9223372036854.775807","timestamp":"1777629600.5"}`,
		`[]`, `null`, `"x"`, `{}`, `{"unitsUsed":{}}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	h := &Handler{rt: engine.New(engine.Runtime{Limits: engine.Limits{TimestampTolerance: fuzzSkew}})}
	f.Fuzz(func(t *testing.T, body []byte) {
		fl, e := parseObject(body)
		if e != nil {
			checkRefusal(t, e)
			return
		}
		serviceID, e := fl.serviceID("serviceId")
		if e != nil {
			checkRefusal(t, e)
			return
		}
		rep, e := h.parseReport(fl, serviceID, fuzzNow)
		if e != nil {
			checkRefusal(t, e)
			return
		}
		if rep.Units <= 0 {
			t.Fatalf("accepted %s units", rep.Units)
		}
		if !wire.ValidUserID(rep.UserID) {
			t.Fatalf("accepted user id %q", rep.UserID)
		}
		if id := rep.ServiceID; id == "" || len(id) > 256 || strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f || r == utf8.RuneError }) {
			t.Fatalf("accepted service id %q", id)
		}
		if rep.At.After(fuzzNow.Add(fuzzSkew)) {
			t.Fatalf("accepted a timestamp in the future: %v", rep.At)
		}
		if id := rep.RequestID; id != "" && (len(id) > maxRequestIDLen || !printableText(id)) {
			t.Fatalf("accepted request id %q", rep.RequestID)
		}
	})
}

func FuzzParseProgress(f *testing.F) {
	for _, s := range []string{
		`{"stage":"thinking","percentageComplete":40,"timestamp":"2026-05-01T10:00:00Z"}`,
		`{"stage":"x","percentageComplete":100,"errorMessage":"boom","timestamp":1777629600}`,
		`{"stage":"x","percentageComplete":0.5,"errorMessage":null,"timestamp":"1777629600"}`,
		`{"stage":"x","percentageComplete":101,"timestamp":1}`,
		`{"stage":"x","percentageComplete":-0,"timestamp":1}`,
		`{"stage":"x","percentageComplete":1e308,"timestamp":1}`,
		`{"stage":"x","percentageComplete":"50","timestamp":1}`,
		`{"stage":" ","percentageComplete":5,"timestamp":1}`,
		`{"stage":"x","percentageComplete":5,"timestamp":"2099-01-01T00:00:00Z"}`,
		`{"stage":"x","percentageComplete":5,"timestamp":true}`,
		`{"stage":["x"],"percentageComplete":5,"timestamp":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, e := parseProgress(body, fuzzNow, fuzzSkew)
		if e != nil {
			checkRefusal(t, e)
			return
		}
		if strings.TrimSpace(p.Stage) == "" || len(p.Stage) > maxStageBytes {
			t.Fatalf("accepted stage %q", p.Stage)
		}
		if math.IsNaN(p.Percentage) || p.Percentage < 0 || p.Percentage > 100 {
			t.Fatalf("accepted percentage %v", p.Percentage)
		}
		if len(p.ErrorMessage) > maxErrorMessageBytes || !utf8.ValidString(p.ErrorMessage) && utf8.Valid(body) {
			t.Fatalf("error message of %d bytes kept", len(p.ErrorMessage))
		}
	})
}

func FuzzParseCompletion(f *testing.F) {
	for _, s := range []string{
		`{"status":"COMPLETED","result":"ok","units":12.5,"timestamp":"2026-05-01T10:00:00Z"}`,
		`{"status":"failed","errorMessage":"boom","timestamp":1777629600}`,
		`{"status":"","result":{"a":[1,2]},"timestamp":1777629600}`,
		`{"status":"COMPLETED","resultUrl":"https://example.com/x","contentType":"text/html; charset=utf-8","timestamp":1}`,
		`{"status":"COMPLETED","resultUrl":"javascript:alert(1)","timestamp":1}`,
		`{"status":"COMPLETED","resultUrl":"https://user:pw@example.com/","timestamp":1}`,
		`{"status":"COMPLETED","contentType":"not a type","timestamp":1}`,
		`{"status":"COMPLETED","units":-5,"timestamp":1}`,
		`{"status":"COMPLETED","units":"1.0000001","timestamp":1}`,
		`{"status":"COMPLETED","units":Infinity,"timestamp":1}`,
		`{"status":7,"timestamp":1}`,
		`{"status":"COMPLETED","result":"\ud800","timestamp":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c, e := parseCompletion(body, fuzzNow, fuzzSkew)
		if e != nil {
			checkRefusal(t, e)
			return
		}
		if c.Status != store.JobCompleted && c.Status != store.JobFailed {
			t.Fatalf("status %q", c.Status)
		}
		if c.Units < 0 {
			t.Fatalf("accepted %s units", c.Units)
		}
		if c.ResultURL != "" {
			u, err := url.Parse(c.ResultURL)
			if err != nil || u.Host == "" || u.User != nil || (!strings.EqualFold(u.Scheme, "http") && !strings.EqualFold(u.Scheme, "https")) {
				t.Fatalf("accepted result URL %q", c.ResultURL)
			}
		}
		if len(c.ErrorMessage) > maxErrorMessageBytes || len(c.ContentType) > maxContentTypeBytes {
			t.Fatalf("kept %d bytes of error, %d of content type", len(c.ErrorMessage), len(c.ContentType))
		}
		// The stored result is cut at a UTF-8 boundary: never a broken
		// character made by the cut itself.
		for _, max := range []int{1, 3, 64} {
			r, cutShort := cut(c.Result, max)
			if len(r) > max || cutShort != (len(c.Result) > max) || !strings.HasPrefix(c.Result, r) {
				t.Fatalf("cut(%q, %d) = %q, %v", c.Result, max, r, cutShort)
			}
			if utf8.ValidString(c.Result) && !utf8.ValidString(r) {
				t.Fatalf("cut(%q, %d) broke a character: %q", c.Result, max, r)
			}
		}
		if first, again := c.digest(), c.digest(); first != again || len(first) != 64 {
			t.Fatal("digest is not stable")
		}
	})
}

func FuzzMatchRoute(f *testing.F) {
	for _, s := range []string{
		"/api/usage/report", "/api/usage/progress/abc", "/usage/api/v1/complete/abc",
		"/api/requests/abc/status", "/gateway/api/v1/requests/abc/result",
		"/api/usage/complete/../report", "/api/requests/%2e%2e/status", "/api/requests/a/b/status",
		"/api/v1/service-keys/validate", "/core/api/v1/billing/usage/estimate",
		"/api/usage/progress/\x00", "/api/usage//report", "/", "",
	} {
		f.Add(s)
	}
	p := engine.DefaultPrefixes()
	f.Fuzz(func(t *testing.T, path string) {
		r, ok := matchRoute(p, path)
		if !ok {
			return
		}
		switch r.kind {
		case routeProgress, routeComplete, routeStatus, routeResult:
			if !validID(r.id) || !strings.Contains(path, "/"+r.id) {
				t.Fatalf("%q: id %q", path, r.id)
			}
			if strings.ContainsAny(r.id, "/\x00") {
				t.Fatalf("%q: id %q holds a separator", path, r.id)
			}
		default:
			if r.id != "" {
				t.Fatalf("%q: kind %d with id %q", path, r.kind, r.id)
			}
		}
	})
}
