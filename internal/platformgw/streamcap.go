package platformgw

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
)

// A PER_BYTE call is charged, when it ends, the bytes it delivered, as far
// as the caller's hard limits (a quota with overage blocked, a prepaid
// balance, a spending cap) allow; the rest is recorded as uncharged. A
// stream that never ends (server-sent events, a long chunked body, a
// WebSocket tunnel) delivered without bound past a balance of one credit,
// all of it free. Such a call is cut at its ceiling instead: the most its
// caller could be charged when it was admitted (billing.Ceiling, its hold
// included). The bytes up to the ceiling go out, then the write fails, the
// reverse proxy aborts the answer (the caller sees a body cut off, as when
// a backend cuts off), and the call is settled at what it delivered, its
// outcome cut_off (docs/wire-contract.md, "Streams cut at a hard limit").
// A PER_TIME_UNIT stream is cut by time the same way: its proxied request
// is cancelled just before its seconds pass the ceiling. Nothing is
// computed for any other call.

// errCutAtCeiling ends a PER_BYTE answer or tunnel that reached the most
// its caller can be charged.
var errCutAtCeiling = errors.New("the answer reached the most its caller can be charged")

// setByteCeiling bounds the bytes a PER_BYTE answer delivers by the most
// the call can be charged, from the state its hold was taken in. A service
// owner's call (free) and a product without a hard limit that binds are
// not bounded.
func (m *meterWriter) setByteCeiling() {
	if whole, ok := m.wholeCeiling(); ok {
		m.capped, m.ceiling = true, whole
	}
}

// wholeCeiling is the most the call can be charged (billing.Ceiling), in
// whole units: a byte or a second is one unit, and a fraction of a unit
// left buys none. A service owner's call (free), a call that holds
// nothing and a product without a hard limit that binds have none.
func (m *meterWriter) wholeCeiling() (int64, bool) {
	if m.c.account.Free || m.res.ID == "" {
		return 0, false
	}
	ceiling, ok := billing.Ceiling(m.c.account.Product, m.res.State, m.res.Decision)
	return int64(ceiling / billing.Scale), ok
}

// cutAtCeiling writes what of b still fits under the ceiling and fails the
// write: the proxy stops copying and aborts the answer.
func (m *meterWriter) cutAtCeiling(b []byte) (int, error) {
	var n int
	if room := m.ceiling - m.written; room > 0 {
		var err error
		n, err = m.w.Write(b[:room])
		m.written += int64(n)
		if err != nil {
			m.writeFailed = true
			return n, err
		}
	}
	m.logCut()
	return n, errCutAtCeiling
}

// cutAtCeiling writes what of b still fits under the tunnel's ceiling and
// fails the write: the proxy ends the tunnel. One goroutine copies the
// backend's bytes to the caller, so the room read is the room written.
func (c *countedConn) cutAtCeiling(b []byte) (int, error) {
	var n int
	if room := c.limit - c.n.Load(); room > 0 {
		var err error
		n, err = c.Conn.Write(b[:room])
		c.n.Add(int64(n))
		if err != nil {
			c.failed.Store(true)
			return n, err
		}
	}
	if c.cut.CompareAndSwap(false, true) {
		c.m.logCut()
	}
	return n, errCutAtCeiling
}

// logCut says once, for the operator, that a call was cut at its ceiling
// (nothing secret: the ids and the ceiling).
func (m *meterWriter) logCut() {
	if m.cutLogged.Swap(true) {
		return
	}
	m.h.logger.Warn("stream cut at the caller's hard limit",
		zap.String("request_id", m.c.requestID), zap.String("service", m.c.svc.ID),
		zap.String("endpoint", m.c.ep.ID), zap.Int64("ceiling", m.ceiling))
}

// timeCutMargin is how long before its ceiling a PER_TIME_UNIT stream is
// cut: it is charged its seconds rounded up at its end, which comes after
// the cut has unwound the proxy.
const timeCutMargin = 250 * time.Millisecond

// withCeilingCancel gives a PER_TIME_UNIT call's request a context the
// gateway can cancel, which cuts the stream the proxy is copying; the
// function returned cancels it (and is called when the call ends).
func withCeilingCancel(r *http.Request) (*http.Request, func()) {
	ctx, cancel := context.WithCancel(r.Context())
	return r.WithContext(ctx), cancel
}

// setTimeCeiling cuts a PER_TIME_UNIT stream before the seconds from the
// call's forwarding pass the most its caller can be charged (each second is a
// whole unit). The timer is stopped when the call ends (end).
func (m *meterWriter) setTimeCeiling() {
	secs, ok := m.wholeCeiling()
	if !ok {
		return
	}
	m.ceiling = secs
	// Its seconds count from its forwarding (deferredUnits).
	at := m.forwarded.Add(time.Duration(secs)*time.Second - timeCutMargin)
	stop := m.stopAt
	m.capTimer = time.AfterFunc(max(at.Sub(m.h.rt.Now()), 0), func() {
		m.logCut()
		stop()
	})
}
