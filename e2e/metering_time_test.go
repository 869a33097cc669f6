package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// TestTimeChargedFromForwarding: a PER_TIME_UNIT call is charged the
// seconds from its forwarding to the end of its stream. The clock started
// when the gateway had the request's headers, so a caller whose body took
// 2.5 s to arrive (a slow uplink) was charged 3 seconds for a backend that
// answered at once, though the backend sees nothing of a body before the
// gateway has read all of it.
func TestTimeChargedFromForwarding(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: done\n\n")
	}))
	t.Cleanup(be.Close)
	g := startGateway(t, t.TempDir(), fmt.Sprintf(`
		service timed {
			backend %s
			secret %s
			endpoint stream {
				streaming
			}
			product second {
				billing USAGE_POSTPAID
				measurement PER_TIME_UNIT
				unit second
				price 0.01
			}
		}`, be.URL, testSecret))
	g.subscribe("slow-uplink", "timed", "second", "ACTIVE")
	key, _ := g.newKey("slow-uplink")
	pr, pw := io.Pipe()
	go func() {
		for range 5 {
			pw.Write([]byte("x"))
			time.Sleep(500 * time.Millisecond)
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", invokeURL("timed", "stream"), pr)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	waitFor(t, "the call's ledger row", func() bool { return len(g.ledger("slow-uplink")) > 0 })
	es := g.ledger("slow-uplink")
	if resp.StatusCode != http.StatusOK || len(es) != 1 || es[0].Units != billing.Whole(1) {
		t.Fatalf("status %d, ledger %+v; want one row of 1 second", resp.StatusCode, es)
	}
}

// TestTimeTunnelEndsAtCallersClose: a PER_TIME_UNIT WebSocket tunnel
// whose caller closes after a moment, on a backend that ignores the close
// and holds the connection for 4 s, is charged the caller's second, not
// the backend's 4. Caddy's proxy takes a clean end of stream from one side
// as a half-close when the other side's connection can close its write
// half; the backend's side of a 101 cannot (net/http's response body), so
// the caller's close ends the tunnel. This pins that: were a Caddy upgrade
// to keep such a tunnel open until the backend closes, a caller gone
// after one second would be charged every second after it.
func TestTimeTunnelEndsAtCallersClose(t *testing.T) {
	held := make(chan struct{})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\nhello")
		// Deaf to the caller: neither reads nor closes for 4 s.
		select {
		case <-time.After(4 * time.Second):
		case <-held:
		}
	}))
	t.Cleanup(func() { close(held); be.Close() })
	g := startWireGateway(t, t.TempDir(), "", fmt.Sprintf(`
		service timed {
			backend %s
			secret %s
			endpoint sock {
				methods GET
				path /sock
				allow_upgrade
				streaming
			}
			product second {
				billing USAGE_POSTPAID
				measurement PER_TIME_UNIT
				unit second
				price 0.01
			}
		}`, be.URL, wireSecret), "")
	key, _ := g.newKey("u-timed")
	g.subscribe("u-timed", "timed", "second", "ACTIVE")
	conn, rd := webSocketRequest(t, "timed", "sock", key)
	mustSwitch(t, rd)
	hello := make([]byte, 5)
	if _, err := io.ReadFull(rd, hello); err != nil || string(hello) != "hello" {
		t.Fatalf("through the tunnel: %q %v", hello, err)
	}
	conn.Close()
	waitFor(t, "the call's ledger row", func() bool { return len(g.ledger("u-timed")) > 0 })
	if es := g.ledger("u-timed"); len(es) != 1 || es[0].Units != billing.Whole(1) {
		t.Fatalf("ledger %+v; want one row of 1 second, the caller's, not the backend's 4", es)
	}
}
