// Package scripts_test runs the checks of scripts/run-demo.sh (what `make
// run` runs) against a copy of the script in a temp directory, with stand-in
// binaries, so it never touches the demo's real ports.
package scripts_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// demoRoot lays out a temp repository root with scripts/run-demo.sh and
// the given stand-in executables under bin/, and returns it.
func demoRoot(t *testing.T, bins map[string]string) string {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	root := t.TempDir()
	script, err := os.ReadFile("run-demo.sh")
	if err != nil {
		t.Fatal(err)
	}
	for dir, files := range map[string]map[string]string{
		"scripts": {"run-demo.sh": string(script)},
		"bin":     bins,
	} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, body := range files {
			if err := os.WriteFile(filepath.Join(root, dir, name), []byte(body), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// runDemo runs the script with the extra environment, bounded to 40 s, and
// returns its standard error and exit error.
func runDemo(t *testing.T, root string, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "run-demo.sh"))
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &bytes.Buffer{}, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("run-demo.sh did not stop within 40 s; stderr:\n%s", stderr.String())
	}
	return stderr.String(), err
}

// A port of the demo already taken (here by this test; in the report, by a
// foreign server on 9001 that the demo then proxied to) stops the script
// before it starts anything, naming the port.
func TestRunDemoRefusesBusyPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	marker := filepath.Join(t.TempDir(), "started")
	stub := "#!/bin/sh\ntouch " + marker + "\nexec sleep 30\n"
	root := demoRoot(t, map[string]string{
		"caddy": stub, "example-backend": stub, "example-asyncbackend": stub, "example-reporter": stub,
	})
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freePort := strconv.Itoa(free.Addr().(*net.TCPAddr).Port)
	free.Close()

	stderr, err := runDemo(t, root, "DEMO_PORTS="+freePort+" "+port)
	if err == nil {
		t.Fatalf("run-demo.sh succeeded with port %s taken; stderr:\n%s", port, stderr)
	}
	want := "port(s) " + port + " on 127.0.0.1 already in use"
	if !strings.Contains(stderr, want) || strings.Contains(stderr, "port(s) "+freePort) {
		t.Errorf("stderr does not say %q (and only that port):\n%s", want, stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("run-demo.sh started a process although a port was taken")
	}
}

// A backend that exits right after starting (here: it could not bind)
// fails the script at once with its name and the last lines of its log,
// instead of the demo claiming success.
func TestRunDemoReportsDeadBackend(t *testing.T) {
	sleeper := "#!/bin/sh\nexec sleep 30\n"
	root := demoRoot(t, map[string]string{
		"caddy":                sleeper,
		"example-backend":      "#!/bin/sh\necho 'listen tcp 127.0.0.1:9001: bind: address already in use' >&2\nexit 1\n",
		"example-asyncbackend": sleeper,
		"example-reporter":     sleeper,
	})
	stderr, err := runDemo(t, root, "DEMO_PORTS=")
	if err == nil {
		t.Fatalf("run-demo.sh succeeded with a dead backend; stderr:\n%s", stderr)
	}
	for _, want := range []string{
		"run-demo: examples/backend exited (status 1) right after starting.",
		"--- last lines of tmp/backend.log:",
		"bind: address already in use",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

// demoUntilUp starts the demo with DEMO_PORTS empty and the extra
// environment, waits for its closing line, stops it as Ctrl-C would, and
// returns what it printed.
func demoUntilUp(t *testing.T, root string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "run-demo.sh"))
	cmd.Env = append(append(os.Environ(), "DEMO_PORTS="), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "Ctrl-C stops everything.") {
			break
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	go io.Copy(io.Discard, stdout)
	cmd.Wait()
	if !strings.Contains(out.String(), "Ctrl-C stops everything.") {
		t.Fatalf("the demo did not come up; stdout:\n%s\nstderr:\n%s", out.String(), stderr.String())
	}
	return out.String()
}

// Each run revokes the demo key of the run before, so only the key it
// prints works. The stand-in caddy creates numbered keys and records the
// revocations it is asked for.
func TestRunDemoRevokesPreviousKey(t *testing.T) {
	state := t.TempDir()
	caddy := `#!/bin/sh
state=` + state + `
case "$1 $2 $3" in
"run "*) exec sleep 30 ;;
"hash-password "*) echo '$2a$14$stand.in.hash' ;;
"platform key create")
	n=$(cat "$state/n" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$state/n"
	printf '{"keyId":"key_demo%s","key":"psk_demo%s","userId":"demo-user"}\n' "$n" "$n" ;;
"platform key revoke") echo "$4" >> "$state/revoked" ;;
"platform subscribe"*) ;;
*) echo "unexpected: $*" >&2; exit 1 ;;
esac
`
	sleeper := "#!/bin/sh\nexec sleep 30\n"
	root := demoRoot(t, map[string]string{
		"caddy": caddy, "example-backend": sleeper, "example-asyncbackend": sleeper, "example-reporter": sleeper,
	})
	// Every readiness check and the first call land here.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") }))
	defer srv.Close()

	run := func() string { return demoUntilUp(t, root, "DEMO_CHECK_URL="+srv.URL) }

	first := run()
	if !strings.Contains(first, "psk_demo1") || strings.Contains(first, "Revoked") || !strings.Contains(first, "/console/") {
		t.Errorf("first run printed:\n%s", first)
	}
	if _, err := os.Stat(filepath.Join(state, "revoked")); err == nil {
		t.Error("the first run revoked a key")
	}
	second := run()
	if !strings.Contains(second, "Revoked the previous demo key key_demo1.") || !strings.Contains(second, "psk_demo2") {
		t.Errorf("second run printed:\n%s", second)
	}
	revoked, _ := os.ReadFile(filepath.Join(state, "revoked"))
	if string(revoked) != "key_demo1\n" {
		t.Errorf("revoked %q, want key_demo1 only", revoked)
	}
}

// The first call through the gateway answering with an error status (here
// 502, as when the gateway cannot reach examples/backend, or 401 for a
// key the store does not know) fails the script with the log, instead of
// printing the error body and the closing lines as if the demo worked:
// curl without --fail exits 0 on any HTTP status.
func TestRunDemoFailsOnFailedFirstCall(t *testing.T) {
	caddy := `#!/bin/sh
case "$1 $2 $3" in
"run "*) exec sleep 8 ;;
"hash-password "*) echo '$2a$14$stand.in.hash' ;;
"platform key create") printf '{"keyId":"key_demo1","key":"psk_demo1","userId":"demo-user"}\n' ;;
"platform subscribe"*) ;;
*) echo "unexpected: $*" >&2; exit 1 ;;
esac
`
	sleeper := "#!/bin/sh\nexec sleep 8\n"
	root := demoRoot(t, map[string]string{
		"caddy": caddy, "example-backend": sleeper, "example-asyncbackend": sleeper, "example-reporter": sleeper,
	})
	// Every readiness check (any answer will do) and the first call land
	// here; the first call is the one that sends the demo key.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, `{"error":{"code":"bad_gateway","message":"backend unreachable"}}`)
			return
		}
		io.WriteString(w, "{}")
	}))
	defer srv.Close()
	stderr, err := runDemo(t, root, "DEMO_PORTS=", "DEMO_CHECK_URL="+srv.URL)
	if err == nil {
		t.Fatalf("run-demo.sh succeeded although the first call got HTTP 502; stderr:\n%s", stderr)
	}
	if !strings.Contains(stderr, "run-demo: the first call through the gateway failed") {
		t.Errorf("stderr lacks the failure of the first call:\n%s", stderr)
	}
}

