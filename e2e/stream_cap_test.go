package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// streamCapBackend streams without end (at most 30 s): server-sent events
// of 1000 bytes each, flushed one by one, until a write fails; with
// ?size=N it sends a body of N bytes and ends. A WebSocket upgrade gets a
// 101 and then a tunnel that sends 1000 bytes a write the same way.
func streamCapBackend(t *testing.T) *httptest.Server {
	event := append([]byte("data: "), bytes.Repeat([]byte("e"), 992)...)
	event = append(event, "\n\n"...)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deadline := time.Now().Add(30 * time.Second)
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
			for time.Now().Before(deadline) {
				if _, err := conn.Write(event); err != nil {
					return
				}
				time.Sleep(time.Millisecond)
			}
			return
		}
		if n := r.URL.Query().Get("size"); n != "" {
			var size int
			fmt.Sscan(n, &size)
			w.Write(bytes.Repeat([]byte("s"), size))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for time.Now().Before(deadline) {
			if _, err := w.Write(event); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(time.Millisecond)
		}
	}))
	t.Cleanup(be.Close)
	return be
}

func streamCapCatalog(backend string) string {
	return fmt.Sprintf(`
		service sc {
			backend %s
			secret %s
			endpoint events {
				methods GET
				path /events
				streaming
				allow_upgrade
			}
			product prepaid {
				billing PREPAID
				measurement PER_BYTE
				unit byte
				price 0.5
			}
			product block {
				billing SUBSCRIPTION
				measurement PER_BYTE
				unit byte
				quota 5000.5
			}
			product allow {
				billing SUBSCRIPTION
				measurement PER_BYTE
				unit byte
				quota 100
				overage allow
				price 0.000001
			}
			product request {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 1
			}
		}`, backend, wireSecret)
}

// TestPerByteStreamCutOffAtHardLimit: an endless server-sent event stream on
// a PER_BYTE product ran past the caller's hard limit for as long as the
// backend sent: charged up to the limit, the rest recorded as uncharged,
// never cut (a prepaid balance of 1 credit bought hours of stream). It is
// cut once it has delivered what the caller can be charged: a prepaid
// caller with 1500 credits at 0.5 a byte gets 3000 bytes, a blocked quota
// of 5000.5 bytes gets 5000, then the body ends cut off, and the ledger
// charges exactly the bytes delivered, nothing uncharged. A caller with
// overage allowed and no cap is never cut, and a PER_REQUEST call's body
// is not bounded by its quota.
func TestPerByteStreamCutOffAtHardLimit(t *testing.T) {
	be := streamCapBackend(t)
	g := startWireGateway(t, t.TempDir(), "", streamCapCatalog(be.URL), "")
	get := func(t *testing.T, user, query string, limit int64) ([]byte, string, error) {
		t.Helper()
		key, _ := g.newKey(user)
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/api/service/sc/endpoint/events/invoke%s", gwPort, query), nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
		return body, resp.Header.Get("X-Platform-Request-ID"), err
	}
	cut := func(t *testing.T, user, product, credits string, want int64) {
		g.subscribe(user, "sc", product, "ACTIVE")
		if credits != "" {
			g.credits(user, "sc", credits)
		}
		body, id, err := get(t, user, "", 1<<20)
		if err == nil || int64(len(body)) != want {
			t.Fatalf("caller got %d bytes (read error %v), want %d then a cut", len(body), err, want)
		}
		e, ok := waitEntry(t, g, user, id)
		if !ok {
			t.Fatalf("no ledger row for %s", id)
		}
		if e.Units != billing.Whole(want) || e.UnitsClaimed != 0 {
			t.Errorf("charged %s (claimed %s), want exactly the %d bytes delivered", e.Units, e.UnitsClaimed, want)
		}
		acct := store.Account{UserID: user, ServiceID: "sc", Product: productOfService(t, g, "sc", product)}
		if st, err := g.store().State(t.Context(), acct, time.Now()); err != nil || st.Reserved != 0 || st.CreditsHeld != 0 || st.Used != billing.Whole(want) {
			t.Errorf("after the cut: %+v (%v), want %d used and nothing held", st, err, want)
		}
	}
	t.Run("prepaid", func(t *testing.T) {
		cut(t, "sc-prepaid", "prepaid", "1500", 3000)
	})
	t.Run("quota with overage blocked", func(t *testing.T) {
		cut(t, "sc-block", "block", "", 5000)
	})
	t.Run("overage allowed without a cap: never cut", func(t *testing.T) {
		g.subscribe("sc-allow", "sc", "allow", "ACTIVE")
		const read = 200_000
		body, id, err := get(t, "sc-allow", "", read)
		if err != nil || len(body) != read {
			t.Fatalf("caller got %d bytes (%v), want %d", len(body), err, read)
		}
		// The caller hangs up: charged what reached it, less up to the
		// chunk framing still unacknowledged (docs/wire-contract.md).
		const framingSlack = 4 << 10
		if e, ok := waitEntry(t, g, "sc-allow", id); !ok || e.Units < billing.Whole(read-framingSlack) || e.UnitsClaimed != 0 {
			t.Errorf("charged %+v, want about the %d bytes read", e, read)
		}
	})
	t.Run("PER_REQUEST: not bounded", func(t *testing.T) {
		g.subscribe("sc-request", "sc", "request", "ACTIVE")
		body, id, err := get(t, "sc-request", "?size=100000", 1<<20)
		if err != nil || len(body) != 100000 {
			t.Fatalf("caller got %d bytes (%v), want the whole 100000", len(body), err)
		}
		if e, ok := waitEntry(t, g, "sc-request", id); !ok || e.Units != billing.Whole(1) {
			t.Errorf("charged %+v, want 1 request", e)
		}
	})
}

