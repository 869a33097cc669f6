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

	// send makes one attempt the way reverse_proxy does: a copy of the
	// request with the body wrapped.
	send := func(r *http.Request) {
		t.Helper()
		out := r.Clone(r.Context())
		out.Body = caddyWrapped{r.Body}
		out.URL.Host = ln.Addr().String()
		before := writes.Load()
		resp, err := tr.RoundTrip(out)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n := writes.Load() - before; n != 1 {
			t.Errorf("the request went out in %d writes, want 1 (headers and body together)", n)
		}
		if b := <-got; b != string(payload) {
			t.Errorf("the backend read a body of %d bytes, want the %d-byte payload", len(b), len(payload))
		}
	}

	vars := map[string]any{}
	r, err := http.NewRequestWithContext(context.WithValue(context.Background(), caddyhttp.VarsCtxKey, vars),
		http.MethodPost, "http://"+ln.Addr().String()+"/job", nil)
	if err != nil {
		t.Fatal(err)
	}
	c := new(call)
	c.fwd.svc = svc
	c.fwd.add("X-Platform-Request-ID", "r1")
	setBody(r, &c.fwd, payload)
	caddyhttp.SetVar(r.Context(), forwardVar, &c.fwd)

	send(r) // the first attempt reads through the call's reader
	// A retry after a failed attempt that read the body: it gets all of it.
	c.fwd.payloadReader.Seek(int64(len(payload)/2), io.SeekStart)
	send(r)

	// The pooled connection fails before anything of the next request is
	// written: net/http sends it again on a new connection, whole.
	drop.Store(true)
	send(r)
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
