package framed

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const fileHeader = "HEADER!!" // a user's own file header, 8 bytes

var format = Format{Noun: "record", Max: 1000}

// records are the payloads of the test file: the last one long enough to
// be torn at many offsets.
var records = [][]byte{[]byte("first"), {0}, bytes.Repeat([]byte("x"), 300), []byte("the last record")}

// file is the test file and the offsets of its records' frames.
func file() ([]byte, []int64) {
	b := []byte(fileHeader)
	var offs []int64
	for _, r := range records {
		offs = append(offs, int64(len(b)))
		b = Append(b, r)
	}
	return b, offs
}

// read reads data with a Reader of each kind and checks that both agree.
func read(t *testing.T, path string, data []byte) (recs [][]byte, end int64, err error) {
	t.Helper()
	type result struct {
		recs [][]byte
		offs []int64
		end  int64
		err  error
		what string
	}
	run := func(r *Reader) result {
		var res result
		for {
			p, ok := r.Next()
			if !ok {
				break
			}
			res.recs = append(res.recs, bytes.Clone(p))
			res.offs = append(res.offs, r.Offset())
		}
		res.end, res.err = r.End(), r.Err()
		if e, ok := res.err.(*Error); ok {
			res.what = fmt.Sprintf("%+v", *e)
		}
		return res
	}
	a := run(NewBytes(path, data, int64(len(fileHeader)), format))
	br := bufio.NewReaderSize(bytes.NewReader(data[len(fileHeader):]), 16)
	b := run(New(path, br, int64(len(fileHeader)), int64(len(data)), format))
	if fmt.Sprint(a.recs, a.offs, a.end, a.what) != fmt.Sprint(b.recs, b.offs, b.end, b.what) || (a.err == nil) != (b.err == nil) {
		t.Fatalf("NewBytes and New differ:\n%v\n%v", a, b)
	}
	return a.recs, a.end, a.err
}

func badRecord(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want an *Error", err, err)
	}
	return e
}

// TestFrameBytes: the frame is length, CRC-32C, payload, little-endian;
// Put writes what Append does.
func TestFrameBytes(t *testing.T) {
	want := []byte{3, 0, 0, 0, 0xb7, 0x3f, 0x4b, 0x36, 'a', 'b', 'c'} // CRC-32C("abc") = 0x364b3fb7
	if got := Append([]byte{}, []byte("abc")); !bytes.Equal(got, want) {
		t.Errorf("Append = % x, want % x", got, want)
	}
	b := append(make([]byte, HeaderSize), "abc"...)
	if Put(b); !bytes.Equal(b, want) {
		t.Errorf("Put = % x, want % x", b, want)
	}
}

// TestWhole: a whole file reads back as its records, at their offsets,
// and so do a header-only file and a missing one's empty bytes.
func TestWhole(t *testing.T) {
	data, offs := file()
	got, end, err := read(t, "f", data)
	if err != nil || fmt.Sprint(got) != fmt.Sprint(records) || end != int64(len(data)) {
		t.Fatalf("read %q, end %d, %v", got, end, err)
	}
	r := NewBytes("f", data, int64(len(fileHeader)), format)
	for i := range records {
		if _, ok := r.Next(); !ok || r.Offset() != offs[i] {
			t.Fatalf("record %d at %d, want %d", i, r.Offset(), offs[i])
		}
	}
	if got, end, err := read(t, "f", []byte(fileHeader)); err != nil || got != nil || end != int64(len(fileHeader)) {
		t.Errorf("header only: %q, end %d, %v", got, end, err)
	}
	r = NewBytes("f", nil, 0, format)
	if _, ok := r.Next(); ok || r.Err() != nil || r.End() != 0 {
		t.Errorf("an empty file: end %d, %v", r.End(), r.Err())
	}
}

// TestTornTail: the last record cut at every byte, garbled in any byte of
// its checksum or payload, or followed by zeros, is a torn tail: the
// records before it read, the error says where it starts and what is
// wrong, and Repair cuts exactly it.
func TestTornTail(t *testing.T) {
	data, offs := file()
	last := offs[len(offs)-1]
	type tc struct {
		name  string
		data  []byte
		fault Fault
		at    int64 // where the torn tail starts
	}
	var cases []tc
	for cut := last + 1; cut < int64(len(data)); cut++ {
		fault := Truncated
		if cut-last < HeaderSize {
			fault = ShortHeader
		}
		cases = append(cases, tc{fmt.Sprintf("cut at %d", cut), bytes.Clone(data[:cut]), fault, last})
	}
	for i := last + 4; i < int64(len(data)); i++ {
		d := bytes.Clone(data)
		d[i] ^= 0x40
		cases = append(cases, tc{fmt.Sprintf("byte %d garbled", i), d, BadChecksum, last})
	}
	for cut := last; cut < int64(len(data)); cut++ {
		// What a file system shows of a write that never reached the disk:
		// zeros where its bytes should be, up to the new size.
		d := append(bytes.Clone(data[:cut]), make([]byte, int64(len(data))-cut)...)
		fault := BadChecksum // the length (15) keeps its value with its high bytes zeroed
		if cut == last {
			fault = Zeros
		}
		cases = append(cases, tc{fmt.Sprintf("zeros from %d", cut), d, fault, last})
	}
	cases = append(cases,
		tc{"zeros after the last record", append(bytes.Clone(data), make([]byte, 100)...), Zeros, int64(len(data))},
		tc{"a file of zeros after its header", append([]byte(fileHeader), make([]byte, 64)...), Zeros, int64(len(fileHeader))},
		tc{"a few zeros after its header", append([]byte(fileHeader), make([]byte, 3)...), Zeros, int64(len(fileHeader))},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			got, end, err := read(t, path, c.data)
			e := badRecord(t, err)
			if !e.Torn || e.Fault != c.fault || e.Offset != c.at || end != c.at || e.Path != path {
				t.Fatalf("%+v, end %d; want a torn tail (fault %d) at %d", e, end, c.fault, c.at)
			}
			if want := slices.Index(append(offs, int64(len(data))), c.at); want < 0 || len(got) != want {
				t.Fatalf("%d records before the torn tail at %d", len(got), c.at)
			}
			if !strings.Contains(e.Error(), path) || !strings.Contains(e.What(), fmt.Sprintf("offset %d", c.at)) {
				t.Errorf("%q does not say the file and the offset", e.Error())
			}
			if e.Cut() != int64(len(c.data))-c.at {
				t.Errorf("Cut %d, want %d", e.Cut(), int64(len(c.data))-c.at)
			}
			os.WriteFile(path, c.data, 0o600)
			if err := Repair(e); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(path); !bytes.Equal(b, c.data[:c.at]) {
				t.Errorf("Repair left %d bytes, want %d", len(b), c.at)
			}
		})
	}
}

