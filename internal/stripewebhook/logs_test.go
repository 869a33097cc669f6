package stripewebhook_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"golang.org/x/crypto/bcrypt"

	"github.com/platformgw/gateway/internal/payments/stripetest"

	_ "github.com/platformgw/gateway/internal/console"
	_ "github.com/platformgw/gateway/internal/portal"
)

// documentedLogs are the `log` blocks of docs/operations.md ("Logs"):
// the global one for DEBUG and the access log's, each with no output,
// one level of indentation removed. It checks that Caddyfile.example's
// (commented) access log carries the same filter.
func documentedLogs(t *testing.T) (global, access []string) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	logBlock := func(opening string) []string {
		_, after, ok := strings.Cut(string(doc), "```caddyfile\n"+opening+"\n\tlog {\n")
		if !ok {
			t.Fatalf("docs/operations.md has no %q block opening with a log block", opening)
		}
		block := []string{"log {"}
		for _, l := range strings.Split(after, "\n") {
			block = append(block, strings.TrimPrefix(l, "\t"))
			if l == "\t}" {
				break
			}
		}
		if !strings.Contains(strings.Join(block, "\n"), "format filter") {
			t.Fatalf("the documented log block has no filter:\n%s", strings.Join(block, "\n"))
		}
		return block
	}
	global, block := logBlock("{"), logBlock("example.com {")

	ex, err := os.ReadFile(filepath.Join("..", "..", "Caddyfile.example"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(ex), "\t# log {\n")
	if !ok {
		t.Fatal("Caddyfile.example has no commented access log")
	}
	example := []string{"log {"}
	for _, l := range strings.Split(after, "\n") {
		l, ok := strings.CutPrefix(l, "\t# ")
		if !ok {
			break
		}
		if !strings.HasPrefix(l, "\toutput ") {
			example = append(example, l)
		}
		if l == "}" {
			break
		}
	}
	if got, want := strings.Join(example, "\n"), strings.Join(block, "\n"); got != want {
		t.Errorf("Caddyfile.example's access log (output aside)\n%s\nis not the one of docs/operations.md\n%s", got, want)
	}
	return global, block
}

// withOutput is a documented log block writing to file.
func withOutput(block []string, file string) string {
	return strings.Join(append([]string{block[0], "\toutput file " + file}, block[1:]...), "\n")
}

