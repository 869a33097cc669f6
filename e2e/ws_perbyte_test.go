package e2e

import (
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

// TestWebSocketPerByteCharged: a PER_BYTE product on an allow_upgrade
// endpoint. The backend answers 101 and sends 100000 bytes through the
// tunnel; the caller reads them all. After the switch the proxy copies to
// the hijacked connection, past the metering writer, and the call was
// settled at 0 units: a tunnel of any size for free. It is charged the
// bytes the caller got, the 101's headers not counted.
func TestWebSocketPerByteCharged(t *testing.T) {
	const n = 100000
	be := tunnelBackend(t, n)
	catalog := fmt.Sprintf(`
		service ws {
			backend %s
			secret %s
			endpoint sock {
				methods GET
				path /sock
				allow_upgrade
			}
			product bytes {
				billing SUBSCRIPTION
				measurement PER_BYTE
				unit byte
				quota 1000000
			}
		}`, be.URL, wireSecret)
	g := startWireGateway(t, t.TempDir(), "", catalog, "")
	key, _ := g.newKey("u-ws")
	g.subscribe("u-ws", "ws", "bytes", "ACTIVE")

	conn, rd := webSocketRequest(t, "ws", "sock", key)
	mustSwitch(t, rd)
	got, _ := io.ReadAll(rd)
	conn.Close()
	t.Logf("caller received %d bytes through the tunnel", len(got))
	deadline := time.Now().Add(5 * time.Second)
	for {
		es := g.ledger("u-ws")
		st, _ := g.store().State(t.Context(), store.Account{UserID: "u-ws", ServiceID: "ws", Product: productOfService(t, g, "ws", "bytes")}, time.Now())
		if len(es) > 0 || time.Now().After(deadline) {
			t.Logf("ledger %d entries, sum %s; state used=%s reserved=%s", len(es), ledgerSum(es), st.Used, st.Reserved)
			if want := billing.Whole(int64(len(got))); len(got) != n || ledgerSum(es) != want || st.Used != want || st.Reserved != 0 {
				t.Fatalf("PER_BYTE WebSocket call delivered %d of %d bytes, charged %s (used %s, held %s), want %s",
					len(got), n, ledgerSum(es), st.Used, st.Reserved, want)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOwnerWebSocketRecordedAsOneCall: a service owner's WebSocket call
// is recorded as every other call of an owner's is, one call at the
// endpoint's cost, settled at the 101 (docs/wire-contract.md, Metering;
// a subscriber's PER_REQUEST switch is the same). An owner's switch was
// left to be measured when the tunnel closed, with no measurement to
// measure by, and its ledger row held the bytes the tunnel carried as its
// units: 100000 "units" for one call in the owner's usage, the service's
// usage counters and the exports.
func TestOwnerWebSocketRecordedAsOneCall(t *testing.T) {
	const n = 100000
	be := tunnelBackend(t, n)
	catalog := fmt.Sprintf(`
		service ws {
			backend %s
			secret %s
			owners owner-ws
			endpoint sock {
				methods GET
				path /sock
				allow_upgrade
				cost 3
			}
			product calls {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 1000
			}
		}`, be.URL, wireSecret)
	g := startWireGateway(t, t.TempDir(), "", catalog, "")
	ownerKey, _ := g.newKey("owner-ws")
	subKey, _ := g.newKey("u-ws")
	g.subscribe("u-ws", "ws", "calls", "ACTIVE")

	for _, c := range []struct{ user, key string }{{"u-ws", subKey}, {"owner-ws", ownerKey}} {
		conn, rd := webSocketRequest(t, "ws", "sock", c.key)
		mustSwitch(t, rd)
		got, _ := io.ReadAll(rd)
		conn.Close()
		if len(got) != n {
			t.Fatalf("%s: the tunnel carried %d of %d bytes", c.user, len(got), n)
		}
		var es []store.LedgerEntry
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if es = g.ledger(c.user); len(es) > 0 {
				break
			}
		}
		if len(es) != 1 || es[0].Units != billing.Whole(3) || es[0].Cost != 0 {
			t.Errorf("%s: ledger %+v, want one call of the endpoint's cost 3", c.user, es)
		}
	}
}

// tunnelBackend answers a WebSocket upgrade with a 101 and n bytes
// through the tunnel, then closes it.
func tunnelBackend(t *testing.T, n int) *httptest.Server {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "not an upgrade", 400)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
		io.WriteString(conn, strings.Repeat("x", n))
	}))
	t.Cleanup(be.Close)
	return be
}
