package platformgw

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// sized answers 200 with body, its Content-Length set, written in two
// parts, as the reverse proxy copies a backend's answer.
func sized(body string) *backend {
	return &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Header().Set("X-Platform-Units", "2")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, body[:len(body)/2])
		io.WriteString(w, body[len(body)/2:])
	}}
}

// TestKeptAnswer: a small answer of known length is kept whole, then
// settled and sent: the caller gets the backend's bytes and the allowance
// headers, the call is charged once, no hold is left. Nothing reaches the
// caller before the settlement: the store's failure withholds the answer.
func TestKeptAnswer(t *testing.T) {
	g := newTestGateway(t)
	body := `{"answer":"` + strings.Repeat("x", 3000) + `"}`
	w := g.invoke("alice", "POST", "call", false, sized(body))
	if w.Code != 200 || w.Body.String() != body || w.Header().Get("Content-Length") != strconv.Itoa(len(body)) {
		t.Fatalf("kept answer: %d, %d bytes, %v", w.Code, w.Body.Len(), w.Header())
	}
	if w.Header().Get("X-Platform-Units") != "" || w.Header().Get("X-Platform-Request-ID") == "" {
		t.Errorf("headers: %v", w.Header())
	}
	if got := g.ledger("alice"); len(got) != 1 || got[0] != billing.Whole(2) {
		t.Errorf("charged %v, want 2 units once", got)
	}
	if st := g.state("alice", "basic"); st.Reserved != 0 {
		t.Errorf("holds left: %+v", st)
	}

	g.at = g.at.Add(time.Minute)
	be := &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "19")
		w.WriteHeader(http.StatusOK)
		g.rt.Store().Close() // the store goes away before the answer is whole
		io.WriteString(w, `{"secret":"answer"}`)
	}}
	w = g.invoke("alice", "POST", "call", false, be)
	if w.Code != http.StatusInternalServerError || strings.Contains(w.Body.String(), "answer") {
		t.Errorf("unsettled kept call: %d %s", w.Code, w.Body)
	}
}

// TestKeptAnswerLarge: an answer larger than keptBodyMax, or of unknown
// length, is settled at its status line and streamed as before.
func TestKeptAnswerLarge(t *testing.T) {
	g := newTestGateway(t)
	body := strings.Repeat("y", keptBodyMax+1)
	w := g.invoke("alice", "POST", "call", false, sized(body))
	if w.Code != 200 || w.Body.String() != body {
		t.Fatalf("large answer: %d, %d bytes", w.Code, w.Body.Len())
	}
	if got := g.ledger("alice"); len(got) != 1 || got[0] != billing.Whole(2) {
		t.Errorf("charged %v, want 2 units once", got)
	}
}

// TestKeptAnswerFlushed: a flush (a trailer, flush_interval) ends the
// keeping: the call is settled and what came so far goes out then.
func TestKeptAnswerFlushed(t *testing.T) {
	g := newTestGateway(t)
	var atFlush []billing.Units
	be := &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "01234")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
		atFlush = g.ledger("alice")
		io.WriteString(w, "56789")
	}}
	w := g.invoke("alice", "POST", "call", false, be)
	if w.Code != 200 || w.Body.String() != "0123456789" || !w.Flushed {
		t.Fatalf("flushed answer: %d %q flushed %v", w.Code, w.Body, w.Flushed)
	}
	if len(atFlush) != 1 {
		t.Errorf("at the flush: ledger %v; want the call settled", atFlush)
	}
	if got := g.ledger("alice"); len(got) != 1 {
		t.Errorf("charged %v, want once", got)
	}
}

// TestKeptAnswerCutOff: an answer of a fixed-units product the backend
// cuts off while it is kept (the proxy flushes, then panics with
// http.ErrAbortHandler) is charged and sent as far as it came, and the
// abort goes on: as when the call was settled at its status line.
func TestKeptAnswerCutOff(t *testing.T) {
	g := newTestGateway(t)
	be := &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "0123456789")
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}}
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("recovered %v, want the abort to go on", v)
			}
		}()
		g.invoke("alice", "POST", "call", false, be)
	}()
	if got := g.ledger("alice"); len(got) != 1 || got[0] != billing.Whole(1) {
		t.Errorf("charged %v, want the call's 1 unit", got)
	}
	if st := g.state("alice", "basic"); st.Reserved != 0 {
		t.Errorf("holds left: %+v", st)
	}
}
