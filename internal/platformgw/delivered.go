package platformgw

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A PER_BYTE call is charged the body bytes that reached the caller. When
// the body goes out whole, that is every byte written. When the caller
// hangs up first, the bytes the gateway wrote are not what it received:
// the kernel holds what the caller had not acknowledged yet in the
// connection's send queue (on loopback several megabytes), and callers
// that read 1 MiB and closed were charged 3.3 MB each. Those bytes are
// taken off: the kernel is asked how many it still holds unsent or
// unacknowledged (unackedBytes, delivered_linux.go) and the rest is
// charged. Bytes the caller's kernel acknowledged reached the caller's
// machine, read by the program or not: they are charged.
//
// net/http closes the connection inside the write that fails, before the
// handler sees the error, so the handler cannot ask then. The
// platform_delivery listener wrapper asks in that write, before it
// returns; and for a caller whose request was cancelled without a failed
// write, the handler asks itself (the connection is still open). On a
// server without the wrapper, a PER_BYTE call keeps a second descriptor
// of the caller's socket from its status line to its settlement
// (holdCallerConn), which outlives net/http's close. The measurement
// itself is taken only for a call the caller left before the end: a
// completed call is charged its bytes without one.

func init() {
	caddy.RegisterModule(new(DeliveryListener))
}

// DeliveryListener is the `platform_delivery` listener wrapper: it lets a
// PER_BYTE call a caller hangs up on be charged only the bytes that reached
// the caller (docs/wire-contract.md). It must come before `tls`, so that
// it wraps the TCP connection (after it, connections pass unchanged):
//
//	servers {
//		listener_wrappers {
//			platform_delivery
//			tls
//		}
//	}
type DeliveryListener struct{}

// CaddyModule returns the Caddy module information.
func (*DeliveryListener) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.listeners.platform_delivery",
		New: func() caddy.Module { return new(DeliveryListener) },
	}
}

// WrapListener wraps each TCP connection the listener accepts.
func (*DeliveryListener) WrapListener(ln net.Listener) net.Listener {
	return deliveryListener{ln}
}

// UnmarshalCaddyfile sets the wrapper up; it takes no options.
func (*DeliveryListener) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() || d.NextBlock(0) {
		return d.Err("platform_delivery takes no options")
	}
	return nil
}

type deliveryListener struct{ net.Listener }

func (l deliveryListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		// One allocation a connection. Anything else (a TLS connection,
		// when the wrapper stands after tls) passes as it is: HTTP/2
		// needs its *tls.Conn.
		return &deliveryConn{TCPConn: tc}, err
	}
	return c, err
}

// deliveryConn is a TCP connection that notes, when a write to it fails,
// the bytes its send queue still held unacknowledged. Every other method
// is the TCP connection's own (sendfile, CloseWrite, SyscallConn).
type deliveryConn struct {
	*net.TCPConn
	// unackedAtFailure is 1 + SIOCOUTQ at the first failed write; 0
	// until a write fails (or when it could not be read).
	unackedAtFailure atomic.Int64
}

func (c *deliveryConn) Write(p []byte) (int, error) {
	n, err := c.TCPConn.Write(p)
	if err != nil && c.unackedAtFailure.Load() == 0 {
		if q, ok := unackedBytes(c.TCPConn); ok {
			c.unackedAtFailure.Store(q + 1)
		}
	}
	return n, err
}

// unacked is what the connection's send queue held unacknowledged when a
// write failed, or holds now if none has.
func (c *deliveryConn) unacked() (int64, bool) {
	if v := c.unackedAtFailure.Load(); v > 0 {
		return v - 1, true
	}
	return unackedBytes(c.TCPConn)
}

// connCtxKey is the request context key of the caller's connection, put
// there by the function registerConnContext gives the server.
type connCtxKey struct{}