// TestWebSocketPerByteCutOffAtHardLimit: a PER_BYTE WebSocket tunnel
// carried the backend's bytes without end past the caller's prepaid
// balance. It is closed once it carried what the balance pays for, and
// charged exactly that.
func TestWebSocketPerByteCutOffAtHardLimit(t *testing.T) {
	be := streamCapBackend(t)
	g := startWireGateway(t, t.TempDir(), "", streamCapCatalog(be.URL), "")
	key, _ := g.newKey("ws-prepaid")
	g.subscribe("ws-prepaid", "sc", "prepaid", "ACTIVE")
	g.credits("ws-prepaid", "sc", "2000")
	conn, rd := webSocketRequest(t, "sc", "events", key)
	defer conn.Close()
	resp := mustSwitch(t, rd)
	id := resp.Header.Get("X-Platform-Request-ID")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(io.LimitReader(rd, 1<<20))
	if len(got) != 4000 {
		t.Fatalf("the tunnel carried %d bytes, want the 4000 the balance pays for, then a close", len(got))
	}
	e, ok := waitEntry(t, g, "ws-prepaid", id)
	if !ok {
		t.Fatalf("no ledger row for %s", id)
	}
	if e.Units != billing.Whole(4000) || e.UnitsClaimed != 0 {
		t.Errorf("charged %s (claimed %s), want exactly the 4000 bytes carried", e.Units, e.UnitsClaimed)
	}
	st, _ := g.store().State(t.Context(), store.Account{UserID: "ws-prepaid", ServiceID: "sc", Product: productOfService(t, g, "sc", "prepaid")}, time.Now())
	if st.Credits != 0 || st.CreditsHeld != 0 {
		t.Errorf("after the tunnel: %+v, want the balance spent and nothing held", st)
	}
}

// TestPerTimeUnitStreamCutOffAtHardLimit: an endless stream on a
// PER_TIME_UNIT product ran past the caller's prepaid balance for as long
// as the backend sent, charged only up to the balance. It is cut before
// its seconds pass what the balance pays for (2 seconds here) and charged
// them, nothing uncharged.
func TestPerTimeUnitStreamCutOffAtHardLimit(t *testing.T) {
	be := streamCapBackend(t)
	cat := strings.Replace(streamCapCatalog(be.URL), "product request {", `product seconds {
				billing PREPAID
				measurement PER_TIME_UNIT
				unit second
				price 1
			}
			product request {`, 1)
	g := startWireGateway(t, t.TempDir(), "", cat, "")
	key, _ := g.newKey("sc-seconds")
	g.subscribe("sc-seconds", "sc", "seconds", "ACTIVE")
	g.credits("sc-seconds", "sc", "2")
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/api/service/sc/endpoint/events/invoke", gwPort), nil)
	req.Header.Set("Authorization", "Bearer "+key)
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	took := time.Since(start)
	if err == nil || took > 2*time.Second {
		t.Fatalf("the stream ended after %s (read error %v), want a cut within the 2 seconds paid for", took, err)
	}
	e, ok := waitEntry(t, g, "sc-seconds", resp.Header.Get("X-Platform-Request-ID"))
	if !ok {
		t.Fatal("no ledger row")
	}
	if e.Units != billing.Whole(2) || e.UnitsClaimed != 0 {
		t.Errorf("charged %s (claimed %s), want the 2 seconds, nothing uncharged", e.Units, e.UnitsClaimed)
	}
}
