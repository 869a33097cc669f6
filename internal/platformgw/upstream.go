package platformgw

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/platformgw/gateway/internal/catalog"
)

func init() {
	caddy.RegisterModule(new(Upstreams))
	caddy.RegisterModule(new(Transport))
}

// unroutedVar marks a request that reached the `platform` upstream source
// without being admitted: a path outside the API (`/`, `/API/...`,
// `//api/...`, typos). The proxy then has no upstream, and the gateway
// answers the caller with a JSON 404 instead of the proxy's empty 503.
const unroutedVar = "platform.unrouted"

// forwardVar is the request variable through which the gateway tells the
// upstream source and transport about an admitted request (a *forward):
// which service's backend it is for, and the headers the gateway adds
// (signature, timestamp, caller context, request id), which the transport
// sets on the request it sends, so no logger sees them.
const forwardVar = "platform.forward"

// forward is what an admitted call hands the upstream source and the
// transport. It is a field of the call, so it costs no allocation of its
// own: the header values go out as one-element slices of vals, and the
// upstream source returns up.
type forward struct {
	svc   *catalog.Service
	n     int
	names [maxForwardHeaders]string
	vals  [maxForwardHeaders]string
	up    reverseproxy.Upstream
	ups   [1]*reverseproxy.Upstream
	// req and body back the transport's copy of the request and the
	// response body of the first attempt (RoundTrip), so neither is a
	// separate allocation; a retry, which the proxy makes after a failed
	// attempt whose request net/http may still be reading, gets its own.
	req      http.Request
	body     trackedBody
	reqUsed  bool
	bodyUsed bool
	// sentErr is the error of an earlier attempt that may have reached
	// the backend (any error but a failed connection: neverSent): a retry
	// is refused with it (RoundTrip).
	sentErr error
	// resp is the backend's answer the proxy got, whose Trailer the
	// metering reads once the body is done (hadTrailers).
	resp *http.Response
	// payload is the request body the proxy forwards (setBody), nil for
	// none; payloadBody, reading it through payloadReader, is the body of
	// the first attempt.
	payload       []byte
	payloadReader bytes.Reader
	payloadBody   io.ReadCloser
}

// maxForwardHeaders: signature, timestamp, signing version, user, product,
// subscription status, roles, billing model, measurement, unit label,
// request id.
const maxForwardHeaders = 11

func (f *forward) add(name, value string) {
	f.names[f.n], f.vals[f.n] = name, value
	f.n++
}

// setPayload makes out's body the payload in a form net/http knows is in
// memory, so it writes the headers and the body together. Only a body of
// the payload's length is replaced (or one sent chunked, for trailers):
// a handler that gave the proxy another body keeps it. The first attempt
// reads through the reader setBody made, from the start again
// (`request_buffers` has read it to the end, or part of it, to make a copy
// the proxy would have sent); a retry, whose failed attempt net/http may
// still be reading, gets a reader of its own.
//
// GetBody lets net/http send the call again on a new connection when the
// pooled one it picked turns out closed before a byte of the call was
// written (that call failed with 502 before). It is set only where that
// is all it does: net/http also replays a request it has written, after
// the connection broke without an answer, when it deems the request
// idempotent (GET, HEAD, OPTIONS, TRACE, or an Idempotency-Key header) and
// can read its body again; such a call would reach the backend twice for
// one answer, so those keep no GetBody, as before.
func (f *forward) setPayload(out *http.Request, first bool) {
	payload := f.payload
	if out.ContentLength != int64(len(payload)) && out.ContentLength != -1 {
		return
	}
	if first {
		f.payloadReader.Reset(payload)
		out.Body = f.payloadBody
	} else {
		out.Body = io.NopCloser(bytes.NewReader(payload))
	}
	if !replayable(out) {
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(payload)), nil }
	}
}

// replayable reports whether net/http would replay r after writing it, if
// it could read its body again (http.Request.isReplayable's rule).
func replayable(r *http.Request) bool {
	switch r.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := r.Header["Idempotency-Key"]
	_, xkey := r.Header["X-Idempotency-Key"]
	return key || xkey
}

func forwardOf(r *http.Request) (*forward, bool) {
	f, ok := caddyhttp.GetVar(r.Context(), forwardVar).(*forward)
	return f, ok
}

// Upstreams is the `platform` dynamic upstream source: the backend of the
// service the gateway admitted the request for. A request that did not pass
// platform_gateway's checks gets no upstream, so it is never forwarded
// anywhere; platform_gateway answers it with 404 not_found.
//
//	reverse_proxy {
//		dynamic platform
//		transport platform
//	}
type Upstreams struct{}

