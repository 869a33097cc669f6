package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/alerts"
	"github.com/platformgw/gateway/internal/billing"
)

// verifier runs one of the examples on a webhook: timestamp and signature
// as arguments, the body on stdin, the secret, the seen-ids file and the
// clock in the environment. It returns what the example printed and
// whether it exited 0.
type verifier func(t *testing.T, env []string, ts, sig string, body []byte) (string, bool)

// interpreter is the path of an interpreter the examples need. On CI
// (CI=true, where .ci/run installs them) a missing one fails the test;
// elsewhere that example is skipped, saying why.
func interpreter(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed: .ci/run installs it, and on CI the example must be tested", name)
		}
		t.Skipf("%s is not installed; CI runs this example", name)
	}
	return p
}

func script(interp, file string) verifier {
	return func(t *testing.T, env []string, ts, sig string, body []byte) (string, bool) {
		t.Helper()
		cmd := exec.Command(interp, file, ts, sig)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdin = bytes.NewReader(body)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if _, exit := err.(*exec.ExitError); err != nil && !exit {
			t.Fatalf("%s %s: %v", interp, file, err)
		}
		if stderr.Len() > 0 {
			t.Fatalf("%s %s wrote to stderr (a crash, not a refusal): %s", interp, file, stderr.String())
		}
		return strings.TrimSpace(string(out)), err == nil
	}
}

func goVerifier(t *testing.T, env []string, ts, sig string, body []byte) (string, bool) {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	var out bytes.Buffer
	code := run([]string{ts, sig}, func(k string) string { return vars[k] }, bytes.NewReader(body), &out)
	return strings.TrimSpace(out.String()), code == 0
}

// TestVerifiers: each verifier example of docs/alerts.md (verify.go,
// verify.py, verify.js) accepts a webhook signed by the gateway's own
// code (internal/alerts) once, acknowledges its replay and a retry of the
// same event without acting again, and refuses a bad signature, a
// tampered body, a stale or future timestamp and a malformed one, none of
// which marks the event as seen. The clock is injected (ALERT_NOW).
func TestVerifiers(t *testing.T) {
	examples := map[string]func(t *testing.T) verifier{
		"go":     func(*testing.T) verifier { return goVerifier },
		"python": func(t *testing.T) verifier { return script(interpreter(t, "python3"), "verify.py") },
		"node":   func(t *testing.T) verifier { return script(interpreter(t, "node"), "verify.js") },
	}
	for name, mk := range examples {
		t.Run(name, func(t *testing.T) {
			testVerifier(t, mk(t))
		})
	}
}

func testVerifier(t *testing.T, verify verifier) {
	const secret = "example-alert-secret-0123"
	now := time.Date(2026, 11, 23, 15, 58, 40, 0, time.UTC)
	env := []string{
		"ALERT_SECRET=" + secret,
		"ALERT_SEEN_FILE=" + filepath.Join(t.TempDir(), "seen.txt"),
		"ALERT_NOW=" + strconv.FormatInt(now.Unix(), 10),
	}
	event := func(id string) []byte {
		b, err := alerts.Event{EventID: id, CreatedAt: now.Add(-3 * time.Second), UserID: "user-1", ServiceID: "weather",
			ProductID: "basic", PeriodStart: now.AddDate(0, 0, -6), Threshold: "quota 80%", Metric: "quota",
			Value: billing.Whole(800), Limit: billing.Whole(800)}.Body()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	expect := func(what, ts, sig string, body []byte, want string, ok bool) {
		t.Helper()
		got, exit0 := verify(t, env, ts, sig, body)
		if got != want || exit0 != ok {
			t.Errorf("%s: %q (exit 0: %v), want %q (exit 0: %v)", what, got, exit0, want, ok)
		}
	}

	// Refused, and none of them marks alt_1 as seen.
	body := event("alt_1")
	sig, ts := alerts.Sign([]byte(secret), body, now.Add(-6*time.Minute))
	expect("stale timestamp", ts, sig, body, "refused: timestamp outside the window", false)
	sig, ts = alerts.Sign([]byte(secret), body, now.Add(6*time.Minute))
	expect("future timestamp", ts, sig, body, "refused: timestamp outside the window", false)
	sig, ts = alerts.Sign([]byte("another-secret-of-someone-else"), body, now)
	expect("another secret", ts, sig, body, "refused: bad signature", false)
	sig, ts = alerts.Sign([]byte(secret), body, now)
	expect("tampered body", ts, sig, bytes.Replace(body, []byte(`"value":800`), []byte(`"value":900`), 1), "refused: bad signature", false)
	expect("signature of another time", strconv.FormatInt(now.Unix()-1, 10), sig, body, "refused: bad signature", false)
	expect("empty signature", ts, "", body, "refused: bad signature", false)
	expect("no timestamp", "", sig, body, "refused: missing or malformed timestamp", false)
	expect("signed timestamp", "+"+ts, sig, body, "refused: missing or malformed timestamp", false)
	expect("timestamp in words", "soon", sig, body, "refused: missing or malformed timestamp", false)
	noID := []byte(`{"type":"usage.alert"}`)
	nsig, nts := alerts.Sign([]byte(secret), noID, now)
	expect("no eventId", nts, nsig, noID, "refused: no eventId in the body", false)

	// Accepted once; the replay of the same request, and a retry of the
	// same event signed anew, are acknowledged as duplicates.
	expect("valid", ts, sig, body, "accepted alt_1", true)
	expect("replayed", ts, sig, body, "duplicate alt_1", true)
	rsig, rts := alerts.Sign([]byte(secret), body, now.Add(90*time.Second))
	expect("retried", rts, rsig, body, "duplicate alt_1", true)
	// The window's edges, on other events.
	b2 := event("alt_2")
	sig2, ts2 := alerts.Sign([]byte(secret), b2, now.Add(-5*time.Minute))
	expect("5 minutes old", ts2, sig2, b2, "accepted alt_2", true)
	b3 := event("alt_3")
	sig3, ts3 := alerts.Sign([]byte(secret), b3, now.Add(-5*time.Minute-time.Second))
	expect("5 minutes and 1 second old", ts3, sig3, b3, "refused: timestamp outside the window", false)
	expect("alt_2 again", ts2, sig2, b2, "duplicate alt_2", true)
}

// TestDocsShowTheseExamples: the verifier docs/alerts.md shows is this
// directory's verify.py, line for line, so the page cannot drift from the
// tested code.
func TestDocsShowTheseExamples(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "alerts.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("verify.py")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "```python\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed {
		t.Fatal("docs/alerts.md shows no Python verifier")
	}
	n := 0
	for _, line := range strings.Split(block, "\n") {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "...") {
			continue
		}
		n++
		if !strings.Contains(string(src), line+"\n") {
			t.Errorf("docs/alerts.md shows %q, which verify.py does not have", line)
		}
	}
	if n < 5 {
		t.Fatalf("the Python block of docs/alerts.md has %d lines of code", n)
	}
	for _, f := range []string{"verify.go", "verify.py", "verify.js"} {
		if !strings.Contains(string(doc), "examples/alertverify/"+f) {
			t.Errorf("docs/alerts.md does not link %s", f)
		}
	}
}
