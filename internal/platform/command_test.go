package platform

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// cliRun runs `caddy platform <args> --address localhost:2999` in process,
// through the command as registered with caddycmd, and returns what it
// printed on standard output.
func cliRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	registered, ok := caddycmd.Commands()["platform"]
	if !ok {
		t.Fatal("the platform command is not registered")
	}
	root := &cobra.Command{Use: "platform", SilenceUsage: true}
	registered.CobraFunc(root)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(io.Discard)
	if !slices.Contains(args, "--address") {
		args = append(args, "--address", admAddr)
	}
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func cliMust(t *testing.T, args ...string) string {
	t.Helper()
	out, err := cliRun(t, args...)
	if err != nil {
		t.Fatalf("caddy platform %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

var cliKeyLine = regexp.MustCompile(`(?m)^Key:\s+(\S+)$`)
var cliKeyIDLine = regexp.MustCompile(`(?m)^Key ID:\s+([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$`)

func TestCLIKeys(t *testing.T) {
	env := admStart(t)
	ctx := context.Background()

	out := cliMust(t, "key", "create", "--user", "carol", "--roles", "reader,writer", "--label", "CI runner", "--expires", "720h")
	m, id := cliKeyLine.FindStringSubmatch(out), cliKeyIDLine.FindStringSubmatch(out)
	if m == nil || id == nil || !servicekey.WellFormed(m[1]) {
		t.Fatalf("key create printed:\n%s", out)
	}
	key, keyID := m[1], id[1]
	if !strings.Contains(out, "shown only this once") || !strings.Contains(out, "reader,writer") {
		t.Errorf("key create printed:\n%s", out)
	}
	rec, err := env.app.DataStore().KeyByHash(ctx, servicekey.Hash(key))
	if err != nil || rec.ID != keyID || rec.Label != "CI runner" || !slices.Equal(rec.Roles, []string{"reader", "writer"}) {
		t.Fatalf("stored key %+v, %v", rec, err)
	}
	if d := time.Until(rec.ExpiresAt); d < 719*time.Hour || d > 721*time.Hour {
		t.Errorf("--expires 720h stored expiry %v", rec.ExpiresAt)
	}

	// --json is for scripts: the API's response as is.
	out = cliMust(t, "key", "create", "--user", "carol", "--expires", "2099-01-01T00:00:00Z", "--json")
	var created ops.KeyView
	if err := json.Unmarshal([]byte(out), &created); err != nil || !servicekey.WellFormed(created.Key) ||
		created.UserID != "carol" || !created.ExpiresAt.Equal(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("key create --json printed %s (%v)", out, err)
	}

	out = cliMust(t, "key", "list", "--user", "carol")
	if !strings.HasPrefix(out, "KEY ID") || !strings.Contains(out, keyID) || !strings.Contains(out, created.ID) ||
		strings.Contains(out, key) || strings.Contains(out, created.Key) || strings.Count(out, "active") != 2 {
		t.Fatalf("key list printed:\n%s", out)
	}
	out = cliMust(t, "key", "list", "--json")
	var list struct{ Keys []ops.KeyView }
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Keys) != 2 {
		t.Fatalf("key list --json printed %s (%v)", out, err)
	}

	out = cliMust(t, "key", "show", keyID)
	if !strings.Contains(out, "User:    carol") || !strings.Contains(out, "Status:  active") || strings.Contains(out, key) {
		t.Errorf("key show printed:\n%s", out)
	}

	out = cliMust(t, "key", "revoke", keyID)
	if !strings.HasPrefix(out, "Revoked "+keyID+" of user carol at ") {
		t.Errorf("key revoke printed %q", out)
	}
	cliMust(t, "key", "revoke", keyID) // again: harmless
	if rec, _ := env.app.DataStore().KeyByID(ctx, keyID); rec.RevokedAt.IsZero() {
		t.Error("the key is not revoked in the store")
	}
	if out = cliMust(t, "key", "list", "--user", "carol"); strings.Count(out, "revoked") != 1 {
		t.Errorf("key list after revoke:\n%s", out)
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"key", "create"}, "--user is required"},
		{[]string{"key", "create", "--user", "carol", "--expires", "soon"}, "--expires"},
		{[]string{"key", "create", "--user", "a/b"}, "HTTP 400 invalid_request: userId must be"},
		{[]string{"key", "create", "--user", "carol", "--roles", "a b"}, "roles"},
		{[]string{"key", "revoke", "key_unknown"}, "HTTP 404"},
		{[]string{"key", "revoke"}, "accepts 1 arg"},
		{[]string{"key", "show", "key_unknown"}, "HTTP 404 not_found: no service key"},
	} {
		if out, err := cliRun(t, bad.args...); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("caddy platform %s: %v (printed %q), want an error with %q", strings.Join(bad.args, " "), err, out, bad.want)
		}
	}
	if keys, _ := env.app.DataStore().ListKeys(ctx, ""); len(keys) != 2 {
		t.Errorf("refused commands changed the keys: %d stored", len(keys))
	}
}

