package platform

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// cliRunBoth runs `caddy platform <args>` like cliRun and returns standard
// output and standard error.
func cliRunBoth(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	root := &cobra.Command{Use: "platform"}
	caddycmd.Commands()["platform"].CobraFunc(root)
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), errOut.String(), err
}

func TestCLIViews(t *testing.T) {
	env := admStart(t)
	ctx := context.Background()
	ds := env.app.DataStore()

	cliMust(t, "subscribe", "--user", "erin", "--service", "weather", "--product", "pro")
	for i := range 5 {
		if _, err := ds.PutSubscription(ctx, store.Subscription{UserID: fmt.Sprintf("zed-%d", i), ServiceID: "weather", ProductID: "basic", Status: "TRIAL"}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	for i, st := range []string{store.JobPending, store.JobPending, store.JobCompleted, store.JobPending} {
		if err := ds.CreateJob(ctx, store.Job{ID: fmt.Sprintf("job-%d", i), UserID: "erin", ServiceID: "weather", EndpointID: "forecast",
			Status: st, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}

	// Pages of 2 are followed to the end: every row once.
	out := cliMust(t, "subscription", "list", "--limit", "2")
	if !strings.HasPrefix(out, "USER") || strings.Count(out, "\n") != 1+6 || !strings.Contains(out, "erin") || !strings.Contains(out, "zed-4") {
		t.Errorf("subscription list printed:\n%s", out)
	}
	out = cliMust(t, "subscription", "list", "--user", "zed-3")
	if strings.Count(out, "\n") != 2 || !strings.Contains(out, "TRIAL") {
		t.Errorf("subscription list --user zed-3 printed:\n%s", out)
	}
	out = cliMust(t, "subscription", "list", "--limit", "4", "--json")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !json.Valid([]byte(lines[0])) {
		t.Errorf("subscription list --json printed one JSON page a line? %s", out)
	}
	out = cliMust(t, "subscription", "show", "--user", "erin", "--service", "weather")
	for _, want := range []string{"User:    erin", "Product: pro (SUBSCRIPTION)", "Usage:   0 units used of 1000 included, 1000 left", "Period:"} {
		if !strings.Contains(out, want) {
			t.Errorf("subscription show lacks %q:\n%s", want, out)
		}
	}
	out = cliMust(t, "summary", "--user", "erin")
	if !strings.HasPrefix(out, "User erin, billing periods at ") || !strings.Contains(out, "1000 left") || !strings.Contains(out, "Spend:") {
		t.Errorf("summary printed:\n%s", out)
	}

	// A product change says what it did to the current period.
	out = cliMust(t, "subscribe", "--user", "erin", "--service", "weather", "--product", "basic")
	if !strings.Contains(out, "Product changed from pro to basic") || !strings.Contains(out, "Current period ") || !strings.Contains(out, "0 requests used") {
		t.Errorf("subscribe (a change) printed:\n%s", out)
	}

	out = cliMust(t, "jobs", "--status", "pending", "--limit", "1")
	if strings.Count(out, "PENDING") != 3 || strings.Contains(out, "COMPLETED") {
		t.Errorf("jobs --status pending printed:\n%s", out)
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"jobs", "--status", "DONE"}, "HTTP 400 invalid_request: status must be one of"},
		{[]string{"subscription", "list", "--limit", "0"}, "(field limit)"},
		{[]string{"summary"}, "--user is required"},
		{[]string{"summary", "--user", "erin", "--at", "soon"}, "(field at)"},
		{[]string{"subscription", "show", "--user", "nobody", "--service", "weather"}, "HTTP 404 not_found"},
	} {
		if out, err := cliRun(t, bad.args...); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("caddy platform %s: %v (printed %q), want %q", strings.Join(bad.args, " "), err, out, bad.want)
		}
	}
}

// Errors are one plain line on standard error, as docs/operations.md
// shows them, not a JSON log line; an admin endpoint that does not answer
// gets a hint.
func TestCLIErrorsArePlainText(t *testing.T) {
	admStart(t)
	_, stderr, err := cliRunBoth(t, "key", "create", "--user", "a/b", "--address", admAddr)
	if err == nil {
		t.Fatal("key create --user a/b succeeded")
	}
	if want := "Error: HTTP 400 invalid_request: userId must be"; !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 || strings.Contains(stderr, `"level"`) {
		t.Errorf("stderr %q, want one plain line starting %q", stderr, want)
	}

	// Nothing listens on port 1 of loopback.
	_, stderr, err = cliRunBoth(t, "key", "list", "--address", "127.0.0.1:1")
	if err == nil {
		t.Fatal("key list against a dead address succeeded")
	}
	for _, want := range []string{"cannot reach the admin endpoint 127.0.0.1:1: is the server running?", "--address or --config"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q: %s", want, stderr)
		}
	}
	if strings.Contains(stderr, `"level"`) {
		t.Errorf("stderr is a log line: %s", stderr)
	}
}

// The key-created log line carries expires_at only for a key that expires.
func TestKeyCreatedLogExpiry(t *testing.T) {
	env := admStart(t)
	never := cliMust(t, "key", "create", "--user", "nora", "--json")
	expiring := cliMust(t, "key", "create", "--user", "nora", "--expires", "2099-01-01", "--json")
	var k1, k2 ops.KeyView
	json.Unmarshal([]byte(never), &k1)
	json.Unmarshal([]byte(expiring), &k2)
	env.stop()
	f, err := os.Open(env.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	found := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil || line["msg"] != "service key created" {
			continue
		}
		_, has := line["expires_at"]
		switch line["key_id"] {
		case k1.ID:
			found++
			if has {
				t.Errorf("a key that never expires logged expires_at: %s", sc.Bytes())
			}
		case k2.ID:
			found++
			if !has {
				t.Errorf("an expiring key logged no expires_at: %s", sc.Bytes())
			}
		}
	}
	if found != 2 {
		t.Errorf("found %d key-created lines, want 2", found)
	}
}

// The CLI's usage line reads as English: "6 requests used", not "6
// request used" (issue 33); abbreviations and plurals stay as written.
func TestUnitsOf(t *testing.T) {
	for _, c := range []struct{ amount, label, want string }{
		{"6", "request", "requests"},
		{"0", "word", "words"},
		{"1", "request", "request"},
		{"2.5", "token", "tokens"},
		{"3", "tokens", "tokens"},
		{"40", "ms", "ms"},
		{"7", "KB", "KB"},
		{"7", "page view", "page view"},
	} {
		if got := unitsOf(json.Number(c.amount), c.label); got != c.want {
			t.Errorf("unitsOf(%s, %q) = %q, want %q", c.amount, c.label, got, c.want)
		}
	}
}
