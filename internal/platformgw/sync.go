package platformgw

import (
	"bufio"
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// reserve holds the call's units before it is forwarded and fills the
// allowance the caller is shown.
func (h *Handler) reserve(r *http.Request, c *call) (store.Reservation, *apierror.Error) {
	hold := h.rt.HoldUnits(c.account, c.ep)
	res, err := h.rt.Meter().Reserve(r.Context(), c.account, hold, c.started)
	if err == nil && !res.Decision.Allowed {
		if fit := c.refit(hold, res.State, &res.Decision); fit > 0 {
			res, err = h.rt.Meter().Reserve(r.Context(), c.account, fit, c.started)
		}
	}
	if errors.Is(err, store.ErrNoAccount) {
		return res, apierror.New(apierror.NoSubscription, "no subscription to service "+c.svc.ID)
	}
	if errors.Is(err, store.ErrUnavailable) {
		return res, apierror.Unavailable() // the store logs its failures, once per burst
	}
	if err != nil {
		h.logger.Error("reserve", zap.Error(err))
		return res, apierror.New(apierror.InternalError, "could not reserve usage")
	}
	return res, h.judge(c, res.Decision, res.State)
}

// judge fills the quota allowance the caller is shown from the
// subscription's state and turns a refused decision into the caller's
// error (with Retry-After for a quota or cap). Sync calls and async jobs
// both judge the reservation they took.
func (h *Handler) judge(c *call, dec billing.Decision, st billing.State) *apierror.Error {
	if c.product != nil && c.product.Quota != nil {
		// The subscription was read when the call was admitted; reading it
		// again here cost a second store lookup on every call.
		start, end := billing.PeriodBounds(c.product.Period, c.product.CalendarPeriods, c.subStarted, c.started)
		c.allowance.setQuota(c.product, st, start, end, c.started)
	}
	if !dec.Allowed {
		e := apierror.New(dec.Code, dec.Reason)
		if dec.Code == billing.CodeQuotaExceeded && c.product != nil {
			// A quota and a spending cap both reset with the period, if
			// the subscription lasts that long.
			msg, at := subscription.QuotaRetry(dec.Reason, *c.product, c.subStarted, c.subEnds, c.started)
			e.Message = msg
			e.WithRetry(at.Sub(c.started))
		}
		return e
	}
	return nil
}

func (h *Handler) invokeSync(w http.ResponseWriter, r *http.Request, c *call, next caddyhttp.Handler) error {
	res, e := h.reserve(r, c)
	if e != nil {
		h.refuseCall(w, r, c, true, "rejected", e)
		return nil
	}
	var stopAt func()
	var forwarded time.Time // a PER_TIME_UNIT call's seconds count from here
	if c.product != nil && c.product.MeasurementType == billing.PerTimeUnit {
		r, stopAt = withCeilingCancel(r) // streamcap.go
		defer stopAt()
		forwarded = h.rt.Now()
	}
	h.prepareForward(r, c, c.body, c.ep.Path)
	setBody(r, &c.fwd, c.body)

	out, wrapped := h.syncOutput(w, r, c) // wrapped.go: sync_response wrapped
	m := &c.meter
	*m = meterWriter{w: out, r: r, h: h, c: c, res: res, wrap: wrapped, stopAt: stopAt, forwarded: forwarded}
	defer func() {
		// The reverse proxy panics with http.ErrAbortHandler when a body
		// is cut off, by the backend (it closed before its Content-Length)
		// or by the caller (it hung up mid-download), so that the server
		// aborts the connection. The call still ends here: a PER_BYTE or
		// PER_TIME_UNIT call is charged what was delivered (nothing was
		// settled at its status line), and a hold is never left behind.
		// Then the panic goes on, and the connection is aborted as before.
		if v := recover(); v != nil {
			c.cutOff = v == http.ErrAbortHandler
			// A wrapped answer being buffered is not delivered: not charged.
			m.end(false)
			if v == http.ErrAbortHandler && m.atEnd {
				// The backend cut its body off while it was buffered;
				// nothing has reached the caller, who is told so.
				wrapped.finish(false, errCutOff)
				return
			}
			panic(v)
		}
	}()
	err := next.ServeHTTP(m, r)
	m.dropBrandTrailers()
	if !m.wroteHeader {
		// Nothing reached the caller: the backend was not reached or did
		// not answer, or the caller left before it did. Not charged.
		h.release(c, res)
		if m.callerGone {
			h.rt.CountKnownInvoke(c.svc.ID, c.ep.ID, "sync", "caller_gone")
			w.WriteHeader(statusClientClosed) // for the access log, as the proxy does
			return nil
		}
		h.refuseCall(w, r, c, true, "backend_error", h.unreachable(c, err))
		return nil
	}
	m.end(wrapped.delivers(err))
	wrapped.finish(m.failed, err)
	if err != nil {
		h.logger.Debug("response ended early", zap.String("request_id", c.requestID), zap.Error(err))
	}
	return nil
}

// end settles a call that is over, however it ended: the measured units of
// a deferred call (the bytes that reached the caller, the time it took), or
// the hold's release when nothing reached the caller. A call settled at its
// status line is left as it is.
//
// delivered matters only for a wrapped answer the wrappedWriter buffers
// (atEnd): whether the caller gets it. One that cannot be wrapped (cut off,
// too large) reaches the caller as an error, and is not charged.
func (m *meterWriter) end(delivered bool) {
	defer m.held.release()
	if m.capTimer != nil {
		m.capTimer.Stop()
	}
	switch {
	case m.settled:
	case m.atEnd && !delivered:
		m.settled = true
		m.h.release(m.c, m.res)
		m.h.rt.CountKnownInvoke(m.c.svc.ID, m.c.ep.ID, "sync", "backend_error")
	case m.atEnd:
		units := m.endUnits
		if m.deferred {
			units = m.deferredUnits()
		}
		// Nothing has reached the caller yet: a settlement that fails
		// releases the hold, and the answer is withheld.
		m.deferred = false
		if !m.settleNow(units) {
			m.failed = true
		}
	case !m.wroteHeader:
		m.settled = true
		m.h.release(m.c, m.res)
		m.h.rt.CountKnownInvoke(m.c.svc.ID, m.c.ep.ID, "sync", "backend_error")
	case m.deferred && m.status < 500:
		m.settleNow(m.deferredUnits())
	default:
		m.settled = true
		m.h.release(m.c, m.res)
	}
}

// refit is what a call (or job) whose hold was refused holds instead, 0
// for nothing. The hold is the caller's estimate when that is more than
// the endpoint's cost (engine.HoldUnits), a guess from its past calls that
// falls only with calls that are served: refused, it never fell, and one
// large call locked the caller out of the rest of its quota or credits
// until a restart. What is left, when something is and it covers the cost,
// is held instead: one such call at a time, at most its claim past the
// limit uncharged (docs/wire-contract.md, "Claims past a hard limit").
// Nothing left (with cost 0, "covers the cost" holds for nothing) stays a
// refusal, told what a call costs rather than the estimate: d is replaced
// by the decision at cost when that refuses too.
func (c *call) refit(hold billing.Units, st billing.State, d *billing.Decision) billing.Units {
	cost := c.ep.UnitCost()
	if hold <= cost {
		return 0
	}
	if fit := billing.Fit(c.account.Product, st, hold); fit > 0 && fit >= cost {
		return fit
	}
	if at := billing.Decide(c.account.Product, st, cost); !at.Allowed {
		*d = at
	}
	return 0
}

// statusClientClosed is the status Caddy's reverse proxy writes when the
// caller's request is cancelled before the backend answered (nginx's 499,
// "client closed request").
const statusClientClosed = 499

// callerHungUp reports whether status, written to the gateway's writer by
// Caddy's reverse proxy for r, is not the backend's answer but the
// proxy's 499: the caller's request was cancelled (it hung up, or a
// balancer in front gave up) before the backend's status line. The
// contract charges such a call nothing, whatever its measurement, and an
// async job is failed (meterWriter.WriteHeader, backendAnswer.WriteHeader).
func callerHungUp(status int, r *http.Request) bool {
	return status == statusClientClosed && r != nil && r.Context().Err() != nil
}

// errCutOff stands for the proxy's abort when a backend cut off the body of
// a wrapped answer.
var errCutOff = errors.New("the backend's response body ended early")

// unreachable is the caller's error for a backend that was not reached or
// did not answer (err is what the reverse proxy returned).
func (h *Handler) unreachable(c *call, err error) *apierror.Error {
	if err != nil {
		h.logger.Warn("backend unreachable", zap.String("request_id", c.requestID),
			zap.String("service", c.svc.ID), zap.Error(err))
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode == http.StatusGatewayTimeout {
		return apierror.New(apierror.ServiceTimeout, "the service backend did not answer in time")
	}
	return apierror.New(apierror.ServiceError, "the service backend could not be reached")
}

// setBody puts the buffered body back for the proxy, with a known length,
// and tells the transport the bytes (f.payload): reverse_proxy wraps the
// body it hands the transport in readers of its own, which net/http does
// not recognise as a body in memory, so it wrote the headers and the body
// in two writes (two syscalls, and often two reads at the backend).
// Transport.RoundTrip gives net/http the bytes again, as a *bytes.Reader
// in an io.NopCloser, which it sends with the headers in one write.
func setBody(r *http.Request, f *forward, body []byte) {
	r.Header.Del("Expect")
	r.TransferEncoding = nil
	r.ContentLength = int64(len(body))
	if len(body) == 0 {
		r.Body = http.NoBody
		f.payload, f.payloadBody = nil, nil
		return
	}
	f.payloadReader.Reset(body)
	f.payload = body
	f.payloadBody = io.NopCloser(&f.payloadReader)
	r.Body = f.payloadBody
}

// release returns a reservation unused. Like settling, it runs to the end
// even when the caller has gone away: the hold must not leak. A hold the
// store no longer has (ErrNotFound) needs nothing: a settlement that
// failed took it with it (a fleet node's settlement kept for the
// database, answered store_unavailable after its wait), and logging each
// of those as an error would fill the log during an outage.
func (h *Handler) release(c *call, res store.Reservation) {
	if res.ID == "" {
		return
	}
	_, err := h.rt.Meter().Settle(context.Background(), res, 0, store.LedgerEntry{})
	if err != nil && !errors.Is(err, store.ErrUnavailable) && !errors.Is(err, store.ErrNotFound) { // the store logs ErrUnavailable, once per burst
		h.logger.Error("release reservation", zap.String("request_id", c.requestID), zap.Error(err))
	}
}

// meterWriter watches the backend's response on its way to the caller: it
// takes the X-<Brand>-Units header out, settles the call durably before the
// status line goes out (or, for byte and time measured products, once the
// body is done), and adds the allowance headers.
type meterWriter struct {
	w   http.ResponseWriter
	r   *http.Request
	h   *Handler
	c   *call
	res store.Reservation
	// forwarded is when the call went to the backend: a PER_TIME_UNIT
	// call's seconds count from here, not from c.started, which is
	// before the caller's body was read (a slow uplink's seconds were
	// charged though the backend sees nothing of a body until it is all
	// read) and the units reserved.
	forwarded time.Time

	wroteHeader bool
	status      int
	written     int64
	// tunneled counts what the proxy wrote to the caller's connection
	// after a protocol switch (101): it writes to the hijacked connection,
	// not through Write, from goroutines of its own (Hijack).
	tunneled    atomic.Int64
	writeFailed bool // a write to the caller failed (delivered.go)
	// held keeps the caller's socket open for a PER_BYTE call on a server
	// without platform_delivery, until the call is settled (delivered.go).
	held     heldSocket
	deferred bool // settle after the body: PER_BYTE, PER_TIME_UNIT
	// wrap is the wrapped answer's writer (sync_response wrapped), nil for
	// raw. While it buffers (atEnd), the caller gets nothing before the
	// call ends, so the call is settled then, endUnits or the measured
	// units, and only if the wrapped answer goes out.
	wrap     *wrappedWriter
	atEnd    bool
	endUnits billing.Units
	settled  bool
	failed   bool // settling failed: the backend's answer is withheld
	// tunnelConn is the caller's connection after a protocol switch.
	tunnelConn *countedConn
	// brandTrailers are the X-<Brand>-* trailer names the backend declared.
	brandTrailers []string
	// callerGone: the caller's request was cancelled before any status
	// line (the reverse proxy's 499); nothing reached it.
	callerGone bool
	// ceiling is the most the call's caller could be charged when it was
	// admitted, in whole units: bytes for PER_BYTE, seconds for
	// PER_TIME_UNIT (streamcap.go). capped: a PER_BYTE answer delivers at
	// most ceiling bytes.
	capped    bool
	ceiling   int64
	cutLogged atomic.Bool
	// stopAt cancels the proxied request of a PER_TIME_UNIT call: its
	// stream is cut at the ceiling (streamcap.go); nil for other calls.
	stopAt   func()
	capTimer *time.Timer
}

func (m *meterWriter) Header() http.Header { return m.w.Header() }

// Unwrap lets http.ResponseController reach Flush and the connection's
// deadlines (streaming).
func (m *meterWriter) Unwrap() http.ResponseWriter { return m.w }

// Hijack hands the proxy the caller's connection for a protocol switch
// (a 101: WebSocket), with what it writes to the caller counted: after
// the switch the proxy copies the backend's bytes to the connection
// itself, past Write, and a PER_BYTE call measured only what went
// through Write was settled at 0 units, its tunnel free. The status line
// and headers net/http buffered are sent first, uncounted, as a
// response's headers are.
//
// A call whose settlement failed at the 101 was answered 500 (settleNow,
// WriteHeader): the proxy still hijacked the connection after it, and
// the tunnel went through uncharged. There is no tunnel after a withheld
// answer.
func (m *meterWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if m.failed {
		return nil, nil, errWithheld
	}
	conn, brw, err := http.NewResponseController(m.w).Hijack()
	if err != nil {
		return conn, brw, err
	}
	cc := &countedConn{Conn: conn, n: &m.tunneled, m: m}
	if m.capped {
		cc.limit = max(m.ceiling-m.written, 0)
		cc.capped = true
	}
	if err := brw.Writer.Flush(); err != nil {
		cc.failed.Store(true)
	}
	m.tunnelConn = cc
	return cc, bufio.NewReadWriter(brw.Reader, bufio.NewWriterSize(cc, 1)), nil
}

// errWithheld refuses the proxy the caller's connection when the call
// could not be metered and its answer was withheld.
var errWithheld = errors.New("the call could not be metered: no protocol switch")

// countedConn is the caller's connection after a protocol switch,
// counting the bytes written to it.
type countedConn struct {
	net.Conn
	n      *atomic.Int64
	failed atomic.Bool
	// capped: the tunnel carries at most limit bytes to the caller
	// (streamcap.go); m is the call's writer, told once it is cut.
	capped bool
	limit  int64
	m      *meterWriter
	cut    atomic.Bool
}

func (c *countedConn) Write(b []byte) (int, error) {
	if c.capped && int64(len(b)) > c.limit-c.n.Load() {
		return c.cutAtCeiling(b)
	}
	n, err := c.Conn.Write(b)
	c.n.Add(int64(n))
	if err != nil {
		c.failed.Store(true)
	}
	return n, err
}

func (m *meterWriter) WriteHeader(status int) {
	if m.wroteHeader {
		return
	}
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		m.writeInformational(status)
		return
	}
	if callerHungUp(status, m.r) {
		// No status line from the backend: invokeSync releases the hold.
		m.callerGone = true
		return
	}
	m.wroteHeader, m.status = true, status
	hdr := m.w.Header()
	// One request id, the gateway's: the proxy adds the backend's headers
	// to those set already, and a backend that echoes the id it was sent
	// (or sends one of its own) gave the caller two.
	hdr[m.h.requestIDKey] = m.c.idValue[:]
	// The name is canonical already (platform.NewHeaders): the map is
	// read and changed directly, as Get and Del would.
	unitsName := m.h.hd.Units
	// Two lines are one header of both values joined (RFC 9110 5.3), as a
	// proxy in between may write them: not a decimal, so ignored like any
	// malformed value. Taking the first charged 5 of "5" and "100" while
	// "5, 100" charged the call's cost.
	units0 := strings.Join(hdr[unitsName], ", ")
	claimed, claimedOK := m.claimedUnits(units0)
	delete(hdr, unitsName)
	m.dropBrandTrailerNames(hdr)
	m.c.allowance.write(hdr)
	if status >= 500 {
		m.h.release(m.c, m.res)
		m.settled = true
		m.h.rt.CountKnownInvoke(m.c.svc.ID, m.c.ep.ID, "sync", "backend_error")
		m.w.WriteHeader(status)
		return
	}
	// A service owner has no measurement: each of its calls is one call at
	// the endpoint's cost, as its jobs are, a protocol switch too (settled
	// at the 101, as a PER_REQUEST subscriber's). Left to be measured when
	// the tunnel closed, its row recorded the tunnel's bytes as units.
	units := m.c.ep.UnitCost()
	if claimedOK {
		units = claimed
	} else if p := m.c.product; p != nil && (p.MeasurementType == billing.PerByte || p.MeasurementType == billing.PerTimeUnit) {
		m.deferred = true
		if p.MeasurementType == billing.PerByte {
			m.holdCallerConn()
			// The meter counts the bytes written here; an `encode`
			// handler in front (Caddy orders it before platform_gateway)
			// compresses them after, and the caller was charged bytes it
			// never received. With encode in front, no-transform (which
			// encode honours) keeps the body as counted; without it the
			// answer is left as it is.
			if behindEncoder(m.w) && !httpHasValue(hdr, "Content-Encoding") {
				hdr.Add("Cache-Control", "no-transform")
			}
		}
	}
	if m.wrap.buffers(status, hdr) {
		// Nothing goes to the caller before the call ends: settle then,
		// once the wrapped answer is known to go out.
		m.atEnd, m.endUnits = true, units
		m.w.WriteHeader(status)
		return
	}
	if m.deferred && m.c.product != nil && m.c.product.MeasurementType == billing.PerByte {
		m.setByteCeiling()
	} else if m.deferred && m.stopAt != nil {
		m.setTimeCeiling()
	}
	if !m.deferred {
		if !m.settleNow(units) {
			m.failed = true
			m.c.allowance = allowance{}
			hdr.Del("Content-Length")
			hdr.Del("Content-Type")
			hdr.Del("Content-Encoding")
			m.h.refuse(m.w, m.r, m.c.requestID,
				apierror.New(apierror.InternalError, "the call could not be metered; it was not charged"))
			return
		}
	}
	m.w.WriteHeader(status)
}

// writeInformational sends a 1xx response (e.g. 103 Early Hints) without
// any X-<Brand>-* header. net/http writes the header map as it is for a
// 1xx, and the reverse proxy puts the backend's 1xx headers into that map
// just before: an X-<Brand>-Units (or any header of ours) a backend sent
// on a 103 reached the caller, where only the final response was cleaned.
// They are put back afterwards: the map is also the final response's
// (the proxy then replaces it with its own headers, and the final
// WriteHeader cleans what is left).
func (m *meterWriter) writeInformational(status int) {
	hdr := m.w.Header()
	prefix := m.h.rt.Headers.Prefix
	var removed http.Header
	for name, v := range hdr {
		if hasBrandPrefix(name, prefix) {
			if removed == nil {
				removed = http.Header{}
			}
			removed[name] = v
			delete(hdr, name)
		}
	}
	m.w.WriteHeader(status)
	maps.Copy(hdr, removed)
}

func (m *meterWriter) Write(b []byte) (int, error) {
	if m.callerGone {
		// Nothing reaches a caller that left: a body the backend sent
		// with a 499 of its own as the caller went does not make the call
		// a 200.
		return len(b), nil
	}
	if !m.wroteHeader {
		m.WriteHeader(http.StatusOK)
	}
	if m.failed {
		return len(b), nil
	}
	if m.capped && int64(len(b)) > m.ceiling-m.written {
		return m.cutAtCeiling(b)
	}
	n, err := m.w.Write(b)
	m.written += int64(n)
	if err != nil {
		m.writeFailed = true
	}
	return n, err
}

// ReadFrom keeps byte counting when the proxy copies with io.Copy.
func (m *meterWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{m}, r)
}