// CaddyModule returns the Caddy module information.
func (*Upstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.platform",
		New: func() caddy.Module { return new(Upstreams) },
	}
}

// Provision refuses a reverse_proxy whose transport is not `platform`: the
// platform transport is what adds the signature and caller-context headers
// (Transport.RoundTrip), so with `transport http` (or none) every admitted
// call reached its backend unsigned, and the backend's refusal was charged.
// Caddy loads a reverse_proxy's transport before its upstream source, so
// the transport of the nearest reverse_proxy above (through `dynamic
// multi`, say) is known here.
func (*Upstreams) Provision(ctx caddy.Context) error {
	mods := ctx.Modules()
	for i := len(mods) - 2; i >= 0; i-- {
		if rp, ok := mods[i].(*reverseproxy.Handler); ok {
			if _, ok := rp.Transport.(*Transport); !ok {
				return errors.New("reverse_proxy with 'dynamic platform' needs 'transport platform': it adds the signed headers, another transport would forward calls unsigned")
			}
			return nil
		}
	}
	return nil
}

// GetUpstreams returns the admitted service's backend. The proxy fills in
// each returned Upstream, so it is new on every call; the proxy keeps the
// per-host state (in-flight counts, health) by address across requests.
func (*Upstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	f, ok := forwardOf(r)
	if !ok {
		// No upstream, and no error for the proxy to log at ERROR: the
		// gateway answers the caller (see unroutedVar).
		caddyhttp.SetVar(r.Context(), unroutedVar, true)
		return nil, nil
	}
	// The call's own Upstream, set afresh: the proxy fills it in again
	// on each of its tries, and no other request sees it.
	f.up = reverseproxy.Upstream{Dial: dialAddress(f.svc)}
	f.ups[0] = &f.up
	return f.ups[:], nil
}

func dialAddress(svc *catalog.Service) string {
	u := svc.BackendURL()
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// UnmarshalCaddyfile sets up the source; it takes no options:
//
//	dynamic platform
func (*Upstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() || d.NextBlock(0) {
		return d.Err("dynamic platform takes no options")
	}
	return nil
}

// Transport is the `platform` transport: Caddy's HTTP transport (all its
// options apply) with TLS available, speaking http or https per request as
// the admitted service's backend URL says, and sending the backend's own
// host as Host.
//
//	transport platform {
//		<options of the http transport>
//	}
type Transport struct {
	reverseproxy.HTTPTransport

	// cleanedUp is set once the config this transport belongs to was
	// replaced.
	cleanedUp atomic.Bool
}

// CaddyModule returns the Caddy module information.
func (*Transport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.transport.platform",
		New: func() caddy.Module { return new(Transport) },
	}
}

// Provision enables TLS (used only for https backends) and builds the
// underlying transport.
func (t *Transport) Provision(ctx caddy.Context) error {
	if t.TLS == nil {
		t.TLS = new(reverseproxy.TLSConfig)
	}
	return t.HTTPTransport.Provision(ctx)
}

// RoundTrip sends the request with the scheme and Host of its backend and
// the gateway's signed headers. Those are set on a copy of the request:
// reverse_proxy logs the request it passed here (with its headers, at DEBUG
// and when a response is aborted), and that one never holds a signature.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	f, routed := forwardOf(req)
	if routed && f.sentErr != nil {
		// A call reaches its backend at most once. Caddy retries a GET
		// (lb_retries, lb_try_duration) after any transport error, a
		// response_header_timeout too, when the request was sent and the
		// backend may be working on it: the work would run twice, charged
		// once, under the same signature and timestamp (which a backend
		// refusing replays answers with a 4xx, charged). Only an attempt
		// that never connected (a dial error) is tried again; the caller
		// gets the first attempt's error (504 for a timeout).
		return nil, f.sentErr
	}
	if routed {
		u := f.svc.BackendURL()
		req.URL.Scheme = u.Scheme
		req.Host = u.Host
		out := &f.req
		if f.reqUsed {
			out = new(http.Request)
		}
		f.reqUsed = true
		first := out == &f.req
		*out = *req
		out.Header = make(http.Header, len(req.Header)+f.n)
		maps.Copy(out.Header, req.Header)
		for i := range f.n {
			out.Header[f.names[i]] = f.vals[i : i+1 : i+1]
		}
		if f.payload != nil && req.Body != nil && req.Body != http.NoBody {
			f.setPayload(out, first)
		}
		req = out
	}
	resp, err := t.HTTPTransport.RoundTrip(req)
	if err != nil && routed && !neverSent(err) {
		f.sentErr = err
	}
	if err == nil && routed {
		// The backend answered. lb_retry_match can still have the proxy
		// try again on that answer ({rp.status_code}, {rp.header.*}):
		// the backend would run the call a second time under the same
		// signature and timestamp. It is refused like any retry.
		f.sentErr = errAnswered
	}
	if routed {
		f.resp = resp
	}
	if err != nil || resp.Body == nil {
		t.done()
		return resp, err
	}
	var tb *trackedBody
	if routed && !f.bodyUsed {
		f.bodyUsed = true
		tb = &f.body
	} else {
		tb = new(trackedBody)
	}
	*tb = trackedBody{ReadCloser: resp.Body, t: t}
	if rw, ok := resp.Body.(io.ReadWriteCloser); ok {
		// A 101's body is the backend connection, which reverse_proxy
		// writes the caller's side of a WebSocket to: it must stay
		// writable, or every upgrade fails with 502.
		resp.Body = &trackedConn{trackedBody: tb, w: rw}
		return resp, nil
	}
	resp.Body = tb
	return resp, nil
}

