package platformgw

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/wire"
)

// wrappedWriter gives a sync invoke the answer of the upstream platform's
// default mode (sync_response wrapped, docs/wire-contract.md): a 2xx
// backend response becomes 200 and a JSON result object holding the body
// as a string; any other status becomes a service_error naming the
// backend's status, with the start of its body.
//
// It sits behind the meterWriter (proxy → meterWriter → wrappedWriter →
// caller), so the metering is that of a raw answer: the meter reads the
// backend's status, headers and bytes. The body is buffered up to the
// invoke body limit; the caller's answer is written by finish, after the
// proxy is done and the meter has settled.
type wrappedWriter struct {
	w     http.ResponseWriter
	h     *Handler
	c     *call
	limit int64

	wroteHeader bool
	status      int
	raw         bool // a stream after all: passed through as it comes
	body        bytes.Buffer
	size        int64 // the backend's body bytes, also past the limit
}

// serviceErrorSnippet is how much of a backend's error body the caller's
// service_error message quotes.
const serviceErrorSnippet = 512

// syncOutput returns the writer the meter writes a sync answer to: w
// itself (raw), or a wrappedWriter when the endpoint wraps sync responses.
// Protocol upgrades and callers asking for an event stream always get the
// raw stream. The caller's Accept-Encoding is not forwarded when wrapping:
// the result is text, not a compressed body.
func (h *Handler) syncOutput(w http.ResponseWriter, r *http.Request, c *call) (http.ResponseWriter, *wrappedWriter) {
	if !c.ep.WrapsSyncResponse() || r.Header.Get("Upgrade") != "" || acceptsEventStream(r.Header) {
		return w, nil
	}
	r.Header.Del("Accept-Encoding")
	ww := &wrappedWriter{w: w, h: h, c: c, limit: h.rt.Limits.MaxBodyBytes}
	return ww, ww
}

// acceptsEventStream reports whether the caller asks for server-sent
// events (Accept: text/event-stream, in any of its Accept headers).
func acceptsEventStream(h http.Header) bool {
	for _, v := range h.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			mt, _, _ := strings.Cut(part, ";")
			if strings.EqualFold(strings.TrimSpace(mt), "text/event-stream") {
				return true
			}
		}
	}
	return false
}

// Header is the caller's header map: the meter's allowance headers and the
// request id land where a raw answer has them.
func (ww *wrappedWriter) Header() http.Header { return ww.w.Header() }

// Unwrap lets http.ResponseController reach the connection's deadlines;
// Flush is answered here, so buffering is not undone.
func (ww *wrappedWriter) Unwrap() http.ResponseWriter { return ww.w }

func (ww *wrappedWriter) WriteHeader(status int) {
	if ww.wroteHeader || status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		return // informational answers are not the result
	}
	ww.wroteHeader, ww.status = true, status
	if streams(status, ww.w.Header()) {
		// A backend that streams although the caller did not ask: a
		// buffered stream would never end, so it goes through as is.
		ww.raw = true
		ww.w.WriteHeader(status)
	}
}

