package platformgw_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// rawConn is one keep-alive HTTP/1.1 connection that writes prepared
// request bytes and reads just enough of the answer to find its end, so
// that the client adds almost no allocations of its own to the chain
// benchmark's count (net/http's client makes dozens a call).
type rawConn struct {
	tb   testing.TB
	c    net.Conn
	br   *bufio.Reader
	body []byte
}

func dialRaw(tb testing.TB, addr string) *rawConn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	return &rawConn{tb: tb, c: c, br: bufio.NewReaderSize(c, 16<<10), body: make([]byte, 0, 4<<10)}
}

func (r *rawConn) close() { r.c.Close() }

var (
	crlf          = []byte("\r\n")
	contentLength = []byte("content-length:")
	chunked       = []byte("transfer-encoding: chunked")
)

// do sends req and returns the status and the body (valid until the next
// call). A broken answer fails the test or benchmark from any goroutine
// by returning status 0.
func (r *rawConn) do(req []byte) (int, []byte) {
	r.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := r.c.Write(req); err != nil {
		r.tb.Error(err)
		return 0, nil
	}
	line, err := r.br.ReadSlice('\n')
	if err != nil || len(line) < 12 {
		r.tb.Errorf("status line %q: %v", line, err)
		return 0, nil
	}
	status := int(line[9]-'0')*100 + int(line[10]-'0')*10 + int(line[11]-'0')
	length, isChunked := -1, false
	for {
		line, err = r.br.ReadSlice('\n')
		if err != nil {
			r.tb.Error(err)
			return 0, nil
		}
		if bytes.Equal(line, crlf) {
			break
		}
		if len(line) > len(contentLength) && asciiHasPrefixFold(line, contentLength) {
			length = atoiTrim(line[len(contentLength):])
		} else if asciiHasPrefixFold(line, chunked) {
			isChunked = true
		}
	}
	r.body = r.body[:0]
	switch {
	case isChunked:
		for {
			line, err = r.br.ReadSlice('\n')
			if err != nil {
				r.tb.Error(err)
				return 0, nil
			}
			n, perr := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
			if perr != nil {
				r.tb.Errorf("chunk size %q", line)
				return 0, nil
			}
			if n == 0 {
				// No trailers are expected: the final CRLF.
				if _, err := r.br.Discard(2); err != nil {
					r.tb.Error(err)
					return 0, nil
				}
				break
			}
			if err := r.readBody(int(n) + 2); err != nil {
				r.tb.Error(err)
				return 0, nil
			}
			r.body = r.body[:len(r.body)-2]
		}
	case length >= 0:
		if err := r.readBody(length); err != nil {
			r.tb.Error(err)
			return 0, nil
		}
	default:
		r.tb.Errorf("status %d: an answer without Content-Length or chunked encoding", status)
		return 0, nil
	}
	return status, r.body
}

func (r *rawConn) readBody(n int) error {
	start := len(r.body)
	if cap(r.body)-start < n {
		r.body = append(r.body, make([]byte, n)...)
	} else {
		r.body = r.body[:start+n]
	}
	_, err := io.ReadFull(r.br, r.body[start:])
	return err
}

func asciiHasPrefixFold(s, prefix []byte) bool {
	return len(s) >= len(prefix) && bytes.EqualFold(s[:len(prefix)], prefix)
}

func atoiTrim(b []byte) int {
	n, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil {
		return -1
	}
	return n
}
