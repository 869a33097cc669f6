package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/sdk"
)

// The examples/ backends run here on loopback as their mains run them, on
// the SDK, against the real gateway. Their catalog mirrors
// Caddyfile.example: echo (sync, examples/backend), jobs (async,
// examples/asyncbackend) and wordcount (not proxied, examples/reporter).
const (
	exampleEchoSecret      = "example-echo-secret-0000000000001"
	exampleJobsSecret      = "example-jobs-secret-0000000000002"
	exampleWordcountSecret = "example-wordcount-secret-00000003"
)

func examplesCatalog(echoURL, jobsURL, wordcountURL string) string {
	return fmt.Sprintf(`
		service echo {
			backend %s
			secret %s
			owners echo-owner
			endpoint hello {
				methods GET POST
				path /hello
			}
			endpoint complete {
				methods POST
				path /complete
			}
			product free {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 1000
			}
			product tokens {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				unit token
				price 0.00002
			}
		}
		service jobs {
			backend %s
			secret %s
			endpoint upper {
				methods POST
				async
			}
			product words {
				billing SUBSCRIPTION
				measurement PER_TOKEN
				unit word
				quota 100
			}
		}
		service wordcount {
			backend %s
			secret %s
			endpoint count {
				methods POST
				cost 0
			}
			product words {
				billing SUBSCRIPTION
				measurement PER_TOKEN
				unit word
				quota 10
				overage block
			}
		}`, echoURL, exampleEchoSecret, jobsURL, exampleJobsSecret, wordcountURL, exampleWordcountSecret)
}

// exampleClient is an SDK client of service against the test gateway,
// with fast retries and its reconciliation log in log.
func exampleClient(t *testing.T, service, secret string, log *exampleLog, opts ...sdk.Option) *sdk.Client {
	t.Helper()
	opts = append([]sdk.Option{
		sdk.WithReconciliationLog(sdk.NewJSONLinesLog(log)),
		sdk.WithLogErrorHandler(func(err error) { t.Errorf("reconciliation log: %v", err) }),
		sdk.WithRetry(sdk.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}),
	}, opts...)
	c, err := sdk.NewClient(gwBase, service, secret, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// exampleLog is a reconciliation log, or a process's output, kept in
// memory.
type exampleLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *exampleLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *exampleLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// records decodes the log, one JSON object per line.
func (l *exampleLog) records(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("reconciliation log line is not JSON: %q", line)
		}
		out = append(out, m)
	}
	return out
}

// waitRecords waits (10s at most) until the log holds n records, and
// returns them. The async example logs a completion when the gateway has
// answered it, which can be after the job reads COMPLETED to its caller:
// reading the log at once lost that race now and then.
func (l *exampleLog) waitRecords(t *testing.T, n int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs := l.records(t)
		if len(recs) >= n || time.Now().After(deadline) {
			return recs
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exampleStatus polls a job's status URL as its caller until until says
// yes, and returns that status.
func exampleStatus(t *testing.T, statusURL, key string, until func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, body := call(t, "GET", statusURL, key, "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status: %d %s", resp.StatusCode, body)
		}
		st := usageJSON(t, body)
		if until(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("job never reached the awaited state; last status %s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func exampleState(status string) func(map[string]any) bool {
	return func(st map[string]any) bool { return st["status"] == status }
}

// gatedTransport holds the requests whose path contains hold until open is
// closed (or the request's context ends), so a test can look at a job
// between its progress and its completion.
type gatedTransport struct {
	hold string
	open chan struct{}
}

func (g *gatedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, g.hold) {
		select {
		case <-g.open:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return http.DefaultTransport.RoundTrip(r)
}

// exampleShutdown stops an example as its main does on SIGTERM, within a
// bound.
func exampleShutdown(t *testing.T, shutdown func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}
