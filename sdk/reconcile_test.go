package sdk_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/platformgw/gateway/sdk"
)

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logLine is a reconciliation record as written, read back generically so
// the test sees the JSON field names.
type logLine map[string]json.RawMessage

func lines(t *testing.T, text string) []logLine {
	t.Helper()
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("not a JSON line: %q: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

func (l logLine) str(k string) string {
	var s string
	json.Unmarshal(l[k], &s)
	return s
}

func (l logLine) response() (status int, body json.RawMessage, errText string) {
	var r struct {
		StatusCode int             `json:"statusCode"`
		Body       json.RawMessage `json:"body"`
		Error      string          `json:"error"`
	}
	json.Unmarshal(l["response"], &r)
	return r.StatusCode, r.Body, r.Error
}

// noSecrets fails if the log holds the key, the secret, or a signature.
func noSecrets(t *testing.T, text string, s *usageServer) {
	t.Helper()
	forbidden := []string{serviceKey, secret, "gw+forward/signature==", "gw%2Bforward%2Fsignature%3D%3D"}
	forbidden = append(forbidden, s.signatures()...)
	for _, f := range forbidden {
		if strings.Contains(text, f) {
			t.Errorf("the reconciliation log contains %q:\n%s", f, text)
		}
	}
}

func TestReconciliationLogReport(t *testing.T) {
	s := newUsageServer(t)
	var buf syncBuffer
	c := newClient(t, s, newSleeps(), sdk.WithReconciliationLog(sdk.NewJSONLinesLog(&buf)))
	_, err := c.ReportUsage(context.Background(), sdk.Report{
		UserID: "user-1", UnitsUsed: units(t, "12.5"), RequestID: "gw-req-1",
		BackendRequestID: "be-77", Endpoint: "POST /summarize",
		KeyRef: serviceKey, // a mistake: the key itself must never be written
	})
	if err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	ls := lines(t, text)
	if len(ls) != 1 {
		t.Fatalf("%d lines, want 1:\n%s", len(ls), text)
	}
	l := ls[0]
	if l.str("operation") != "report" || l.str("platformRequestId") != "gw-req-1" || l.str("backendRequestId") != "be-77" ||
		l.str("endpoint") != "POST /summarize" || l.str("userId") != "user-1" || l.str("serviceId") != "svc-1" ||
		l.str("status") != sdk.OutcomeRecorded || l.str("timestamp") != "2026-01-01T00:00:00Z" ||
		string(l["unitsReported"]) != "12.5" || l.str("idempotencyKey") == "" || string(l["attempts"]) != "1" {
		t.Errorf("line = %s", text)
	}
	if ref := l.str("keyRef"); ref != sdk.KeyReference(serviceKey) || !strings.HasPrefix(ref, "sha256:") {
		t.Errorf("keyRef = %q, want the key's hash reference", ref)
	}
	status, body, _ := l.response()
	if status != 200 || !strings.Contains(string(body), `"reportSchemaVersion":2`) {
		t.Errorf("response = %d %s", status, body)
	}
	noSecrets(t, text, s)
}

func TestReconciliationLogOutcomes(t *testing.T) {
	keyID := "key_AbCdEfGhIjKlMnOpQrSt"
	for _, tt := range []struct {
		name      string
		faults    func(string, int) fault
		status    string
		code      int
		wantError bool
	}{
		{"refused", func(string, int) fault { return fail400 }, sdk.OutcomeRefused, 400, true},
		{"no answer", func(string, int) fault { return dropBeforeRecord }, sdk.OutcomeUnknown, 0, true},
		{"unavailable", func(string, int) fault { return fail503 }, sdk.OutcomeUnknown, 503, true},
		{"replayed", func(_ string, n int) fault {
			if n == 1 {
				return dropAfterRecord
			}
			return noFault
		}, sdk.OutcomeReplayed, 200, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newUsageServer(t)
			s.faults = tt.faults
			var buf syncBuffer
			c := newClient(t, s, newSleeps(), sdk.WithReconciliationLog(sdk.NewJSONLinesLog(&buf)),
				sdk.WithRetry(sdk.RetryPolicy{MaxAttempts: 2}))
			_, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1), KeyRef: keyID})
			if (err != nil) != tt.wantError {
				t.Fatalf("err = %v", err)
			}
			ls := lines(t, buf.String())
			if len(ls) != 1 {
				t.Fatalf("%d lines, want one per report:\n%s", len(ls), buf.String())
			}
			l := ls[0]
			status, _, errText := l.response()
			if l.str("status") != tt.status || status != tt.code || (errText != "") != tt.wantError ||
				l.str("keyRef") != keyID || l.str("idempotencyKey") == "" {
				t.Errorf("line = %s", buf.String())
			}
			noSecrets(t, buf.String(), s)
		})
	}
}