// The reload line the demo prints must give `caddy reload` every
// adapt-time placeholder ({$VAR}) of Caddyfile.example the demo's gateway
// was started with: the reload adapts the file in the shell it is pasted
// into, and a missing CONSOLE_PASSWORD_HASH put the console behind a hash
// nobody knows, locking the operator out. The printed line is run in a
// shell with none of the demo's environment, and the stand-in caddy
// records what each command saw.
func TestRunDemoReloadLineKeepsSettings(t *testing.T) {
	caddyfile, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	var vars []string
	for _, m := range regexp.MustCompile(`\{\$([A-Za-z0-9_]+)`).FindAllStringSubmatch(string(caddyfile), -1) {
		if !slices.Contains(vars, m[1]) {
			vars = append(vars, m[1])
		}
	}
	if len(vars) == 0 {
		t.Fatal("no {$VAR} in Caddyfile.example; this test checks nothing")
	}
	state := t.TempDir()
	record := "for v in " + strings.Join(vars, " ") + `; do eval "printf '%s=%s\n' \$v \"\${$v-<unset>}\""; done`
	caddy := `#!/bin/sh
state=` + state + `
case "$1 $2 $3" in
"run "*) (` + record + `) > "$state/run.env"; exec sleep 30 ;;
"reload "*) (` + record + `) > "$state/reload.env" ;;
"hash-password "*) echo '$2a$14$stand.in.hash/with$dollars' ;;
"platform key create") printf '{"keyId":"key_demo1","key":"psk_demo1","userId":"demo-user"}\n' ;;
"platform subscribe"*) ;;
*) echo "unexpected: $*" >&2; exit 1 ;;
esac
`
	sleeper := "#!/bin/sh\nexec sleep 30\n"
	root := demoRoot(t, map[string]string{
		"caddy": caddy, "example-backend": sleeper, "example-asyncbackend": sleeper, "example-reporter": sleeper,
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") }))
	defer srv.Close()
	out := demoUntilUp(t, root, "DEMO_CHECK_URL="+srv.URL)

	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "bin/caddy reload") {
			line = strings.TrimSpace(l)
		}
	}
	if line == "" {
		t.Fatalf("the demo printed no reload line:\n%s", out)
	}
	cmd := exec.Command("bash", "-c", line)
	cmd.Dir = root
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the printed reload line failed: %v\n%s\n%s", err, line, b)
	}
	runEnv, _ := os.ReadFile(filepath.Join(state, "run.env"))
	reloadEnv, _ := os.ReadFile(filepath.Join(state, "reload.env"))
	if !strings.Contains(string(runEnv), "CONSOLE_PASSWORD_HASH=$2a$14$stand.in.hash/with$dollars\n") {
		t.Fatalf("the stand-in did not see the demo's hash at run; it saw:\n%s", runEnv)
	}
	if string(reloadEnv) != string(runEnv) {
		t.Errorf("the printed reload line\n  %s\nadapts Caddyfile.example with\n%s\nbut the gateway was started with\n%s", line, reloadEnv, runEnv)
	}
}
