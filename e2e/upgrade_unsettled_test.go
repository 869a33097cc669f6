package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/disktest"
)

// TestUpgradeNotTunneledWhenUnsettled: a WebSocket call on a PER_REQUEST
// product whose settlement fails at the backend's 101 (the disk filled
// while the backend worked) is answered 500 internal_error "not charged".
// The proxy then hijacked the caller's connection anyway: after the 500
// the tunnel carried the backend's bytes both ways, a WebSocket served
// and never charged. No tunnel follows an answer the gateway withheld.
func TestUpgradeNotTunneledWhenUnsettled(t *testing.T) {
	dir := disktest.Small(t, "2m")
	arrived, fill := make(chan struct{}), make(chan struct{})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			w.Write([]byte("plain"))
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		close(arrived)
		<-fill
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
		io.WriteString(conn, "tunnel-data-from-backend\n")
		if line, err := brw.ReadString('\n'); err == nil {
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
			endpoint plain {
				methods GET
				path /plain
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit call
				quota 1000000
			}
		}`, be.URL, wireSecret)
	g := startWireGateway(t, dir, "", catalog, "")
	key, _ := g.newKey("u-ws")
	g.subscribe("u-ws", "ws", "basic", "ACTIVE")

	conn, rd := webSocketRequest(t, "ws", "sock", key)
	defer conn.Close()
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the call never reached the backend")
	}
	filler := disktest.Fill(t, dir)
	t.Cleanup(func() { os.Remove(filler) })
	// Other calls until one cannot be settled: the store has failed a
	// write, and the upgrade's settlement at its 101 fails too.
	other, _ := g.newKey("u-other")
	g.subscribe("u-other", "ws", "basic", "ACTIVE")
	for i := 0; ; i++ {
		if resp, _ := call(t, "GET", invokeURL("ws", "plain"), other, ""); resp.StatusCode != http.StatusOK {
			break
		}
		if i == 20000 {
			t.Fatal("the full disk never failed a settlement")
		}
	}
	close(fill)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.Fatal("the upgrade was answered 101 with the store failing")
	}
	io.WriteString(conn, "from-caller\n")
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	body, _ := io.ReadAll(resp.Body)
	rest, _ := io.ReadAll(rd)
	t.Logf("caller got %d %q, then %q", resp.StatusCode, body, rest)
	if strings.Contains(string(body)+string(rest), "tunnel-data") || strings.Contains(string(rest), "echo") {
		t.Fatalf("after a %d answer the caller's connection carried the backend's tunnel: %q %q", resp.StatusCode, body, rest)
	}
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "internal_error") {
		t.Fatalf("caller got %d %q, want 500 internal_error", resp.StatusCode, body)
	}
	if es := g.ledger("u-ws"); len(es) != 0 {
		t.Fatalf("ledger %+v, want nothing charged", es)
	}
}
