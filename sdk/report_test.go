package sdk_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/sdk"
)

// newClient returns a Client of service svc-1 for s, with fast, recorded
// retries on the fake clock.
func newClient(t *testing.T, s *usageServer, sl *sleeps, opts ...sdk.Option) *sdk.Client {
	t.Helper()
	base := []sdk.Option{sdk.WithClock(sl.now), sdk.WithSleep(sl.sleep)}
	c, err := sdk.NewClient(s.srv.URL, "svc-1", secret, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s.clock = sl.now
	return c
}

func units(t *testing.T, s string) sdk.Units {
	t.Helper()
	u, err := sdk.ParseUnits(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestReportUsage(t *testing.T) {
	s := newUsageServer(t)
	sl := newSleeps()
	c := newClient(t, s, sl)
	res, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: units(t, "12.5"), RequestID: "gw-req-9"})
	if err != nil {
		t.Fatalf("ReportUsage: %v", err)
	}
	if res.Status != "ok" || res.ReportSchemaVersion != 2 || res.UserID != "user-1" || res.ServiceID != "svc-1" ||
		res.BillingModelType != "SUBSCRIPTION" || res.UnitLabel != "token" || res.Warning != "" ||
		res.Breakdown.UnitsUsed != units(t, "12.5") || res.Breakdown.UnitsRemaining == nil || *res.Breakdown.UnitsRemaining != sdk.WholeUnits(900) ||
		res.Replayed || res.Attempts != 1 || res.IdempotencyKey == "" {
		t.Errorf("result = %+v", res)
	}
	if got := s.unitsOf("user-1"); got != units(t, "12.5") {
		t.Errorf("counted %s, want 12.5", got)
	}
	// The body is exact decimal JSON, with the platform request id, and
	// the signature headers are the server's to check (it did).
	body := s.body("report", 0)
	want := `{"userId":"user-1","serviceId":"svc-1","unitsUsed":12.5,"timestamp":"2026-01-01T00:00:00.000Z","requestId":"gw-req-9"}`
	if body != want {
		t.Errorf("body = %s\nwant   %s", body, want)
	}
	req := s.sent("report")[0]
	if req.Header.Get("X-Platform-Timestamp") != strconv.Itoa(nowUnix) || req.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers = %v", req.Header)
	}
	if len(sl.recorded()) != 0 {
		t.Errorf("slept %v without a failure", sl.recorded())
	}
}

// A flaky usage service fails the first two attempts of every report, by
// a 503 or by dropping the connection after recording it. Each report
// must count exactly once.
func TestReportUsageExactlyOnce(t *testing.T) {
	for _, tt := range []struct {
		name   string
		faults []fault
	}{
		{"two 503s", []fault{fail503, fail503}},
		{"recorded, then the connection dropped twice", []fault{dropAfterRecord, dropAfterRecord}},
		{"dropped before recording, then after", []fault{dropBeforeRecord, dropAfterRecord}},
		{"503 then a 502-class drop after recording", []fault{fail503, dropAfterRecord}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newUsageServer(t)
			var mu sync.Mutex
			perKey := map[string]int{}
			s.faults = func(route string, n int) fault {
				s.mu.Lock()
				req := s.seen[route][n-1]
				s.mu.Unlock()
				mu.Lock()
				defer mu.Unlock()
				key := req.Header.Get("Idempotency-Key")
				perKey[key]++
				if i := perKey[key] - 1; i < len(tt.faults) {
					return tt.faults[i]
				}
				return noFault
			}
			sl := newSleeps()
			c := newClient(t, s, sl)
			res, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(3)})
			if err != nil {
				t.Fatalf("ReportUsage: %v", err)
			}
			if got := s.unitsOf("user-1"); got != sdk.WholeUnits(3) {
				t.Fatalf("counted %s units, want exactly 3", got)
			}
			if len(perKey) != 1 {
				t.Errorf("the retries used %d idempotency keys, want 1: %v", len(perKey), perKey)
			}
			recordedEarly := tt.faults[len(tt.faults)-1] == dropAfterRecord
			if res.Replayed != recordedEarly {
				t.Errorf("Replayed = %v, want %v", res.Replayed, recordedEarly)
			}
			// net/http itself resends a request with an Idempotency-Key
			// once when a reused connection drops, so the server may see
			// an attempt the Client did not count.
			if s.count("report") != 3 || res.Attempts < 2 || res.Attempts > 3 || len(sl.recorded()) != res.Attempts-1 {
				t.Errorf("server saw %d requests; client: %d attempts, waits %v", s.count("report"), res.Attempts, sl.recorded())
			}
		})
	}
}

