//go:build linux

package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// The bound docs/wire-contract.md states for a PER_BYTE caller that hangs
// up over HTTP/1.1 on Linux: at most the bytes it read, plus what its own
// machine had received and not read (its socket's receive buffer and its
// HTTP client's read buffer), plus the gateway's write buffers.
const (
	// smallRcvbuf is the receive buffer the test's caller asks for, before
	// it connects; Linux gives twice that (smallWindowClient reads it back).
	smallRcvbuf = 16 << 10
	// clientReadBuffer is the caller's HTTP client's read buffer.
	clientReadBuffer = 4 << 10
	// gatewayWriteBuffers is what net/http buffers of an HTTP/1.1 answer
	// before its connection: 2 KiB in the response, 4 KiB in the
	// connection.
	gatewayWriteBuffers = 6 << 10
)

// deliveryServers is the global option that wraps the gateway's
// connections in platform_delivery, which measures what a connection still
// held unacknowledged when a write to it failed.
const deliveryServers = `	servers {
		listener_wrappers {
			platform_delivery
			tls
		}
	}`

// smallWindowClient is an HTTP/1.1 client whose connections have a small
// receive buffer, set before they connect so the window its kernel
// advertises stays small, and a read buffer of clientReadBuffer; rcvbuf
// holds the receive buffer the kernel gave. One connection a request.
func smallWindowClient(t *testing.T) (*http.Client, *atomic.Int64) {
	t.Helper()
	rcvbuf := new(atomic.Int64)
	d := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, smallRcvbuf); serr != nil {
				return
			}
			var got int
			got, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
			rcvbuf.Store(int64(got))
		})
		if err != nil {
			return err
		}
		return serr
	}}
	tr := &http.Transport{
		DialContext:       d.DialContext,
		ReadBufferSize:    clientReadBuffer,
		DisableKeepAlives: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}, rcvbuf
}

// readSlowly reads up to n bytes of r 1 KiB a read, pausing now and then
// so the gateway's writes wait on the caller's window; it returns what it
// read. The pauses make the reader slow; no result depends on them.
func readSlowly(r io.Reader, n int64) (int64, error) {
	buf := make([]byte, 1<<10)
	var read int64
	for read < n {
		k, err := r.Read(buf[:min(int64(len(buf)), n-read)])
		read += int64(k)
		if err != nil {
			return read, err
		}
		if read%(32<<10) < int64(k) {
			time.Sleep(time.Millisecond)
		}
	}
	return read, nil
}

// TestHungUpCallerIsChargedWhatReachedIt: a PER_BYTE caller that reads
// 1 MiB of a large answer and hangs up, reading fast or slowly, is charged
// at least the 1 MiB it read and at most that plus what its machine had
// received unread (its receive buffer, its client's read buffer) and the
// gateway's write buffers. Before, it was charged every byte the gateway
// had handed its connection, megabytes of them still in the gateway's
// kernel send queue, never sent or never acknowledged (the outside attack
// run: 3,301,538 bytes for 1 MiB read). A slow caller that reads the whole
// answer is charged exactly its bytes, and the hold is released each time.
//
// Both with the platform_delivery listener wrapper (which measures in the
// failed write) and without it (the call holds a second descriptor of the
// caller's socket for that): the charge is the same.
func TestHungUpCallerIsChargedWhatReachedIt(t *testing.T) {
	for _, srv := range []struct{ name, opts string }{
		{"with platform_delivery", deliveryServers},
		{"without platform_delivery", ""},
	} {
		t.Run(srv.name, func(t *testing.T) { hungUpCharges(t, srv.opts) })
	}
}

func hungUpCharges(t *testing.T, servers string) {
	be := cutBackend(t)
	g := startGatewayWithOptions(t, t.TempDir(), cutCatalog(be.URL), "", servers)
	const readLimit = 1 << 20
	cases := []struct {
		name  string
		query string
		slow  bool
		read  int64 // how much the caller reads before it hangs up; -1: all
		want  int64 // the exact charge of a complete read
		// chunked: the body goes out chunked (no Content-Length). The
		// chunk-size lines of what was not acknowledged are taken off
		// with it, so the charge may be that much below what was read:
		// only the upper bound is checked.
		chunked bool
	}{
		{name: "reader that stops after 1 MiB", query: "mode=sized&size=67108864", read: readLimit},
		{name: "slow reader that stops after 1 MiB", query: "mode=sized&size=67108864", slow: true, read: readLimit},
		{name: "reader that stops after 1 MiB of a chunked body", query: "mode=drip", read: readLimit, chunked: true},
		{name: "slow reader that reads all", query: "mode=sized&size=3145735", slow: true, read: -1, want: 3145735},
		{name: "reader that reads all", query: "mode=sized&size=3145735", read: -1, want: 3145735},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			user := "hangup-" + strconv.Itoa(i)
			key, _ := g.newKey(user)
			g.subscribe(user, "cut", "byte", "ACTIVE")
			hc, rcvbuf := smallWindowClient(t)
			req, _ := http.NewRequestWithContext(context.Background(), "GET", invokeURL("cut", "body")+"?"+tc.query, nil)
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			limit := tc.read
			if limit < 0 {
				limit = 1 << 40
			}
			var read int64
			if tc.slow {
				read, err = readSlowly(resp.Body, limit)
			} else {
				read, err = io.CopyN(io.Discard, resp.Body, limit)
			}
			if tc.read < 0 && err != io.EOF {
				t.Fatalf("the whole body did not arrive: %d bytes, %v", read, err)
			}
			if tc.read >= 0 && (err != nil || read != tc.read) {
				t.Fatalf("read %d bytes (%v), want %d", read, err, tc.read)
			}
			resp.Body.Close() // a partly read body: the caller hangs up
			id := resp.Header.Get("X-Platform-Request-ID")
			e, ok := waitEntry(t, g, user, id)
			if !ok {
				t.Fatalf("no ledger row for the call %s", id)
			}
			t.Logf("read %d bytes, charged %s", read, e.Units)
			if tc.read < 0 {
				if e.Units != billing.Whole(tc.want) {
					t.Errorf("a complete read of %d bytes charged %s", tc.want, e.Units)
				}
			} else {
				most := read + rcvbuf.Load() + clientReadBuffer + gatewayWriteBuffers
				if rcvbuf.Load() <= 0 || rcvbuf.Load() > 4*smallRcvbuf {
					t.Fatalf("the caller's receive buffer is %d bytes, asked for %d", rcvbuf.Load(), smallRcvbuf)
				}
				if e.Units > billing.Whole(most) {
					t.Errorf("charged %s bytes for %d read, at most %d reached the caller's machine (receive buffer %d)",
						e.Units, read, most, rcvbuf.Load())
				}
				// The caller's kernel may not have acknowledged the last
				// bytes it received when its program closed (a delayed
				// ACK); those are not charged: at most its receive
				// buffer, in its favour.
				if least := read - rcvbuf.Load(); !tc.chunked && e.Units < billing.Whole(least) {
					t.Errorf("charged %s bytes for %d read: below what its kernel acknowledged (at least %d)", e.Units, read, least)
				}
				if e.Units <= 0 {
					t.Errorf("charged %s for %d bytes read", e.Units, read)
				}
			}
			if st := waitNoHold(t, g, user); st.Reserved != 0 || st.ReservedSpend != 0 {
				t.Errorf("hold left after the call: %+v", st)
			}
		})
	}
}