func TestCLISubscriptionsAndCredits(t *testing.T) {
	env := admStart(t)
	ctx := context.Background()

	out := cliMust(t, "subscribe", "--user", "dave", "--service", "weather", "--product", "basic", "--status", "trial")
	if !strings.Contains(out, "User dave is subscribed to service weather, product basic, status TRIAL") {
		t.Errorf("subscribe printed %q", out)
	}
	out = cliMust(t, "subscribe", "--user", "dave", "--service", "weather", "--product", "pro", "--json")
	var sub store.Subscription
	if err := json.Unmarshal([]byte(out), &sub); err != nil || sub.ProductID != "pro" || sub.Status != "ACTIVE" {
		t.Fatalf("subscribe --json printed %s (%v)", out, err)
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"subscribe", "--user", "dave", "--service", "weather"}, "--product is required"},
		{[]string{"subscribe", "--service", "weather", "--product", "basic"}, "--user is required"},
		{[]string{"subscribe", "--user", "dave", "--service", "rain", "--product", "basic"}, "(field serviceId)"},
		{[]string{"subscribe", "--user", "dave", "--service", "weather", "--product", "gold"}, "(field productId)"},
		{[]string{"subscribe", "--user", "dave", "--service", "weather", "--product", "basic", "--status", "paused"}, "(field status)"},
		{[]string{"credits", "add", "--user", "dave", "--service", "weather"}, "--amount is required"},
		{[]string{"credits", "add", "--user", "dave", "--service", "weather", "--amount", "0"}, "(field amount)"},
		{[]string{"credits", "add", "--user", "dave", "--service", "weather", "--amount", "ten"}, "(field amount)"},
		{[]string{"credits", "add", "--user", "erin", "--service", "weather", "--amount", "1"}, "HTTP 404"},
	} {
		if out, err := cliRun(t, bad.args...); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("caddy platform %s: %v (printed %q), want an error with %q", strings.Join(bad.args, " "), err, out, bad.want)
		}
	}
	if got, _ := env.app.DataStore().GetSubscription(ctx, "dave", "weather"); got.ProductID != "pro" || got.Status != "ACTIVE" || got.Credits != 0 {
		t.Fatalf("refused commands changed the subscription: %+v", got)
	}

	out = cliMust(t, "credits", "add", "--user", "dave", "--service", "weather", "--amount", "10.5")
	if out != "Credits of user dave on service weather: 10.5\n" {
		t.Errorf("credits add printed %q", out)
	}
	out = cliMust(t, "credits", "add", "--user", "dave", "--service", "weather", "--amount", "-0.000001")
	if out != "Credits of user dave on service weather: 10.499999\n" {
		t.Errorf("credits add printed %q", out)
	}
	if got, _ := env.app.DataStore().GetSubscription(ctx, "dave", "weather"); got.Credits != 10_499_999 {
		t.Errorf("stored balance %v, want 10.499999", got.Credits)
	}
}