type writerOnly struct{ io.Writer }

func (m *meterWriter) claimedUnits(v string) (billing.Units, bool) {
	if v == "" {
		return 0, false
	}
	u, err := billing.ParseUnits(v)
	if err != nil {
		m.h.logger.Warn("ignoring malformed units header from backend",
			zap.String("service", m.c.svc.ID), zap.String("request_id", m.c.requestID))
		return 0, false
	}
	return u, true
}

// deferredUnits measures a finished response: bytes for PER_BYTE (those
// that reached the caller, delivered.go), whole seconds (rounded up) from
// the call's forwarding for PER_TIME_UNIT.
func (m *meterWriter) deferredUnits() billing.Units {
	if p := m.c.product; p != nil && p.MeasurementType == billing.PerTimeUnit {
		return billing.Whole(billing.CeilSeconds(m.h.rt.Now().Sub(m.forwarded)))
	}
	return billing.Whole(m.deliveredBytes())
}

// settleNow charges units durably; false when the store failed.
func (m *meterWriter) settleNow(units billing.Units) bool {
	m.settled = true
	c := m.c
	entry := store.LedgerEntry{
		Time:       m.h.rt.Now(),
		UserID:     c.account.UserID,
		ServiceID:  c.svc.ID,
		EndpointID: c.ep.ID,
		RequestID:  c.requestID,
		Source:     store.SourceGateway,
	}
	if c.product != nil {
		entry.ProductID = c.product.ID
	}
	if units > 0 {
		m.h.rt.NoteCharge(c.account, c.ep, units) // the caller's next calls hold what this one used
	}
	e, err := m.h.rt.Meter().Settle(context.Background(), m.res, units, entry)
	if errors.Is(err, store.ErrSettlementPending) {
		// Not confirmed in time, but kept by the store and written once
		// it answers, each call once by its id (a fleet node's database
		// down): the call is charged, so its answer is delivered. Withheld,
		// the caller paid for an answer it never got.
		m.h.rt.CountKnownInvoke(c.svc.ID, c.ep.ID, "sync", "ok")
		m.h.rt.CountUnits(c.svc.ID, store.SourceGateway, int64(units))
		return true
	}
	if err != nil {
		if errors.Is(err, store.ErrUnavailable) && m.deferred {
			// The body is delivered: the store charges it once it writes
			// again (it logs its failures, once per burst).
			return false
		}
		if !errors.Is(err, store.ErrUnavailable) {
			m.h.logger.Error("settle", zap.String("request_id", c.requestID), zap.Error(err))
		}
		m.h.release(c, m.res)
		return false
	}
	m.h.rt.CountKnownInvoke(c.svc.ID, c.ep.ID, "sync", "ok")
	m.h.rt.CountUnits(c.svc.ID, store.SourceGateway, int64(e.Units))
	return true
}

