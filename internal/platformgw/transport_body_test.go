package platformgw

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/platformgw/gateway/internal/catalog"
)

// countingConn counts the writes made on a backend connection; while
// *drop is set, the next write on any connection fails before a byte of
// it is written, as on a keep-alive connection the backend has just
// closed, and clears it.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
	drop   *atomic.Bool
}

func (c countingConn) Write(p []byte) (int, error) {
	if c.drop.CompareAndSwap(true, false) {
		c.Conn.Close()
		return 0, errors.New("write: connection reset by peer")
	}
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// caddyWrapped stands for the readers reverse_proxy wraps a request body
// in before it reaches the transport (its trailer and close guards):
// net/http does not know them as a body in memory.
type caddyWrapped struct{ io.ReadCloser }

// TestTransportSendsBodyWithHeaders: a forwarded body (a sync call's, an
// async job's envelope) reached the backend in a second write after the
// headers, because reverse_proxy's wrappers hid from net/http that it was
// in memory: one syscall more per call on the gateway and often one read
// more at the backend. The platform transport now hands net/http the
// bytes, and a retry (or net/http's own replay on a keep-alive connection
// the backend closed) gets the whole body again.
func TestTransportSendsBodyWithHeaders(t *testing.T) {
	// A backend that reads one request, with its body, and answers 204.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 4)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					b, _ := io.ReadAll(req.Body)
					got <- string(b)
					io.WriteString(conn, "HTTP/1.1 204 No Content\r\n\r\n")
				}
			}()
		}
	}()

	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	tr := new(Transport)
	if err := tr.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer tr.Cleanup()
	var writes atomic.Int64
	var drop atomic.Bool
	dial := tr.HTTPTransport.Transport.DialContext
	tr.HTTPTransport.Transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes, drop: &drop}, nil
	}

	svc := &catalog.Service{ID: "svc", Backend: "http://" + ln.Addr().String(), Secrets: []string{"test-secret-0123456789abcdef0123"},
		Endpoints: []*catalog.Endpoint{{ID: "call", Methods: []string{"POST"}}}}
	if _, err := catalog.Compile([]*catalog.Service{svc}, nil); err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"request_id":"r1","payload":"` + strings.Repeat("x", 600) + `"}`)

	// newCall is a call whose body setBody handed to the proxy.
	newCall := func(method string, body []byte, hdr ...string) (*call, *http.Request) {
		t.Helper()
		r, err := http.NewRequestWithContext(context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{}),
			method, "http://"+ln.Addr().String()+"/job", nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		c := new(call)
		c.fwd.svc = svc
		c.fwd.add("X-Platform-Request-ID", "r1")
		setBody(r, &c.fwd, body)
		caddyhttp.SetVar(r.Context(), forwardVar, &c.fwd)
		return c, r
	}
	// send makes one attempt the way reverse_proxy does: a copy of the
	// request with the body wrapped (after prepare, which may read it,
	// as request_buffers does), and checks the backend got want, in one
	// write unless the body is not the payload.
	send := func(r *http.Request, prepare func(*http.Request), want []byte) {
		t.Helper()
		if f, ok := forwardOf(r); ok {
			// Each attempt as if the one before it never reached the
			// backend (a dial error): the only attempt the transport
			// sends again.
			f.sentErr = nil
		}
		out := r.Clone(r.Context())
		if prepare != nil {
			prepare(out)
		}
		out.Body = caddyWrapped{out.Body}
		out.URL.Host = ln.Addr().String()
		before := writes.Load()
		resp, err := tr.RoundTrip(out)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n := writes.Load() - before; n != 1 && bytes.Equal(want, payload) {
			t.Errorf("the request went out in %d writes, want 1 (headers and body together)", n)
		}
		if b := <-got; b != string(want) {
			t.Errorf("the backend read a body of %d bytes, want %d bytes", len(b), len(want))
		}
	}

	c, r := newCall(http.MethodPost, payload)
	send(r, nil, payload) // the first attempt reads through the call's reader
	send(r, nil, payload) // a retry gets a reader of its own

	// The pooled connection fails before anything of the next request is
	// written: net/http sends it again on a new connection, whole.
	drop.Store(true)
	send(r, nil, payload)
	if drop.Load() {
		t.Fatal("the request did not go out on the pooled connection")
	}
	if c.fwd.req.GetBody == nil {
		t.Fatal("the request has no GetBody: net/http cannot replay it on a keep-alive connection the backend closed")
	}
	rc, err := c.fwd.req.GetBody()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(rc); !bytes.Equal(b, payload) {
		t.Errorf("GetBody gave %d bytes, want the payload", len(b))
	}

	// request_buffers reads the body before the transport, all of it or
	// up to its limit, into a copy: the first attempt still sends it whole.
	// (A GET has no GetBody, below, so net/http cannot mend a short body
	// by sending it again.)
	for _, limit := range []int{len(payload) + 1, len(payload) / 3} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			_, r := newCall(method, payload)
			send(r, func(out *http.Request) {
				buf := make([]byte, limit)
				n, _ := io.ReadFull(out.Body, buf)
				out.Body = io.NopCloser(io.MultiReader(bytes.NewReader(buf[:n]), out.Body))
			}, payload)
		}
	}

	// A body of another length than the payload's (a handler in between
	// replaced it) is left as the proxy gave it.
	_, r = newCall(http.MethodPost, payload)
	other := []byte("another body")
	send(r, func(out *http.Request) {
		out.Body = io.NopCloser(bytes.NewReader(other))
		out.ContentLength = int64(len(other))
	}, other)

	// Calls net/http would replay after writing them, when their body can
	// be read again, keep no GetBody: the backend must not get them twice.
	for _, tc := range []struct {
		method string
		hdr    []string
	}{{http.MethodGet, nil}, {http.MethodPut, nil}, {http.MethodPost, []string{"Idempotency-Key", "k1"}}, {http.MethodPost, []string{"X-Idempotency-Key", "k2"}}} {
		c, r := newCall(tc.method, payload, tc.hdr...)
		send(r, nil, payload)
		if replay := c.fwd.req.GetBody != nil; replay != (tc.method == http.MethodPut) {
			t.Errorf("%s %v: GetBody set %v", tc.method, tc.hdr, replay)
		}
	}

	// No body: nothing to set, and no GetBody.
	r2, _ := http.NewRequestWithContext(context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{}),
		http.MethodGet, "http://"+ln.Addr().String()+"/call", nil)
	c2 := new(call)
	c2.fwd.svc = svc
	setBody(r2, &c2.fwd, nil)
	caddyhttp.SetVar(r2.Context(), forwardVar, &c2.fwd)
	out := r2.Clone(r2.Context())
	resp, err := tr.RoundTrip(out)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if b := <-got; b != "" {
		t.Errorf("a call without a body forwarded %q", b)
	}
	if c2.fwd.req.GetBody != nil {
		t.Error("a call without a body has a GetBody")
	}
}