// Many reports at once through a service that fails each one's first two
// attempts: every unit is counted once.
func TestReportUsageExactlyOnceConcurrent(t *testing.T) {
	s := newUsageServer(t)
	var mu sync.Mutex
	perKey := map[string]int{}
	s.faults = func(route string, n int) fault {
		s.mu.Lock()
		key := s.seen[route][n-1].Header.Get("Idempotency-Key")
		s.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		perKey[key]++
		switch perKey[key] {
		case 1:
			return dropAfterRecord
		case 2:
			return fail503
		}
		return noFault
	}
	sl := newSleeps()
	c := newClient(t, s, sl)
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.ReportUsage(context.Background(), sdk.Report{UserID: fmt.Sprint("user-", i%4), UnitsUsed: units(t, "0.25")})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("ReportUsage: %v", err)
		}
	}
	for u := range 4 {
		if got := s.unitsOf(fmt.Sprint("user-", u)); got != units(t, "2.5") {
			t.Errorf("user-%d counted %s, want 2.5", u, got)
		}
	}
}

func TestReportUsageDoesNotRetryRefusals(t *testing.T) {
	for _, tt := range []struct {
		name   string
		fault  fault
		status int
		code   string
	}{
		{"400 invalid_request", fail400, http.StatusBadRequest, "invalid_request"},
		{"500 internal_error", fail500, http.StatusInternalServerError, "internal_error"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newUsageServer(t)
			s.faults = func(string, int) fault { return tt.fault }
			sl := newSleeps()
			c := newClient(t, s, sl)
			_, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1)})
			var ae *sdk.APIError
			if !errors.As(err, &ae) || ae.Status != tt.status || ae.Code != tt.code {
				t.Fatalf("err = %v, want APIError %d %s", err, tt.status, tt.code)
			}
			if tt.fault == fail400 && ae.Field != "unitsUsed" {
				t.Errorf("field = %q", ae.Field)
			}
			if s.count("report") != 1 || len(sl.recorded()) != 0 {
				t.Errorf("%d requests, waits %v; a refusal must not be retried", s.count("report"), sl.recorded())
			}
		})
	}
}

func TestReportUsageRefusedSignature(t *testing.T) {
	s := newUsageServer(t)
	sl := newSleeps()
	c, err := sdk.NewClient(s.srv.URL, "svc-1", "not-the-secret", sdk.WithClock(sl.now), sdk.WithSleep(sl.sleep))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1)})
	if !sdk.IsCode(err, sdk.CodeInvalidSignature) {
		t.Fatalf("err = %v, want invalid_signature", err)
	}
	var ae *sdk.APIError
	if errors.As(err, &ae); ae.RequestID != "srv-req-1" || ae.Retryable() {
		t.Errorf("APIError = %+v", ae)
	}
}

func TestReportUsageHonoursRetryAfter(t *testing.T) {
	s := newUsageServer(t)
	s.retryAfter = "7"
	s.faults = func(_ string, n int) fault {
		if n == 1 {
			return fail429
		}
		return noFault
	}
	sl := newSleeps()
	c := newClient(t, s, sl)
	res, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1)})
	if err != nil {
		t.Fatalf("ReportUsage: %v", err)
	}
	waits := sl.recorded()
	if len(waits) != 1 || waits[0] < 7*time.Second || waits[0] > 8*time.Second {
		t.Errorf("waits = %v, want one of about 7s", waits)
	}
	if res.Attempts != 2 || s.unitsOf("user-1") != sdk.WholeUnits(1) {
		t.Errorf("attempts %d, counted %s", res.Attempts, s.unitsOf("user-1"))
	}
	// Each attempt is signed at the time it is sent: the retry after the
	// wait carries the later timestamp.
	ts1 := s.sent("report")[0].Header.Get("X-Platform-Timestamp")
	ts2 := s.sent("report")[1].Header.Get("X-Platform-Timestamp")
	if ts1 != strconv.Itoa(nowUnix) || ts2 != strconv.FormatInt(sl.now().Unix(), 10) || ts1 == ts2 {
		t.Errorf("timestamps %s then %s", ts1, ts2)
	}
}