func TestCLIUsageAndJob(t *testing.T) {
	env := admStart(t)
	cliMust(t, "subscribe", "--user", "erin", "--service", "weather", "--product", "basic")
	jan := time.Date(2026, 1, 5, 10, 0, 0, 0, time.UTC)
	feb := time.Date(2026, 2, 5, 10, 0, 0, 0, time.UTC)
	admRecord(t, env.app, store.LedgerEntry{Time: jan, UserID: "erin", ServiceID: "weather", EndpointID: "forecast",
		ProductID: "basic", RequestID: "req-a", Units: billing.Whole(3), Source: store.SourceGateway})
	admRecord(t, env.app, store.LedgerEntry{Time: feb, UserID: "owner", ServiceID: "weather", EndpointID: "forecast",
		RequestID: "req-b", Units: billing.Whole(1), Source: store.SourceReport})

	out := cliMust(t, "usage")
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(rows) != 3 || !slices.Equal(rows[0], ops.UsageCSVColumns()) || rows[1][1] == "" {
		t.Fatalf("usage (csv by default) printed %q (%v)", out, err)
	}
	out = cliMust(t, "usage", "--user", "erin", "--format", "json")
	var entries []store.LedgerEntry
	if err := json.Unmarshal([]byte(out), &entries); err != nil || len(entries) != 1 || entries[0].RequestID != "req-a" {
		t.Fatalf("usage --user erin --format json printed %s (%v)", out, err)
	}
	out = cliMust(t, "usage", "--from", "2026-02-01", "--to", "2026-02-28", "--json")
	entries = nil
	if err := json.Unmarshal([]byte(out), &entries); err != nil || len(entries) != 1 || entries[0].RequestID != "req-b" {
		t.Fatalf("usage --from --to --json printed %s (%v)", out, err)
	}
	out = cliMust(t, "usage", "--service", "weather", "--format", "ndjson")
	if strings.Count(out, "\n") != 2 || !strings.Contains(out, `"requestId":"req-a"`) {
		t.Fatalf("usage --format ndjson printed %s", out)
	}
	if _, err := cliRun(t, "usage", "--from", "last week"); err == nil || !strings.Contains(err.Error(), "(field from)") {
		t.Errorf("usage with a bad --from: %v", err)
	}

	job := store.Job{ID: "0b9e7c1a-2f4d-4c6b-8e1a-5d3c2b1a0f9e", UserID: "erin", ServiceID: "weather", EndpointID: "forecast",
		Status: store.JobCompleted, Result: `{"ok":true}`, CreatedAt: jan, UpdatedAt: jan, ExpiresAt: jan.Add(time.Hour), CompletedAt: jan}
	if err := env.app.DataStore().CreateJob(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	out = cliMust(t, "job", job.ID)
	var got store.Job
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.ID != job.ID || got.Status != "COMPLETED" || got.Result != job.Result {
		t.Fatalf("job printed %s (%v)", out, err)
	}
	if !strings.Contains(out, "\n  \"requestId\"") {
		t.Errorf("job output is not indented:\n%s", out)
	}
	if _, err := cliRun(t, "job", "nope"); err == nil || !strings.Contains(err.Error(), "request_not_found") {
		t.Errorf("job of an unknown id: %v", err)
	}
}

func TestCLINoServer(t *testing.T) {
	_, err := cliRun(t, "key", "list", "--address", "127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "performing request") {
		t.Errorf("with no admin endpoint: %v", err)
	}
}

func TestParseExpiry(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"2027-01-01T00:00:00Z", time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{"720h", now.Add(720 * time.Hour), true},
		{"90d", now.AddDate(0, 0, 90), true},
		{"1h30m", now.Add(90 * time.Minute), true},
		{"-1h", time.Time{}, false},
		{"0s", time.Time{}, false},
		{"2027-01-01", time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{"2027-13-01", time.Time{}, false},
		{"soon", time.Time{}, false},
	} {
		got, err := parseExpiry(tt.in, now)
		if (err == nil) != tt.ok || !got.Equal(tt.want) {
			t.Errorf("parseExpiry(%q) = %v, %v; want %v, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestReadableError(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"caddy responded with error: HTTP 400: {\"code\":\"invalid_request\",\"message\":\"amount must not be zero\",\"field\":\"amount\"}\n",
			"HTTP 400 invalid_request: amount must not be zero (field amount)"},
		{"caddy responded with error: HTTP 404: {\"code\":\"not_found\",\"message\":\"no service key \\\"k\\\"\"}\n",
			`HTTP 404 not_found: no service key "k"`},
		{"caddy responded with error: HTTP 403: {\"error\":\"host not allowed: x\"}\n",
			"caddy responded with error: HTTP 403: {\"error\":\"host not allowed: x\"}\n"},
		{"performing request: dial tcp 127.0.0.1:1: connect: connection refused",
			"performing request: dial tcp 127.0.0.1:1: connect: connection refused"},
	} {
		if got := readableError(errors.New(tt.in)).Error(); got != tt.want {
			t.Errorf("readableError(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// `caddy platform --help` (and a subcommand's) ends with where the
// platform commands are documented, not with Caddy's docs link alone,
// which does not know them (issue 33).
func TestCLIHelpNamesItsDocs(t *testing.T) {
	for _, args := range [][]string{{"platform", "--help"}, {"platform", "key", "create", "--help"}} {
		out, err := caddyProcess(t, nil, args...)
		if err != nil {
			t.Fatalf("caddy %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if !strings.Contains(out, "docs/operations.md") {
			t.Errorf("caddy %s does not name docs/operations.md:\n%s", strings.Join(args, " "), out)
		}
		if strings.Count(out, "https://caddyserver.com/docs/command-line") != 1 {
			t.Errorf("caddy %s names Caddy's docs link other than once:\n%s", strings.Join(args, " "), out)
		}
	}
}
