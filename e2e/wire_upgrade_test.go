package e2e

import (
	"bufio"
	"crypto/hmac"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestWireWebSocketUpgradeIsSignedAndTunnels: an endpoint with
// allow_upgrade takes a WebSocket upgrade. The backend receives it signed
// (the platform transport adds the headers to its copy of the request) and
// without the caller's key, answers 101 and echoes what the caller sends.
// The platform transport wrapped every response body to track it, the
// 101's too, which hid the body's Write: reverse_proxy logged "101
// switching protocols response with non-writable body" at ERROR and the
// caller got 502 service_error; no WebSocket ever went through.
func TestWireWebSocketUpgradeIsSignedAndTunnels(t *testing.T) {
	tb := &testBackend{secret: wireSecret, brand: "Platform"}
	var mu sync.Mutex
	var signedOK, sawKey bool
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want := v3Signature(wireSecret, nil, r.Header.Get("X-Platform-Timestamp"), tb.contextString(r.Header))
		got := r.Header.Get("X-Platform-Signature")
		mu.Lock()
		signedOK = got != "" && hmac.Equal([]byte(want), []byte(got))
		sawKey = r.Header.Get("Authorization") != ""
		mu.Unlock()
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "not an upgrade", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
		line, err := brw.ReadString('\n')
		if err == nil {
			io.WriteString(conn, "echo "+line)
		}
	}))
	t.Cleanup(be.Close)
	catalog := fmt.Sprintf(`
		service ws {
			backend %s
			secret %s
			endpoint sock {
				methods GET
				path /sock
				allow_upgrade
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
			}
		}`, be.URL, wireSecret)
	g := startWireGateway(t, t.TempDir(), "", catalog, "")
	key, _ := g.newKey("u-ws")
	g.subscribe("u-ws", "ws", "basic", "ACTIVE")

	conn, rd := webSocketRequest(t, "ws", "sock", key)
	defer conn.Close()
	mustSwitch(t, rd)
	if _, err := io.WriteString(conn, "ping\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(rd).ReadString('\n')
	if err != nil || line != "echo ping\n" {
		t.Errorf("through the tunnel: %q %v", line, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !signedOK || sawKey {
		t.Errorf("backend: signature valid %v, saw the caller's key %v", signedOK, sawKey)
	}
}