func TestReportUsageRetryAfterAsHTTPDate(t *testing.T) {
	s := newUsageServer(t)
	s.retryAfter = now.Add(20 * time.Second).UTC().Format(http.TimeFormat)
	s.faults = func(_ string, n int) fault {
		if n == 1 {
			return fail429
		}
		return noFault
	}
	sl := newSleeps()
	c := newClient(t, s, sl)
	if _, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1)}); err != nil {
		t.Fatalf("ReportUsage: %v", err)
	}
	if w := sl.recorded(); len(w) != 1 || w[0] < 20*time.Second {
		t.Errorf("waits = %v, want 20s", w)
	}
}

func TestReportUsageLongRetryAfterIsReturned(t *testing.T) {
	s := newUsageServer(t)
	s.retryAfter = "3600"
	s.faults = func(string, int) fault { return fail429 }
	sl := newSleeps()
	c := newClient(t, s, sl)
	_, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1)})
	var ae *sdk.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || ae.RetryAfter != time.Hour || !ae.Retryable() {
		t.Fatalf("err = %v, want a 429 APIError with RetryAfter 1h", err)
	}
	if s.count("report") != 1 || len(sl.recorded()) != 0 {
		t.Errorf("%d requests, waits %v; an hour is the caller's to wait", s.count("report"), sl.recorded())
	}
}

func TestReportUsageGivesUpAfterMaxAttempts(t *testing.T) {
	s := newUsageServer(t)
	s.faults = func(string, int) fault { return fail503 }
	sl := newSleeps()
	c := newClient(t, s, sl, sdk.WithRetry(sdk.RetryPolicy{MaxAttempts: 5, BaseDelay: 100 * time.Millisecond, MaxDelay: 300 * time.Millisecond}))
	_, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1)})
	var ae *sdk.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable {
		t.Fatalf("err = %v, want the last 503", err)
	}
	if s.count("report") != 5 {
		t.Errorf("%d attempts, want 5", s.count("report"))
	}
	// Exponential, jittered into [d/2, d), capped at MaxDelay.
	bounds := []time.Duration{100, 200, 300, 300}
	waits := sl.recorded()
	if len(waits) != len(bounds) {
		t.Fatalf("waits = %v", waits)
	}
	for i, w := range waits {
		hi := bounds[i] * time.Millisecond
		if w < hi/2 || w >= hi {
			t.Errorf("wait %d = %v, want in [%v, %v)", i+1, w, hi/2, hi)
		}
	}
}

func TestReportUsageNetworkFailureGivesUp(t *testing.T) {
	s := newUsageServer(t)
	s.faults = func(string, int) fault { return dropBeforeRecord }
	sl := newSleeps()
	c := newClient(t, s, sl, sdk.WithRetry(sdk.RetryPolicy{MaxAttempts: 3}))
	_, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1)})
	var ae *sdk.APIError
	if err == nil || errors.As(err, &ae) {
		t.Fatalf("err = %v, want a transport error", err)
	}
	if len(sl.recorded()) != 2 {
		t.Errorf("waits = %v, want 2", sl.recorded())
	}
}