// TestDamage: a bad record with bytes after it that are not zeros is
// damage, never a torn tail: every byte of a record before the last
// garbled, and lengths that cannot be. The error names the file and the
// record's offset, and Repair refuses it.
func TestDamage(t *testing.T) {
	data, offs := file()
	last := offs[len(offs)-1]
	type tc struct {
		name  string
		data  []byte
		fault Fault
		at    int64
	}
	var cases []tc
	for i := range offs[:len(offs)-1] {
		for b := offs[i] + 4; b < offs[i+1]; b++ {
			d := bytes.Clone(data)
			d[b] ^= 0x01
			cases = append(cases, tc{fmt.Sprintf("record %d byte %d garbled", i, b), d, BadChecksum, offs[i]})
		}
	}
	setLen := func(at int64, n uint32) []byte {
		d := bytes.Clone(data)
		d[at], d[at+1], d[at+2], d[at+3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
		return d
	}
	cases = append(cases,
		tc{"a zero length", setLen(offs[1], 0), BadLength, offs[1]},
		tc{"a length over the most a record holds", setLen(offs[0], 1001), BadLength, offs[0]},
		tc{"a length over the most, in the last record", setLen(last, 1<<31), BadLength, last},
		tc{"a shorter length", setLen(offs[2], 299), BadChecksum, offs[2]},
		tc{"the last record's length shorter", setLen(last, 3), BadChecksum, last},
		tc{"zeros, then a record", append(append([]byte(fileHeader), make([]byte, 16)...), data[len(fileHeader):]...), BadLength, int64(len(fileHeader))},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			_, end, err := read(t, path, c.data)
			e := badRecord(t, err)
			if e.Torn || e.Fault != c.fault || e.Offset != c.at || end != c.at {
				t.Fatalf("%+v, end %d; want damage (fault %d) at %d", e, end, c.fault, c.at)
			}
			msg := e.Error()
			if !strings.Contains(msg, path) || !strings.Contains(msg, fmt.Sprintf("offset %d", c.at)) {
				t.Errorf("%q does not name the file and the offset", msg)
			}
			os.WriteFile(path, c.data, 0o600)
			if err := Repair(e); err == nil || !strings.Contains(err.Error(), "not cut") {
				t.Errorf("Repair of damage: %v", err)
			}
			if b, _ := os.ReadFile(path); !bytes.Equal(b, c.data) {
				t.Error("Repair changed a damaged file")
			}
		})
	}
}

// TestLengthPastTheEnd: a length that runs past the end of the file is a
// torn tail wherever the record is: a crash leaves the same bytes as a
// garbled length, and nothing whole can follow it. (The ledger, which
// knows how far a segment must reach, refuses it when it is short.)
func TestLengthPastTheEnd(t *testing.T) {
	data, offs := file()
	d := bytes.Clone(data)
	d[offs[1]], d[offs[1]+1] = 400&0xff, 400>>8 // record 1 now holds 400 bytes: past the end
	_, end, err := read(t, "f", d)
	e := badRecord(t, err)
	if !e.Torn || e.Fault != Truncated || e.Offset != offs[1] || end != offs[1] || e.Length != 400 {
		t.Fatalf("%+v", e)
	}
	want := fmt.Sprintf("f: truncated record at offset %d: it holds 400 bytes, %d of the %d-byte file are left",
		offs[1], int64(len(d))-offs[1]-HeaderSize, len(d))
	if e.Error() != want {
		t.Errorf("%q\nwant %q", e.Error(), want)
	}
}

// TestRepairChecksTheSize: Repair cuts nothing from a file that changed
// since it was read.
func TestRepairChecksTheSize(t *testing.T) {
	data, _ := file()
	path := filepath.Join(t.TempDir(), "log")
	torn := data[:len(data)-2]
	_, _, err := read(t, path, torn)
	e := badRecord(t, err)
	os.WriteFile(path, data, 0o600)
	if err := Repair(e); err == nil {
		t.Fatal("Repair cut a file that grew")
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, data) {
		t.Error("the file changed")
	}
}

// TestReadErrors: a read that fails is that error, not a torn tail.
func TestReadErrors(t *testing.T) {
	data, _ := file()
	r := New("f", bytes.NewReader(data[len(fileHeader):20]), int64(len(fileHeader)), int64(len(data)), format)
	for {
		if _, ok := r.Next(); !ok {
			break
		}
	}
	var e *Error
	if err := r.Err(); err == nil || errors.As(err, &e) {
		t.Fatalf("a file shorter than its size: %v", err)
	}
}
