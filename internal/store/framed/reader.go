package framed

import (
	"encoding/binary"
	"io"
)

// Reader reads a file's records in order, from the end of its header, and
// stops at the end of the file or at the first record that does not read.
type Reader struct {
	path string
	f    Format
	data []byte    // the whole file (NewBytes); nil: read from r
	r    io.Reader // the file from off on (New)
	off  int64     // the next frame; the end of the whole records read
	size int64
	last int64  // the frame of the record Next returned last
	hdr  []byte // New: the frame header (on the heap: a Reader of NewBytes stays off it)
	buf  []byte // New: the payload, reused
	err  error
}

// NewBytes reads the records of data, a whole file, from off (the end of
// its header). The payloads Next returns are parts of data: no copy.
func NewBytes(path string, data []byte, off int64, f Format) *Reader {
	return &Reader{path: path, f: f, data: data, off: off, size: int64(len(data))}
}

// New reads the records of a file of size bytes (or its first size bytes)
// from r, which is at off (the end of its header). The payload Next
// returns is valid until the next call.
func New(path string, r io.Reader, off, size int64, f Format) *Reader {
	return &Reader{path: path, f: f, r: r, off: off, size: size, hdr: make([]byte, HeaderSize)}
}

// Next returns the next record's payload, or false at the end of the file
// or at a record that does not read (then Err says what is wrong).
func (r *Reader) Next() ([]byte, bool) {
	if r.err != nil || r.off >= r.size {
		return nil, false
	}
	left := r.size - r.off
	var hdr []byte
	if r.data != nil {
		hdr = r.data[r.off : r.off+min(left, HeaderSize)]
	} else if hdr = r.hdr[:min(left, HeaderSize)]; !r.readFull(hdr) {
		return nil, false
	}
	if left < HeaderSize {
		return r.fail(ShortHeader, 0, hdr, nil)
	}
	n := int64(binary.LittleEndian.Uint32(hdr))
	if n == 0 || n > r.f.max() {
		return r.fail(BadLength, n, hdr, nil)
	}
	if n > left-HeaderSize {
		return r.fail(Truncated, n, hdr, nil)
	}
	var payload []byte
	if r.data != nil {
		payload = r.data[r.off+HeaderSize : r.off+HeaderSize+n]
	} else {
		if int64(cap(r.buf)) < n {
			r.buf = make([]byte, n)
		}
		if payload = r.buf[:n]; !r.readFull(payload) {
			return nil, false
		}
	}
	if Checksum(payload) != binary.LittleEndian.Uint32(hdr[4:]) {
		return r.fail(BadChecksum, n, hdr, payload)
	}
	r.last = r.off
	r.off += HeaderSize + n
	return payload, true
}

func (r *Reader) readFull(b []byte) bool {
	if _, err := io.ReadFull(r.r, b); err != nil {
		r.err = err
		return false
	}
	return true
}

// fail stops the reader at the bad record at r.off, of which it read
// seen, and decides whether it is a torn tail (the package comment).
func (r *Reader) fail(fault Fault, n int64, seen ...[]byte) ([]byte, bool) {
	zeros, ok := r.zerosToEnd(seen)
	if !ok {
		return nil, false
	}
	e := &Error{Path: r.path, Offset: r.off, Size: r.size, Fault: fault, Length: n, Noun: r.f.Noun}
	switch {
	case zeros:
		e.Fault, e.Length, e.Torn = Zeros, 0, true
	case fault == ShortHeader, fault == Truncated:
		e.Torn = true // nothing whole can follow
	case fault == BadChecksum:
		e.Torn = r.off+HeaderSize+n == r.size // the last record
	}
	r.err = e
	return nil, false
}

// zerosToEnd says whether the file holds only zeros from r.off to the end:
// seen, which this frame read already, then the rest.
func (r *Reader) zerosToEnd(seen [][]byte) (bool, bool) {
	if r.data != nil {
		return allZero(r.data[r.off:]), true
	}
	rest := r.size - r.off
	zeros := true
	for _, b := range seen {
		zeros = zeros && allZero(b)
		rest -= int64(len(b))
	}
	var buf [32 << 10]byte
	for zeros && rest > 0 {
		b := buf[:min(rest, int64(len(buf)))]
		if !r.readFull(b) {
			return false, false
		}
		zeros = allZero(b)
		rest -= int64(len(b))
	}
	return zeros, true
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Offset is the offset of the frame of the record Next returned last.
func (r *Reader) Offset() int64 { return r.last }

// End is the offset past the last whole record read: where the file ends
// when Next returned false with no error, where a bad record starts when
// it returned false with one.
func (r *Reader) End() int64 { return r.off }

// Err is nil when Next stopped at the end of the file, an *Error when it
// stopped at a record that does not read, and the read's error when
// reading failed.
func (r *Reader) Err() error { return r.err }
