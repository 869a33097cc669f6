// Package e2etest is the harness of the tests that run the built gateway
// binary (e2e, e2e/fleet): building it once, picking free ports, running
// it as a process, and seeding it through its admin API. One copy, so that
// a fix to how the binary is started, probed or stopped reaches every
// test that starts it.
package e2etest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// EnvInt is the positive integer in the environment variable name, or def.
func EnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// FreePort returns a loopback TCP port nothing listens on right now, for
// the subprocess servers whose ports must not collide with a colleague's
// concurrent test run.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// GatewayBinary builds the real binary (go build of the module's ./caddy)
// once per test process into a temp dir, or uses $E2E_CADDY_BIN when set.
// After `go vet` (which `make test` runs first) the packages are in the
// build cache and this is mostly a link.
func GatewayBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("E2E_CADDY_BIN"); p != "" {
		return p
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "platformgw-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "caddy")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// By import path: the tests run in their package's directory,
		// which differs from one test package to the next.
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binPath, "github.com/platformgw/gateway/caddy")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./caddy: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// client talks to the processes' admin APIs: few requests, each bounded.
var client = &http.Client{Timeout: 15 * time.Second}

// AdminJSON sends a JSON request to an admin API, fails the test unless
// the answer has wantStatus, and decodes the answer into out (unless nil).
func AdminJSON(t testing.TB, method, url string, body any, wantStatus int, out any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatalf("%s %s: encode the body: %v", method, url, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantStatus {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, url, err, raw)
		}
	}
}

// UsageSign is a backend SDK's signature of a request to the usage
// service (the X-Platform-Signature of a report or completion):
// Base64(HMAC-SHA256(secret, body + timestamp)).
func UsageSign(secret string, body []byte, ts string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	m.Write([]byte(ts))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Run says how to start the gateway binary.
type Run struct {
	Name   string // for messages
	Bin    string // GatewayBinary
	Config string // a Caddyfile
	// Home is the process's HOME; Caddy's config and data dirs go under it.
	Home string
	Env  []string // added to this process's environment
	// Log is the file the process's output is appended to (created when
	// missing), so that a restarted process's output follows the last.
	Log                 string
	AdminPort, HTTPPort int
	// UpWithin bounds the wait for the process to serve (30s when zero).
	UpWithin time.Duration
}

// Process is one run of the gateway binary. Admin and Base are the URLs
// of its admin API and its site.
type Process struct {
	Admin, Base string
	run         Run
	cmd         *exec.Cmd
	done        chan struct{}
}

// Start starts the binary and waits until it serves: its admin API
// answers a platform request and its site accepts a connection. The
// process is killed when the test ends, if it still runs.
func Start(t testing.TB, r Run) *Process {
	t.Helper()
	logFile, err := os.OpenFile(r.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatalf("%s: open the log: %v", r.Name, err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(r.Bin, "run", "--config", r.Config, "--adapter", "caddyfile")
	cmd.Env = append(append(os.Environ(), r.Env...),
		"XDG_CONFIG_HOME="+filepath.Join(r.Home, "config"),
		"XDG_DATA_HOME="+filepath.Join(r.Home, "data"),
		"HOME="+r.Home)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", r.Name, err)
	}
	p := &Process{cmd: cmd, run: r, done: make(chan struct{}),
		Admin: fmt.Sprintf("http://127.0.0.1:%d", r.AdminPort),
		Base:  fmt.Sprintf("http://127.0.0.1:%d", r.HTTPPort)}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(p.Kill)
	within := r.UpWithin
	if within <= 0 {
		within = 30 * time.Second
	}
	deadline := time.Now().Add(within)
	for {
		select {
		case <-p.done:
			t.Fatalf("%s exited at start: %v (log in %s)\n%s", r.Name, cmd.ProcessState, r.Log, Tail(r.Log))
		default:
		}
		if resp, err := client.Get(p.Admin + "/platform/keys?userId=probe"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				if r2, err := client.Get(p.Base + "/"); err == nil {
					r2.Body.Close()
					return p
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not come up within %s (log in %s)\n%s", r.Name, within, r.Log, Tail(r.Log))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill is kill -9, waiting until the process is gone (so that its flock
// on a store file is released): no settlement flushed, no lease returned.
func (p *Process) Kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// Stop asks the process to exit through its admin API and waits for it
// up to within; past that the test fails and the process is killed.
func (p *Process) Stop(t testing.TB, within time.Duration) {
	t.Helper()
	if resp, err := client.Post(p.Admin+"/stop", "", nil); err == nil {
		resp.Body.Close()
	}
	select {
	case <-p.done:
	case <-time.After(within):
		t.Errorf("%s did not stop within %s; killing it", p.run.Name, within)
		p.Kill()
	}
}

// Tail is the end of a log file, for failure messages.
func Tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