// errAnswered refuses a retry of a call its backend answered: the caller
// gets 502 service_error, not charged.
var errAnswered = errors.New("the backend answered this call already; a call is not sent twice (lb_retry_match)")

// neverSent reports whether a failed attempt certainly never sent the
// request: the connection to the backend was not made (Caddy's DialError
// is the TCP dial), or its TLS handshake failed (a certificate refused, a
// handshake timeout, an alert), or the backend is not TLS at all.
func neverSent(err error) bool {
	var (
		dial   reverseproxy.DialError
		verify *tls.CertificateVerificationError
		record tls.RecordHeaderError
		alert  tls.AlertError
	)
	if errors.As(err, &dial) || errors.As(err, &verify) || errors.As(err, &record) || errors.As(err, &alert) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "TLS handshake timeout") || strings.Contains(msg, "server gave HTTP response to HTTPS client")
}

// hadTrailers reports whether the backend's answer carried trailers (read
// once its body is done: undeclared ones arrive with its end).
func (f *forward) hadTrailers() bool { return f.resp != nil && len(f.resp.Trailer) > 0 }

// RequestHeaderOps declines the header operation Caddy's http transport
// asks its proxy for when TLS is configured (as Provision does here): set
// Host to the upstream's host:port. RoundTrip sets the backend's own host
// as Host on every request anyway, so the operation changed nothing on the
// wire, and applying it made the proxy copy every request's headers into
// a new map first.
func (*Transport) RequestHeaderOps() *headers.HeaderOps { return nil }

// Cleanup closes the idle backend connections of a replaced config. A
// reload cleans the old config up without waiting for its last requests
// (Caddy lets them finish within the grace period), and their connections
// went back to this transport's pool afterwards, where they stayed open
// until the idle timeout (2 minutes): under reloads every second, sockets
// and goroutines piled up (found by TestReloadUnderLoad). Now the pool is
// emptied again whenever one of those requests finishes.
func (t *Transport) Cleanup() error {
	t.cleanedUp.Store(true)
	return t.HTTPTransport.Cleanup()
}

// done ends one response; after Cleanup, the connection it gave back to
// the pool is closed.
func (t *Transport) done() {
	if t.cleanedUp.Load() && t.HTTPTransport.Transport != nil {
		t.HTTPTransport.Transport.CloseIdleConnections()
	}
}

// trackedBody tells its transport when the proxy is done with a response.
type trackedBody struct {
	io.ReadCloser
	t    *Transport
	once sync.Once
}

func (b *trackedBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.t.done)
	return err
}

// trackedConn is a trackedBody that stays writable: the backend side of an
// upgraded (101) connection.
type trackedConn struct {
	*trackedBody
	w io.Writer
}

func (c *trackedConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// UnmarshalCaddyfile accepts the options of the http transport.
func (t *Transport) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return t.HTTPTransport.UnmarshalCaddyfile(d)
}

// Interface guards.
var (
	_ reverseproxy.UpstreamSource = (*Upstreams)(nil)
	_ caddy.Provisioner           = (*Upstreams)(nil)
	_ caddyfile.Unmarshaler       = (*Upstreams)(nil)
	_ http.RoundTripper           = (*Transport)(nil)
	_ caddy.Provisioner           = (*Transport)(nil)
	_ caddy.CleanerUpper          = (*Transport)(nil)
	_ caddyfile.Unmarshaler       = (*Transport)(nil)
)