// streams reports whether a backend answer goes through raw although the
// endpoint wraps: a protocol switch or an event stream, which a buffer
// would never see the end of.
func streams(status int, h http.Header) bool {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return status == http.StatusSwitchingProtocols || strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// buffers reports whether a final answer with this status and these
// headers will be buffered and wrapped (false for a raw answer, ww nil).
func (ww *wrappedWriter) buffers(status int, h http.Header) bool {
	return ww != nil && !streams(status, h)
}

// delivers reports whether the caller gets the answer the backend gave
// (wrapped, or as the service_error of a non-2xx status): false for a 2xx
// answer that cannot be wrapped, because the backend cut it off (proxyErr)
// or it is larger than the buffer. True for a raw answer.
func (ww *wrappedWriter) delivers(proxyErr error) bool {
	if ww == nil || ww.raw || !ww.wroteHeader {
		return true
	}
	ok := ww.status >= 200 && ww.status < 300
	if !ok {
		// A 3xx reaches the caller as a 502 service_error, an error
		// instead of the answer (as a 2xx that cannot be wrapped): not
		// charged. A 4xx is, as raw.
		return ww.status >= 400
	}
	return proxyErr == nil && ww.size <= ww.limit
}

func (ww *wrappedWriter) Write(b []byte) (int, error) {
	if !ww.wroteHeader {
		ww.WriteHeader(http.StatusOK)
	}
	if ww.raw {
		return ww.w.Write(b)
	}
	ww.size += int64(len(b))
	if room := ww.limit - int64(ww.body.Len()); room > 0 {
		ww.body.Write(b[:min(int64(len(b)), room)])
	}
	// Past the limit the rest is read and dropped, not refused, so the
	// meter counts the backend's bytes as it would for a raw answer.
	return len(b), nil
}

// Flush sends nothing while buffering; a raw stream is flushed.
func (ww *wrappedWriter) Flush() {
	if ww.raw {
		http.NewResponseController(ww.w).Flush()
	}
}

// syncResult is the wrapped answer: the upstream ResultResponse, fields in
// its order.
type syncResult struct {
	requestID, contentType, result, completedAt string
	size                                        int64
}

func (s syncResult) appendJSON(b []byte) []byte {
	b = append(b, `{"requestId":`...)
	b = signing.AppendJSString(b, s.requestID)
	b = append(b, `,"status":"COMPLETED","result":`...)
	b = signing.AppendJSString(b, s.result)
	b = append(b, `,"contentType":`...)
	b = signing.AppendJSString(b, s.contentType)
	b = append(b, `,"resultUrl":null,"size":`...)
	b = strconv.AppendInt(b, s.size, 10)
	b = append(b, `,"completedAt":`...)
	b = signing.AppendJSString(b, s.completedAt)
	return append(b, '}')
}

// entityHeaders describe the backend's body, which the caller does not get
// as such.
var entityHeaders = []string{
	"Content-Type", "Content-Length", "Content-Encoding", "Content-Range", "Content-Disposition",
	"Content-Language", "Content-Location", "Content-MD5", "Accept-Ranges", "ETag", "Last-Modified",
}

// finish writes the caller's answer once the proxy and the meter are done.
// withheld: the meter could not record the call's charge, so the answer is
// refused. proxyErr is what the proxy returned.
// A nil wrappedWriter (a raw answer) does nothing.
func (ww *wrappedWriter) finish(withheld bool, proxyErr error) {
	if ww == nil || !ww.wroteHeader || ww.raw {
		return
	}
	hdr := ww.w.Header()
	if withheld {
		// The meter could not record the charge: the answer is withheld,
		// as a raw one would be, and nothing is charged.
		for _, name := range entityHeaders {
			hdr.Del(name)
		}
		ww.write(http.StatusInternalServerError,
			apierror.New(apierror.InternalError, "the call could not be metered; it was not charged"))
		return
	}
	backendType := hdr.Get("Content-Type")
	retry := hdr.Get("Retry-After")
	for _, name := range entityHeaders {
		hdr.Del(name)
	}
	c := ww.c
	ok := ww.status >= 200 && ww.status < 300
	switch {
	case ok && proxyErr != nil:
		ww.refuse(http.StatusBadGateway, "the service response ended early", proxyErr)
	case ok && ww.size > ww.limit:
		ww.refuse(http.StatusBadGateway, "the service response is larger than "+strconv.FormatInt(ww.limit, 10)+
			" bytes, the most a wrapped answer holds; the endpoint needs sync_response raw", nil)
	case ok:
		if backendType == "" {
			backendType = "text/plain"
		}
		body := syncResult{
			requestID:   c.requestID,
			contentType: backendType,
			result:      ww.body.String(),
			size:        ww.size,
			completedAt: ww.h.rt.Now().UTC().Format(wire.TimeMillis),
		}.appendJSON(make([]byte, 0, ww.body.Len()+256))
		hdr.Set("Content-Type", "application/json")
		hdr.Set("Content-Length", strconv.Itoa(len(body)))
		ww.w.WriteHeader(http.StatusOK)
		ww.w.Write(body)
	default:
		status := ww.status
		if status < 400 || status > 599 {
			status = http.StatusBadGateway // a redirect or the like is no answer here
		}
		e := apierror.New(apierror.ServiceError,
			"the service answered HTTP "+strconv.Itoa(ww.status)+snippet(ww.body.Bytes()))
		if s, err := strconv.Atoi(retry); err == nil && s > 0 {
			e.RetryAfter = s
		}
		ww.write(status, e)
	}
}

// refuse answers a 2xx backend response that cannot be wrapped.
func (ww *wrappedWriter) refuse(status int, message string, err error) {
	fields := []zap.Field{zap.String("request_id", ww.c.requestID), zap.String("service", ww.c.svc.ID)}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	ww.h.logger.Warn("sync response not wrapped: "+message, fields...)
	ww.write(status, apierror.New(apierror.ServiceError, message))
}

// write sends e with the given status (a service_error mirrors the
// backend's status, as the upstream platform does).
func (ww *wrappedWriter) write(status int, e *apierror.Error) {
	e.RequestID = ww.c.requestID
	apierror.WriteStatus(ww.w, status, e)
}

// snippet is ": " and the start of a backend's error body (invalid UTF-8
// replaced, cut at a character boundary), or "" for an empty body.
func snippet(b []byte) string {
	s := strings.ToValidUTF8(string(bytes.TrimSpace(b)), "\uFFFD")
	if s == "" {
		return ""
	}
	if len(s) > serviceErrorSnippet {
		cut := serviceErrorSnippet
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return ": " + s
}
