package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/platform"
)

// slowClientsCutOff: on the server at addr, a client trickling its headers
// a byte at a time is disconnected before it finishes, and an idle
// keep-alive connection is closed. The server's timeouts must be well
// under the test's own deadline of 30 s (they are 1 s in the tests).
func slowClientsCutOff(t *testing.T, addr, key string) {
	// closedBy reads from conn until it ends; the channel says whether
	// the server closed it (EOF or reset) rather than the test's deadline.
	closedBy := func(conn net.Conn) <-chan bool {
		done := make(chan bool, 1)
		go func() {
			_, err := io.Copy(io.Discard, conn)
			var ne net.Error
			done <- !(errors.As(err, &ne) && ne.Timeout())
		}()
		return done
	}

	t.Run("headers trickled a byte at a time", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		closed := closedBy(conn)
		// 200 bytes at one per 100 ms would take 20 s; the server gives 1 s.
		req := "GET /api/service/wire/endpoint/echo/invoke HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer " + key + "\r\nX-Padding: " + strings.Repeat("a", 200) + "\r\n\r\n"
		for i := 0; i < len(req); i++ {
			select {
			case byServer := <-closed:
				if !byServer {
					t.Fatal("the test's own deadline ended the read")
				}
				t.Logf("cut off after %d of %d header bytes", i, len(req))
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{req[i]}); err != nil {
				t.Logf("cut off after %d of %d header bytes (write: %v)", i, len(req), err)
				return
			}
		}
		t.Error("the server read a whole request header trickled over many seconds")
	})

	t.Run("idle keep-alive connection", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, "GET /api/service/wire/endpoint/echo/invoke HTTP/1.1\r\nHost: "+addr+"\r\nAuthorization: Bearer "+key+"\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		rd := bufio.NewReader(conn)
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("first request: %d, close %v", resp.StatusCode, resp.Close)
		}
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := rd.ReadByte(); err == nil {
			t.Error("the server sent bytes on an idle connection")
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Error("the idle keep-alive connection was never closed")
		}
	})
}

// serverTimeouts is the read_header and idle timeout of each server of the
// running config, by the port it listens on.
func serverTimeouts(t *testing.T) map[string][2]time.Duration {
	t.Helper()
	a, err := caddy.ActiveContext().App("http")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]time.Duration{}
	for _, srv := range a.(*caddyhttp.App).Servers {
		for _, l := range srv.Listen {
			out[l[strings.LastIndex(l, ":")+1:]] = [2]time.Duration{time.Duration(srv.ReadHeaderTimeout), time.Duration(srv.IdleTimeout)}
		}
	}
	return out
}

// TestWireSlowClientsCutOffWithoutTimeouts: a site that hosts the gateway
// with no `timeouts` block gets the platform's read_header and idle
// timeouts (scaled down to 1 s here), not Caddy's minute: slow and idle
// clients are cut off, on the first load and after a reload. A value the
// operator set is kept, a server without platform handlers keeps Caddy's
// defaults, and the start logs one INFO line per server it changed, naming
// the server and the values.
func TestWireSlowClientsCutOffWithoutTimeouts(t *testing.T) {
	defer func(rh, idle time.Duration) { platform.ServerReadHeaderTimeout, platform.ServerIdleTimeout = rh, idle }(
		platform.ServerReadHeaderTimeout, platform.ServerIdleTimeout)
	platform.ServerReadHeaderTimeout, platform.ServerIdleTimeout = time.Second, time.Second

	be := newAbortBackend(t, wireSecret)
	jobs := newUsageBackend(t, usageSecret)
	dir := t.TempDir()
	plain := e2etest.FreePort(t)
	config := func(servers string, grace int) string {
		return fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	https_port 9443
	grace_period %ds
	log {
		output file %s/caddy.log
		format json
	}
%s
	platform {
		store %s/platform.db
%s
	}
}
:%d {
	bind 127.0.0.1
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform
	}
}
:%d {
	bind 127.0.0.1
	respond "plain"
}
`, adminPort, gwPort, grace, dir, servers, dir, wireCatalog(be.URL, jobs.URL), gwPort, plain)
	}
	tester := newTester(t)
	tester.InitServer(config("", 10), "caddyfile")
	g := &gateway{t: t, tester: tester, dir: dir}
	key, _ := g.newKey("u-wire")
	g.subscribe("u-wire", "wire", "basic", "ACTIVE")
	addr := fmt.Sprintf("127.0.0.1:%d", gwPort)
	gw, other := fmt.Sprint(gwPort), fmt.Sprint(plain)

	want := func(what string, port string, readHeader, idle time.Duration) {
		t.Helper()
		got := serverTimeouts(t)[port]
		if got != [2]time.Duration{readHeader, idle} {
			t.Errorf("%s: server on :%s has read_header %v, idle %v; want %v, %v", what, port, got[0], got[1], readHeader, idle)
		}
	}
	want("no timeouts set", gw, time.Second, time.Second)
	want("a server without the platform", other, time.Minute, 5*time.Minute)
	slowClientsCutOff(t, addr, key)

	// A reload (of a changed config: Caddy skips loading the same one)
	// provisions the servers again from the operator's config: the
	// platform's values are set again.
	tester.InitServer(config("", 11), "caddyfile")
	want("after a reload", gw, time.Second, time.Second)
	slowClientsCutOff(t, addr, key)

	// What the operator set stays; only the missing one is filled.
	tester.InitServer(config("\tservers {\n\t\ttimeouts {\n\t\t\tidle 30s\n\t\t}\n\t}", 10), "caddyfile")
	want("idle set by the operator", gw, time.Second, 30*time.Second)
	want("a server without the platform, idle set", other, time.Minute, 30*time.Second)
	tester.InitServer(config("\tservers {\n\t\ttimeouts {\n\t\t\tread_header 20s\n\t\t\tidle 40s\n\t\t}\n\t}", 10), "caddyfile")
	want("both set by the operator", gw, 20*time.Second, 40*time.Second)

	stopServer(g)
	raw, err := os.ReadFile(filepath.Join(dir, "caddy.log"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && strings.Contains(fmt.Sprint(m["msg"]), "sets no read_header or idle limit") {
			lines = append(lines, m)
		}
	}
	// One line for each of the three loads that changed the gateway's
	// server (two with both values, one with read_header only), none for
	// the load where the operator set both, none for the plain server.
	if len(lines) != 3 {
		t.Fatalf("%d timeout lines, want 3: %v", len(lines), lines)
	}
	for i, m := range lines {
		if m["level"] != "info" || m["server"] == nil || m["server"] == "" || m["read_header"] == nil {
			t.Errorf("line %d: %v, want INFO naming the server and read_header", i, m)
		}
		if hasIdle := m["idle"] != nil; hasIdle != (i < 2) {
			t.Errorf("line %d: %v, idle given %v", i, m, hasIdle)
		}
	}
}
