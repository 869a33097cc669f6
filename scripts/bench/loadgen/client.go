package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// conn is one keep-alive HTTP/1.1 connection that sends the same request
// over and over. net/http's client cost about 80 µs of CPU per request
// here, a sizeable share of a 2-core machine that also runs the server
// under test; this one writes prepared bytes and reads just enough of the
// answer to find its end.
type conn struct {
	addr string
	req  []byte

	c  net.Conn
	br *bufio.Reader
}

// buildRequest renders the request once.
func buildRequest(method string, u *url.URL, body string, hdr http.Header) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, u.RequestURI(), u.Host)
	hdr.Write(&b)
	if body != "" || method == http.MethodPost || method == http.MethodPut {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	return b.Bytes()
}

func (c *conn) close() {
	if c.c != nil {
		c.c.Close()
		c.c = nil
	}
}

// roundTrip sends the request and reads the whole answer; ok is a 2xx.
// A broken connection is dialled again on the next call.
func (c *conn) roundTrip() bool {
	if c.c == nil {
		nc, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
		if err != nil {
			return false
		}
		c.c, c.br = nc, bufio.NewReaderSize(nc, 16<<10)
	}
	c.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.c.Write(c.req); err != nil {
		c.close()
		return false
	}
	status, keep, err := c.readResponse()
	if err != nil || !keep {
		c.close()
	}
	return err == nil && status >= 200 && status < 300
}

var errMalformed = errors.New("malformed response")

func (c *conn) readResponse() (status int, keepAlive bool, err error) {
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	// HTTP/1.1 200 OK
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, errMalformed
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, errMalformed
	}
	length, chunked := -1, false
	keepAlive = true
	for {
		line, err = c.br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		if len(line) <= 2 { // the blank line after the headers
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, errMalformed
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return 0, false, errMalformed
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			keepAlive = !bytes.EqualFold(value, []byte("close"))
		}
	}
	switch {
	case chunked:
		err = c.skipChunked()
	case length >= 0:
		_, err = c.br.Discard(length)
	default: // the body runs to the end of the connection
		_, err = io.Copy(io.Discard, c.br)
		keepAlive = false
	}
	return status, keepAlive, err
}

func (c *conn) skipChunked() error {
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		size, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.SplitN(line, []byte(";"), 2)[0])), 16, 64)
		if err != nil {
			return errMalformed
		}
		if size == 0 { // trailers, then a blank line
			for {
				line, err = c.br.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(line) <= 2 {
					return nil
				}
			}
		}
		if _, err := c.br.Discard(int(size) + 2); err != nil {
			return err
		}
	}
}