// registerConnContext makes the server of the route being provisioned put
// each connection platform_delivery wrapped into the context of its
// requests, where delivered finds it: one context value a connection, none
// a request. A server with several platform_gateway handlers registers
// once per handler; the connection is stored once.
func registerConnContext(ctx caddy.Context) {
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv == nil {
		return // not inside an HTTP server (unit tests): calls are not measured
	}
	srv.RegisterConnContext(func(ctx context.Context, c net.Conn) context.Context {
		if ctx.Value(connCtxKey{}) != nil || ctx.Value(tcpConnCtxKey{}) != nil {
			return ctx
		}
		if dc := deliveryConnOf(c); dc != nil {
			return context.WithValue(ctx, connCtxKey{}, dc)
		}
		if tc := tcpConnOf(c); tc != nil {
			return context.WithValue(ctx, tcpConnCtxKey{}, tc)
		}
		return ctx
	})
}

// tcpConnCtxKey is the request context key of the caller's TCP connection
// on a server without platform_delivery.
type tcpConnCtxKey struct{}

// tcpConnOf finds the TCP connection under c, as deliveryConnOf does.
func tcpConnOf(c net.Conn) *net.TCPConn {
	for range 4 {
		switch v := c.(type) {
		case *net.TCPConn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// holdCallerConn is how a PER_BYTE call is measured on a server without
// platform_delivery: when its answer starts, it takes a second descriptor
// of the caller's socket (heldSocket, delivered_linux.go), so that the
// socket outlives net/http's close of its own descriptor in a failed
// write and its send queue can still be read. A system call at the start
// and one at the end of each such call, where the wrapper costs none;
// nothing for any other call, or when the server has the wrapper.
func (m *meterWriter) holdCallerConn() {
	if m.r.ProtoMajor != 1 || m.held.ok() || m.r.Context().Value(connCtxKey{}) != nil {
		return
	}
	if tc, _ := m.r.Context().Value(tcpConnCtxKey{}).(*net.TCPConn); tc != nil {
		m.held = holdSocket(tc)
	}
}

// deliveryConnOf finds the deliveryConn under c: c itself, or the
// connection a TLS connection (or any wrapper with NetConn, as *tls.Conn
// has) runs on. Nil when there is none.
func deliveryConnOf(c net.Conn) *deliveryConn {
	for range 4 {
		switch v := c.(type) {
		case *deliveryConn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// callerLeft reports whether the caller went away before the answer was
// over: a write to it failed (it hung up, or a write timeout ended it), or
// the server cancelled its request (net/http does when it sees the
// connection close). A wrapped answer being buffered never writes to the
// caller before the end: nothing of it was on the connection.
func (m *meterWriter) callerLeft() bool {
	tunnelFailed := m.tunnelConn != nil && m.tunnelConn.failed.Load()
	return !m.atEnd && (m.writeFailed || tunnelFailed || m.r.Context().Err() != nil)
}

// deliveredBytes is what a PER_BYTE call is charged: the bytes written, or
// for a caller that left early, those less what its connection still held
// unacknowledged.
func (m *meterWriter) deliveredBytes() int64 {
	written := m.written + m.tunneled.Load()
	if !m.callerLeft() {
		return written
	}
	return delivered(m.r, written, m.held)
}

// delivered is written less the bytes the caller's connection held in its
// kernel send queue, not sent or not acknowledged by the caller's TCP
// stack (they include the body's framing: chunk sizes, TLS records). It is
// written when the connection cannot be measured: HTTP/2 and HTTP/3, where
// one connection carries many calls (HTTP/2's flow control bounds what the
// gateway writes ahead of the caller instead), a connection that is not
// TCP, a system other than Linux.
func delivered(r *http.Request, written int64, held heldSocket) int64 {
	if r.ProtoMajor != 1 {
		return written
	}
	var q int64
	var ok bool
	if dc, _ := r.Context().Value(connCtxKey{}).(*deliveryConn); dc != nil {
		q, ok = dc.unacked()
	} else {
		q, ok = held.unacked()
	}
	if !ok {
		return written
	}
	return max(written-q, 0)
}

// Interface guards.
var (
	_ caddy.ListenerWrapper = (*DeliveryListener)(nil)
	_ caddyfile.Unmarshaler = (*DeliveryListener)(nil)
)