func TestReconciliationLogCompletion(t *testing.T) {
	s := newUsageServer(t)
	s.faults = func(string, int) fault { return dropBeforeRecord }
	var buf syncBuffer
	c := newClient(t, s, newSleeps(), sdk.WithReconciliationLog(sdk.NewJSONLinesLog(&buf)), sdk.WithRetry(sdk.RetryPolicy{MaxAttempts: 2}))
	callbackURL, _ := handedOut(s.srv.URL, "complete")
	u := sdk.WholeUnits(4)
	_, err := c.ReportCompletion(context.Background(), callbackURL, sdk.Completion{Units: &u, UserID: "user-1", KeyRef: serviceKey})
	if err == nil {
		t.Fatal("a completion nobody answered succeeded")
	}
	if strings.Contains(err.Error(), "signature") {
		t.Errorf("the error quotes the callback URL's query: %v", err)
	}
	ls := lines(t, buf.String())
	if len(ls) != 1 || ls[0].str("operation") != "completion" || ls[0].str("platformRequestId") != jobID ||
		string(ls[0]["unitsReported"]) != "4" || ls[0].str("status") != sdk.OutcomeUnknown {
		t.Fatalf("log = %s", buf.String())
	}
	noSecrets(t, buf.String(), s)
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestReconciliationLogFailureDoesNotFailTheReport(t *testing.T) {
	s := newUsageServer(t)
	var logged []error
	c := newClient(t, s, newSleeps(), sdk.WithReconciliationLog(sdk.NewJSONLinesLog(failingWriter{})),
		sdk.WithLogErrorHandler(func(err error) { logged = append(logged, err) }))
	if _, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1)}); err != nil {
		t.Fatalf("ReportUsage failed for its log: %v", err)
	}
	if len(logged) != 1 || !strings.Contains(logged[0].Error(), "disk full") {
		t.Errorf("log errors = %v", logged)
	}
}

func TestJSONLinesLogConcurrentFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.jsonl")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := newUsageServer(t)
	c := newClient(t, s, newSleeps(), sdk.WithReconciliationLog(sdk.NewJSONLinesLog(f)))
	var wg sync.WaitGroup
	for range 25 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(1), KeyRef: serviceKey})
		}()
	}
	wg.Wait()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if ls := lines(t, string(text)); len(ls) != 25 {
		t.Errorf("%d lines, want 25", len(ls))
	}
	noSecrets(t, string(text), s)
}

func TestKeyReferences(t *testing.T) {
	var buf bytes.Buffer
	log := sdk.NewJSONLinesLog(&buf)
	for _, ref := range []string{serviceKey, "key_AbC123", sdk.KeyReference("x"), "550e8400-e29b-41d4-a716-446655440000", "key_not/an id"} {
		if err := log.Record(sdk.ReconciliationRecord{KeyRef: ref, Status: sdk.OutcomeRecorded}); err != nil {
			t.Fatal(err)
		}
	}
	ls := lines(t, buf.String())
	want := []string{sdk.KeyReference(serviceKey), "key_AbC123", sdk.KeyReference("x"),
		"550e8400-e29b-41d4-a716-446655440000", sdk.KeyReference("key_not/an id")}
	for i, l := range ls {
		if got := l.str("keyRef"); got != want[i] {
			t.Errorf("keyRef %d = %q, want %q", i, got, want[i])
		}
	}
	if strings.Contains(buf.String(), serviceKey) {
		t.Error("a hand-built record wrote the key")
	}
	if r := sdk.KeyReference(serviceKey); len(r) != len("sha256:")+16 {
		t.Errorf("KeyReference = %q", r)
	}
}

func TestJSONLinesLogToAPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	go io.Copy(io.Discard, r)
	l := sdk.NewJSONLinesLog(w)
	if err := l.Record(sdk.ReconciliationRecord{Status: "recorded"}); err != nil {
		t.Fatalf("a pipe (stderr under a supervisor) must take records: %v", err)
	}
}