// TestWebhookSignatureNotInLogs: with the global log at DEBUG and an
// access log, each with exactly the filter docs/operations.md gives,
// Stripe webhooks (signed right and wrong), a portal OIDC callback, a
// portal sign-in with a key and a console page behind basic_auth (portal
// and console under handle_path) leave no key, secret, signature, code,
// token or cookie value in either log.
// Caddy logs every request header but cookies and Authorization: the
// documented filter deleted X-Platform-Signature only, and each webhook's
// Stripe-Signature (an HMAC under the webhook secret) was written to the
// access log (a review of security by default); at DEBUG, handle_path's
// rewrite wrote the OIDC callback's code and state to the global log.
func TestWebhookSignatureNotInLogs(t *testing.T) {
	dir := t.TempDir()
	global, access := documentedLogs(t)
	const opPass = "op-password-XYZZY-123"
	hash, _ := bcrypt.GenerateFromPassword([]byte(opPass), 4)
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
%s
	platform {
		store %s
		service svc {
			backend http://127.0.0.1:1
			secret svc-secret-0123456789abcdef0123
			public
			endpoint echo
		}
		payments stripe {
			secret_key sk_test_LOGSKEY123456
			webhook_secret %s
			api_base http://127.0.0.1:1
		}
	}
}
:%d {
	bind 127.0.0.1
%s
	handle /stripe/webhook {
		platform_stripe_webhook
	}
	redir /portal /portal/
	handle_path /portal/* {
		platform_portal
	}
	handle_path /console/* {
		basic_auth {
			op %s
		}
		platform_console {
			prefix /console
		}
	}
}
`, adminPort, httpPort, indent(withOutput(global, filepath.Join(dir, "caddy.log"))), filepath.Join(dir, "platform.db"), whsec, httpPort,
		indent(withOutput(access, filepath.Join(dir, "access.log"))), string(hash))
	unloadOtherStore()
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(cfg, "caddyfile")

	// A key through the admin API.
	resp, err := http.Post(fmt.Sprintf("http://localhost:%d/platform/keys", adminPort), "application/json", strings.NewReader(`{"userId":"u-logs"}`))
	if err != nil {
		t.Fatal(err)
	}
	var kv struct{ Key string }
	json.NewDecoder(resp.Body).Decode(&kv)
	resp.Body.Close()
	if kv.Key == "" {
		t.Fatal("no key")
	}
	secrets := []string{kv.Key, whsec, "sk_test_LOGSKEY123456", opPass, "svc-secret-0123456789abcdef0123"}

	// Stripe webhooks, signed with the secret and with another.
	now := time.Now()
	ev := stripetest.Event("evt_logs_1", "customer.created", now, map[string]any{"id": "cus_x", "object": "customer"})
	for i, sec := range []string{whsec, "whsec_wrong_wrong_wrong_wrong_0000"} {
		h := stripetest.Sign(ev, sec, now)
		for _, part := range strings.Split(h, ",") {
			if v, ok := strings.CutPrefix(part, "v1="); ok {
				secrets = append(secrets, v)
			}
		}
		req, _ := http.NewRequest("POST", endpoint, strings.NewReader(string(ev)))
		req.Header.Set("Stripe-Signature", h)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := []int{200, 400}[i]; resp.StatusCode != want {
			t.Fatalf("webhook %d: %d %s, want %d", i, resp.StatusCode, b, want)
		}
	}

	// An OIDC callback's code and state (this portal has no OIDC: the
	// access log records the URI all the same).
	const code, state = "oidc-code-SECRET-0123456789", "oidc-state-SECRET-0123456789"
	secrets = append(secrets, code, state)
	if resp, err := http.Get(site + "/portal/oidc/callback?code=" + code + "&state=" + state); err == nil {
		resp.Body.Close()
	}

	// A portal sign-in with the key: the forms' tokens and the cookies.
	tokenRE := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	jar, _ := cookiejar.New(nil)
	cl := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = cl.Get(site + "/portal/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := tokenRE.FindSubmatch(page)
	if m == nil {
		t.Fatalf("no csrf on the sign-in page: %d", resp.StatusCode)
	}
	secrets = append(secrets, string(m[1]))
	resp, err = cl.PostForm(site+"/portal/signin", url.Values{"csrf": {string(m[1])}, "key": {kv.Key}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", resp.StatusCode)
	}
	for _, c := range resp.Cookies() {
		if len(c.Value) > 8 {
			secrets = append(secrets, c.Value)
		}
	}
	if resp, err := cl.Get(site + "/portal/"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if m := tokenRE.FindSubmatch(b); m != nil {
			secrets = append(secrets, string(m[1]))
		}
	}

	// The console behind basic_auth.
	req, _ := http.NewRequest("GET", site+"/console/users", nil)
	req.SetBasicAuth("op", opPass)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("console: %d", resp.StatusCode)
	}
	for _, c := range resp.Cookies() {
		secrets = append(secrets, c.Value)
	}

	tester.InitServer(fmt.Sprintf("{\n\tadmin localhost:%d\n}\n", adminPort), "caddyfile") // flush and close the log files
	for _, name := range []string{"caddy.log", "access.log"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "access.log" && (strings.Count(string(data), `"uri":"/stripe/webhook"`) != 2 || !strings.Contains(string(data), `"uri":"/portal/oidc/callback`)) {
			t.Fatalf("the access log lacks the webhooks or the callback:\n%s", data)
		}
		for _, s := range secrets {
			if len(s) < 8 {
				t.Fatalf("secret list holds %q: the test lost a value", s)
			}
			for _, l := range strings.Split(string(data), "\n") {
				if strings.Contains(l, s) || strings.Contains(l, url.QueryEscape(s)) {
					t.Errorf("%s holds a secret (%.6s…): %.400s", name, s, l)
					break
				}
			}
		}
	}
}

func indent(s string) string { return "\t" + strings.ReplaceAll(s, "\n", "\n\t") }