func TestReportUsageStopsWithTheContext(t *testing.T) {
	s := newUsageServer(t)
	s.faults = func(string, int) fault { return fail503 }
	sl := newSleeps()
	c := newClient(t, s, sl)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.ReportUsage(ctx, sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if len(sl.recorded()) != 0 {
		t.Errorf("waited %v after the context ended", sl.recorded())
	}
}

func TestReportUsageValidatesLocally(t *testing.T) {
	s := newUsageServer(t)
	c := newClient(t, s, newSleeps())
	for _, r := range []sdk.Report{
		{UnitsUsed: sdk.WholeUnits(1)},
		{UserID: "user-1"},
		{UserID: "user-1", UnitsUsed: -1},
	} {
		if _, err := c.ReportUsage(context.Background(), r); err == nil {
			t.Errorf("ReportUsage(%+v) succeeded", r)
		}
	}
	if s.count("report") != 0 {
		t.Errorf("%d invalid reports were sent", s.count("report"))
	}
}

func TestReportUsageOwnIdempotencyKeyAndPrefix(t *testing.T) {
	s := newUsageServer(t)
	sl := newSleeps()
	c := newClient(t, s, sl, sdk.WithUsagePrefix("/usage/api/v1/"))
	r := sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(2), IdempotencyKey: "order-42"}
	first, err := c.ReportUsage(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	// The same logical report sent again later, by a restarted process.
	again, err := c.ReportUsage(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if first.Replayed || !again.Replayed || again.IdempotencyKey != "order-42" || s.unitsOf("user-1") != sdk.WholeUnits(2) {
		t.Errorf("first %+v, again %+v, counted %s", first, again, s.unitsOf("user-1"))
	}
	if p := s.sent("report")[0].URL.Path; p != "/usage/api/v1/report" {
		t.Errorf("path = %s", p)
	}
}

func TestNewClientRefusesBadSettings(t *testing.T) {
	for _, tt := range []struct {
		base, service, secret string
		opts                  []sdk.Option
	}{
		{"ftp://x", "svc", "s", nil},
		{"/relative", "svc", "s", nil},
		{"http://x", "", "s", nil},
		{"http://x", "svc", "", nil},
		{"http://x", "svc", "s", []sdk.Option{sdk.WithBrand("Bad Brand")}},
		{"http://x", "svc", "s", []sdk.Option{sdk.WithCoreBaseURL("nope")}},
	} {
		if _, err := sdk.NewClient(tt.base, tt.service, tt.secret, tt.opts...); err == nil {
			t.Errorf("NewClient(%q, %q, %q) succeeded", tt.base, tt.service, tt.secret)
		}
	}
}

func TestECSPrefixes(t *testing.T) {
	s := newUsageServer(t)
	s.preflightStatus, s.preflightBody = http.StatusOK, validBody
	c := newClient(t, s, newSleeps(), sdk.WithECSPrefixes())
	if _, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.MustUnits("0.000001")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ValidateKey(context.Background(), serviceKey); err != nil {
		t.Fatal(err)
	}
	if a, b := s.sent("report")[0].URL.Path, s.sent("validate")[0].URL.Path; a != "/usage/api/v1/report" || b != "/core/api/v1/service-keys/validate" {
		t.Errorf("paths %s, %s", a, b)
	}
	if got := s.body("report", 0); !strings.Contains(got, `"unitsUsed":0.000001,`) {
		t.Errorf("body = %s", got)
	}
}

func TestMustUnitsPanicsOnInvalidDecimal(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("MustUnits(\"1.2345678\") did not panic")
		}
	}()
	sdk.MustUnits("1.2345678")
}

// A report answered 200 was counted: a context that ends right after the
// answer arrived must not turn it into a failure.
func TestReportUsageAnswerSurvivesContextEnd(t *testing.T) {
	s := newUsageServer(t)
	sl := newSleeps()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var buf syncBuffer
	c := newClient(t, s, sl, sdk.WithReconciliationLog(sdk.NewJSONLinesLog(&buf)),
		sdk.WithHTTPClient(&http.Client{Transport: cancelAfter{http.DefaultTransport, cancel}}))
	if _, err := c.ReportUsage(ctx, sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1)}); err != nil {
		t.Fatalf("ReportUsage: %v", err)
	}
	if ls := lines(t, buf.String()); len(ls) != 1 || ls[0].str("status") != sdk.OutcomeRecorded {
		t.Errorf("log = %s", buf.String())
	}
}

// cancelAfter ends the context as soon as an answer's body is read.
type cancelAfter struct {
	rt     http.RoundTripper
	cancel context.CancelFunc
}

func (c cancelAfter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(r)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		c.cancel()
	}
	return resp, err
}
