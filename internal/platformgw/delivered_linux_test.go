//go:build linux

package platformgw

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestDeliveryConnNotesWhatNeverReachedTheCaller: over real loopback TCP,
// a peer with a 16 KiB receive buffer reads 1 MiB and closes; the
// gateway's side writes until a write fails. What platform_delivery's
// connection noted at that write, taken off the bytes written, leaves at
// least the 1 MiB read and at most that plus the peer's receive buffer,
// where the bytes written were megabytes more. The note survives the
// close net/http makes right after a failed write.
func TestDeliveryConnNotesWhatNeverReachedTheCaller(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dl := (&DeliveryListener{}).WrapListener(ln)
	var written atomic.Int64
	type result struct {
		read, rcvbuf int64
		err          error
	}
	done := make(chan result, 1)
	go func() {
		var rcvbuf int
		d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) {
				syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10)
				rcvbuf, _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
			})
		}}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			done <- result{err: err}
			return
		}
		n, err := io.CopyN(io.Discard, c, 1<<20)
		// Hang up only once the writer is blocked on a full send queue
		// (what it wrote stops growing), so that the queue holds bytes
		// never read: otherwise a reader as fast as the writer can leave
		// it nearly empty and the test measures nothing.
		for last, still := int64(-1), 0; still < 5 && err == nil; time.Sleep(10 * time.Millisecond) {
			if w := written.Load(); w == last {
				still++
			} else {
				last, still = w, 0
			}
		}
		c.Close()
		done <- result{n, int64(rcvbuf), err}
	}()
	c, err := dl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	dc, ok := c.(*deliveryConn)
	if !ok {
		t.Fatalf("accepted a %T, not the wrapper", c)
	}
	if q, ok := dc.unacked(); !ok || q != 0 {
		t.Errorf("a fresh connection holds %d unacknowledged (%v), want 0", q, ok)
	}
	buf := make([]byte, 32<<10)
	for written.Load() < 1<<30 {
		n, err := c.Write(buf)
		written.Add(int64(n))
		if err != nil {
			break
		}
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	c.Close() // as net/http does after a failed write: the note stays
	q, ok := dc.unacked()
	if !ok {
		t.Fatal("no measurement noted at the failed write")
	}
	got := written.Load() - q
	t.Logf("written %d, unacknowledged %d, delivered %d, read %d, receive buffer %d", written.Load(), q, got, res.read, res.rcvbuf)
	if got < res.read || got > res.read+res.rcvbuf {
		t.Errorf("delivered %d, want between the %d read and that plus the %d byte receive buffer", got, res.read, res.rcvbuf)
	}
	if written.Load() <= res.read+res.rcvbuf {
		t.Errorf("wrote only %d: the test did not fill the gateway's send queue", written.Load())
	}
}

// TestDeliveredFallsBackToWhatWasWritten: a call whose connection cannot
// be measured is charged the bytes written, and one measured on a live
// connection that holds nothing unacknowledged is charged them all.
func TestDeliveredFallsBackToWhatWasWritten(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	raw, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	dc := &deliveryConn{TCPConn: raw.(*net.TCPConn)}
	req := func(proto int, v any) *http.Request {
		r, _ := http.NewRequest("GET", "http://127.0.0.1/", nil)
		r.ProtoMajor = proto
		if v != nil {
			r = r.WithContext(context.WithValue(r.Context(), connCtxKey{}, v))
		}
		return r
	}
	cases := []struct {
		name string
		r    *http.Request
	}{
		{"no connection noted (no platform_delivery)", req(1, nil)},
		{"HTTP/2: the connection carries other calls", req(2, dc)},
		{"HTTP/1.1 on a live connection with nothing unacknowledged", req(1, dc)},
	}
	for _, tc := range cases {
		if got := delivered(tc.r, 12345, heldSocket{}); got != 12345 {
			t.Errorf("%s: delivered %d, want the 12345 written", tc.name, got)
		}
	}
	// A closed connection that noted nothing cannot be measured.
	closed := &deliveryConn{TCPConn: raw.(*net.TCPConn)}
	raw.Close()
	if q, ok := closed.unacked(); ok {
		t.Errorf("a closed connection measured %d", q)
	}
	if got := delivered(req(1, closed), 777, heldSocket{}); got != 777 {
		t.Errorf("closed connection: delivered %d, want the 777 written", got)
	}
}

// TestDeliveryConnOf finds the wrapper under a TLS connection and nothing
// under other connections.
func TestDeliveryConnOf(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			c.Close()
		}
	}()
	c, err := (&DeliveryListener{}).WrapListener(ln).Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dc := c.(*deliveryConn)
	if got := deliveryConnOf(tls.Server(c, &tls.Config{})); got != dc {
		t.Errorf("under TLS: found %v, want the wrapper", got)
	}
	if got := deliveryConnOf(dc.TCPConn); got != nil {
		t.Errorf("a bare TCP connection: found %v", got)
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if got := deliveryConnOf(p1); got != nil {
		t.Errorf("a pipe: found %v", got)
	}
}