// dropBrandTrailerNames takes X-<Brand>-* names out of the Trailer
// declaration the reverse proxy copies from the backend's response,
// remembering them for dropBrandTrailers. Units stated in a trailer are
// not read (the call counts its cost, docs/wire-contract.md); like the
// X-<Brand>-Units header, they never reach the caller.
func (m *meterWriter) dropBrandTrailerNames(hdr http.Header) {
	decl := hdr["Trailer"]
	if len(decl) == 0 {
		return
	}
	prefix := m.h.rt.Headers.Prefix
	var keep []string
	for _, v := range decl {
		for _, name := range strings.Split(v, ",") {
			name = strings.TrimSpace(name)
			if name == "" {
				continue
			}
			if hasBrandPrefix(name, prefix) {
				m.brandTrailers = append(m.brandTrailers, http.CanonicalHeaderKey(name))
				continue
			}
			keep = append(keep, name)
		}
	}
	if len(keep) == 0 {
		delete(hdr, "Trailer")
	} else {
		hdr["Trailer"] = []string{strings.Join(keep, ", ")}
	}
}

// dropBrandTrailers deletes the values of X-<Brand>-* trailers the proxy
// put into the header map after the body (declared ones, and undeclared
// ones under http.TrailerPrefix), so that a caller never sees them, as it
// never sees the X-<Brand>-Units header. It runs once the proxy is done,
// before net/http writes the trailers.
func (m *meterWriter) dropBrandTrailers() {
	if len(m.brandTrailers) == 0 && !m.c.fwd.hadTrailers() {
		return // the usual answer: no trailers, nothing to scan
	}
	hdr := m.w.Header()
	for _, name := range m.brandTrailers {
		if name == m.h.requestIDKey {
			// The gateway's own header: one value, the gateway's (a
			// wrapped answer writes the header map after this).
			hdr[name] = m.c.idValue[:]
			continue
		}
		delete(hdr, name)
	}
	prefix := m.h.rt.Headers.Prefix
	for name := range hdr {
		if t, ok := strings.CutPrefix(name, http.TrailerPrefix); ok && hasBrandPrefix(t, prefix) {
			delete(hdr, name)
		}
	}
}

func httpHasValue(h http.Header, key string) bool {
	for _, v := range h[key] {
		if v != "" {
			return true
		}
	}
	return false
}

// encodePkg is the package of Caddy's encode handler, whose response
// writer compresses what passes through it.
const encodePkg = "github.com/caddyserver/caddy/v2/modules/caddyhttp/encode"

// behindEncoder reports whether w, or a writer it wraps, is Caddy's
// encode handler's: what is written to w then reaches the caller
// compressed.
func behindEncoder(w http.ResponseWriter) bool {
	for range 16 {
		t := reflect.TypeOf(w)
		if t == nil {
			return false
		}
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.PkgPath() == encodePkg {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
	return false
}
