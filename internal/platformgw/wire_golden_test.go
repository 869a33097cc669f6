package platformgw_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/platformgw/gateway/internal/platform"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

var updateWire = flag.Bool("update-wire", false, "rewrite testdata/wire_sync.golden from this code")

// TestWireBytes pins the bytes the gateway puts on the wire for a sync
// invoke: the request a backend reads (header names as spelled, their
// order, values, body) and the answer the caller reads, for an admitted
// call, a caller's forged headers, a wrapped answer, a refused key and a
// rate-limited call. The backend is a raw TCP server, not net/http, so it
// sees names as sent (X-Platform-User-ID, not X-Platform-User-Id). The
// clock is fixed, so timestamps, signatures and the allowance headers are
// exact; only the request id (random), Date and the ports are masked.
// The golden file was written by the code before the allocation work on
// the request path (docs/performance.md): that work changed no byte. A Go
// or Caddy upgrade may change bytes that are not ours (Via, the order
// net/http writes headers in): read the diff before -update-wire.
func TestWireBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Caddy server")
	}
	fixed := time.Date(2026, 11, 17, 10, 30, 0, 0, time.UTC)

	be := newRawBackend(t)
	dir := t.TempDir()
	admin := fmt.Sprintf("localhost:%d", chainAdminPort)
	cfg := fmt.Sprintf(`{
	admin %s
	http_port %d
	auto_https off
	grace_period 1s
	log {
		level WARN
	}
	platform {
		store %s/platform.db
		service wire {
			backend http://%s/base
			secret %s
			endpoint raw {
				methods GET POST
				path /raw
			}
			endpoint wrapped {
				methods GET
				path /wrapped
				sync_response wrapped
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 1000 per month
				overage block
				rate_limit 4/m burst 4
			}
		}
	}
}

http://127.0.0.1:%d {
	handle {
		platform_usage
		platform_gateway
		reverse_proxy {
			dynamic platform
			transport platform
		}
	}
}
`, admin, chainHTTPPort, dir, be.addr, chainSecret, chainHTTPPort)
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: chainAdminPort})
	tester.InitServer(cfg, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		resp, err := http.Post("http://"+admin+"/load", "application/json",
			strings.NewReader(fmt.Sprintf(`{"admin": {"listen": %q}}`, admin)))
		if err == nil {
			resp.Body.Close()
		}
	})
	a, err := caddy.ActiveContext().App("platform")
	if err != nil {
		t.Fatal(err)
	}
	app := a.(*platform.App)
	app.SetClock(func() time.Time { return fixed })
	st := app.DataStore()
	key, hash, err := servicekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.CreateKey(ctx, store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: "wire-user",
		Roles: []string{"admin", "beta"}, Created: fixed}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutSubscription(ctx, store.Subscription{UserID: "wire-user", ServiceID: "wire", ProductID: "basic",
		Status: "active", StartedAt: fixed.AddDate(0, -1, -3), UpdatedAt: fixed}); err != nil {
		t.Fatal(err)
	}

	host := fmt.Sprintf("127.0.0.1:%d", chainHTTPPort)
	auth := "Authorization: Bearer " + key + "\r\n"
	steps := []struct{ name, req string }{
		{"admitted GET", "GET /api/service/wire/endpoint/raw/invoke?q=1 HTTP/1.1\r\nHost: " + host + "\r\n" + auth +
			"Accept: */*\r\nUser-Agent: wire-test\r\n\r\n"},
		{"POST with forged headers", "POST /api/service/wire/endpoint/raw/invoke HTTP/1.1\r\nHost: " + host + "\r\n" + auth +
			"Content-Type: text/plain\r\nContent-Length: 5\r\nX-Platform-User-ID: admin\r\nX_Platform_Roles: root\r\n" +
			"X-Custom: kept\r\nConnection: keep-alive, X-Platform-Signature\r\n\r\nhello"},
		{"wrapped", "GET /gateway/api/v1/service/wire/endpoint/wrapped/invoke HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "\r\n"},
		{"no key", "GET /api/service/wire/endpoint/raw/invoke HTTP/1.1\r\nHost: " + host + "\r\n\r\n"},
		{"last token", "GET /api/service/wire/endpoint/raw/invoke HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "\r\n"},
		{"rate limited", "GET /api/service/wire/endpoint/raw/invoke HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "\r\n"},
	}
	var out strings.Builder
	for _, s := range steps {
		conn, err := net.DialTimeout("tcp", host, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, s.req); err != nil {
			t.Fatal(err)
		}
		answer, err := readRawAnswer(bufio.NewReader(conn))
		conn.Close()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		fmt.Fprintf(&out, "=== %s\n--- backend read\n%s\n--- caller read\n%s\n", s.name, be.take(), answer)
	}
	got := maskWire(out.String(), host, be.addr)

	golden := filepath.Join("testdata", "wire_sync.golden")
	if *updateWire {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the wire bytes changed (go test -run TestWireBytes -update-wire rewrites %s; only when the change is meant):\n got:\n%s\nwant:\n%s", golden, got, want)
	}
}

var (
	uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	dateRE = regexp.MustCompile(`(?m)^Date: .*\r$`)
)

// maskWire hides what differs between runs: request ids, Date and ports.
func maskWire(s, gateway, backend string) string {
	s = uuidRE.ReplaceAllString(s, "<request-id>")
	s = dateRE.ReplaceAllString(s, "Date: <date>\r")
	s = strings.ReplaceAll(s, backend, "<backend>")
	s = strings.ReplaceAll(s, gateway, "<gateway>")
	return strings.ReplaceAll(s, "\r\n", "\\r\\n\n")
}

// readRawAnswer reads one HTTP/1.1 answer with a Content-Length, as bytes.
func readRawAnswer(br *bufio.Reader) (string, error) {
	var b strings.Builder
	length := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return b.String(), err
		}
		b.WriteString(line)
		if line == "\r\n" {
			break
		}
		if name, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(name, "Content-Length") {
			length, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	body := make([]byte, length)
	_, err := io.ReadFull(br, body)
	b.Write(body)
	return b.String(), err
}

// rawBackend records each request's bytes as read off the connection and
// answers with fixed bytes (a wrapped endpoint's answer is text).
type rawBackend struct {
	addr string
	mu   sync.Mutex
	seen []string
}

func newRawBackend(t *testing.T) *rawBackend {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	be := &rawBackend{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go be.serve(c)
		}
	}()
	return be
}

func (be *rawBackend) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		req, err := readRawAnswer(br) // a request is read the same way
		if err != nil {
			return
		}
		be.mu.Lock()
		be.seen = append(be.seen, req)
		be.mu.Unlock()
		answer := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n" +
			"X-Platform-Units: 1\r\nX-Backend: b\r\n\r\n{\"ok\":true}"
		if strings.Contains(req, "/wrapped") {
			answer = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"
		}
		if _, err := io.WriteString(c, answer); err != nil {
			return
		}
	}
}

// take returns the requests read since the last call ("(none)" when the
// gateway forwarded nothing).
func (be *rawBackend) take() string {
	be.mu.Lock()
	defer be.mu.Unlock()
	if len(be.seen) == 0 {
		return "(none)"
	}
	s := strings.Join(be.seen, "\n")
	be.seen = nil
	return s
}
