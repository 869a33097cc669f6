package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
)

// freshClient opens a new connection per request, so that with two
// listeners on a port each request may reach either.
var freshClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// sharedPortsConfig is a gateway on the given admin and site ports with a
// store of its own; extra goes in the platform block.
func sharedPortsConfig(t *testing.T, dir string, adminPort, httpPort int, extra string) string {
	t.Helper()
	cfg := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	http_port %d
	platform {
		store %s
		%s
	}
}
:%d {
	respond "served by %s"
}
`, adminPort, httpPort, filepath.Join(dir, "platform.db"), extra, httpPort, dir)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sharedPortsGateway is one run of the binary; done is closed when it
// has exited, with err its exit.
type sharedPortsGateway struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error
}

// lockedBuffer is the process's output, written by exec's copier while
// the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startSharedPortsGateway starts the real binary on cfg.
func startSharedPortsGateway(t *testing.T, dir, cfg string) *sharedPortsGateway {
	t.Helper()
	g := &sharedPortsGateway{out: new(lockedBuffer), done: make(chan struct{})}
	g.cmd = exec.Command(e2etest.GatewayBinary(t), "run", "--config", cfg, "--adapter", "caddyfile")
	g.cmd.Env = append(os.Environ(),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
		"HOME="+dir,
	)
	g.cmd.Stdout, g.cmd.Stderr = g.out, g.out
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { g.err = g.cmd.Wait(); close(g.done) }()
	t.Cleanup(func() {
		g.cmd.Process.Kill()
		<-g.done
	})
	return g
}

// waitServing waits until the site on httpPort answers with the body of
// the gateway whose directory is dir.
func waitServing(t *testing.T, httpPort int, dir string, g *sharedPortsGateway) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-g.done:
			t.Fatalf("the gateway exited at start: %v; output:\n%s", g.err, g.out)
		default:
		}
		resp, err := freshClient.Get("http://127.0.0.1:" + strconv.Itoa(httpPort) + "/")
		if err == nil {
			b := make([]byte, 512)
			n, _ := resp.Body.Read(b)
			resp.Body.Close()
			if strings.Contains(string(b[:n]), dir) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the gateway did not come up within 30s; output:\n%s", g.out)
}

// A second gateway with a store of its own, started on the admin and site
// ports of a running one, used to listen beside it (Caddy's SO_REUSEPORT)
// and take half of its connections, metering them into the other store.
// It must refuse to start, naming both ports and the running gateway's
// pid; with allow_shared_ports it starts.
func TestSecondGatewayOnSamePortsRefused(t *testing.T) {
	adminPort, httpPort := e2etest.FreePort(t), e2etest.FreePort(t)
	dirA, dirB := t.TempDir(), t.TempDir()
	a := startSharedPortsGateway(t, dirA, sharedPortsConfig(t, dirA, adminPort, httpPort, ""))
	waitServing(t, httpPort, dirA, a)

	b := startSharedPortsGateway(t, dirB, sharedPortsConfig(t, dirB, adminPort, httpPort, ""))
	outB := b.out
	select {
	case <-b.done:
		if b.err == nil {
			t.Fatalf("the second gateway exited with status 0; output:\n%s", outB)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the second gateway is still running on the first one's ports after 15s; output:\n%s", outB)
	}
	for _, want := range []string{
		"another process already listens where this gateway would",
		fmt.Sprintf("port %d, the admin endpoint", adminPort),
		fmt.Sprintf("port %d, the site address :%d", httpPort, httpPort),
		fmt.Sprintf("by pid %d: ", a.cmd.Process.Pid),
		"allow_shared_ports",
	} {
		if !strings.Contains(outB.String(), want) {
			t.Errorf("the second gateway's output lacks %q:\n%s", want, outB)
		}
	}
	// Every call still reaches the first gateway.
	for i := 0; i < 20; i++ {
		waitServing(t, httpPort, dirA, a)
	}

	// Asked for, the sharing is allowed: the third gateway keeps running.
	dirC := t.TempDir()
	c := startSharedPortsGateway(t, dirC, sharedPortsConfig(t, dirC, adminPort, httpPort, "allow_shared_ports"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		resp, err := freshClient.Get("http://127.0.0.1:" + strconv.Itoa(httpPort) + "/")
		if err == nil {
			b := make([]byte, 512)
			n, _ := resp.Body.Read(b)
			resp.Body.Close()
			if strings.Contains(string(b[:n]), dirC) {
				break // the kernel handed one connection to the third
			}
		}
		select {
		case <-c.done:
			t.Fatalf("with allow_shared_ports the gateway exited: %v; output:\n%s", c.err, c.out)
		case <-ctx.Done():
			t.Fatalf("with allow_shared_ports the gateway never answered on the shared port; output:\n%s", c.out)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
