package platformgw

import (
	"net/http"
	"strconv"
	"sync"
)

// A sync call is settled, durably, before its status line goes out. With
// `durability sync` that is a wait for the settlement log's fdatasync, and
// if the call waited at the status line, as the reverse proxy writes it,
// the backend's answer would wait with it, unread: the proxy's connection
// to the backend stays taken and its goroutines park and wake once more
// per call (docs/performance.md, "Where the time goes"). A small answer of
// known length is therefore kept whole in memory first, the backend's
// connection goes back to the pool, and then the call settles and the
// answer goes out: the caller gets the same bytes at the same point
// (after the settlement), and nothing reaches the caller before it.
//
// Keeping stops (stopHolding: settle, then send what was kept) at the
// first of: the end of the call, a flush (a trailer, flush_interval, the
// proxy's flush before it aborts a cut-off answer), or more bytes than
// keptBodyMax. So an answer cut off by the backend is charged and sent as
// far as it came, then aborted, as when the status line was settled.

// keptBodyMax is the largest answer kept whole before settling.
const keptBodyMax = 16 << 10

// holdable says whether an answer with these headers is kept whole before
// it settles: a Content-Length of at most keptBodyMax.
func holdable(hdr http.Header) bool {
	v := hdr["Content-Length"]
	if len(v) != 1 {
		return false
	}
	n, err := strconv.ParseInt(v[0], 10, 64)
	return err == nil && n >= 0 && n <= keptBodyMax
}

var keptBodies = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// getKeptBody returns an empty buffer for a kept answer; putKeptBody
// gives it back once the answer went out.
func getKeptBody() *[]byte {
	b := keptBodies.Get().(*[]byte)
	*b = (*b)[:0]
	return b
}

func putKeptBody(b *[]byte) {
	if cap(*b) <= keptBodyMax {
		keptBodies.Put(b)
	}
}

// stopHolding settles the kept answer and sends it: its status line and
// what was kept of its body. false: the settlement failed, and the caller
// got an error instead (nothing charged).
func (m *meterWriter) stopHolding() bool {
	m.holding = false
	kept := m.kept
	m.kept = nil
	defer putKeptBody(kept)
	body := *kept
	if !m.settleNow(m.endUnits) {
		m.refuseUnmetered()
		return false
	}
	m.w.WriteHeader(m.status)
	if len(body) > 0 {
		n, err := m.w.Write(body)
		m.written += int64(n)
		if err != nil {
			m.writeFailed = true
		}
	}
	return true
}

// FlushError flushes the answer to the caller; a kept one is settled and
// sent first. http.ResponseController finds it before Unwrap.
func (m *meterWriter) FlushError() error {
	if m.holding && !m.stopHolding() {
		return nil
	}
	return http.NewResponseController(m.w).Flush()
}
