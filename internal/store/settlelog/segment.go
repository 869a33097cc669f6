package settlelog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/platformgw/gateway/internal/store/framed"
)

// A segment file is a header (magic, format version, the position of its
// first record, the CRC-32C of those) and records in framed's frames.

// errHeaderless marks a last segment that is empty or all zeros: one a
// crash left between its creation and its header's fdatasync.
var errHeaderless = errors.New("settlement log segment without a header")

// headerless says whether data is what a crash leaves of a segment whose
// header write it cut off: nothing, zeros, or a part of our header.
func headerless(data []byte) bool {
	if !slices.ContainsFunc(data, func(b byte) bool { return b != 0 }) {
		return true
	}
	return len(data) < headerSize && strings.HasPrefix(magic, string(data[:min(len(data), len(magic))]))
}

// recordFormat is what framed reads a segment's records as.
var recordFormat = framed.Format{Noun: "record", Max: maxRecord}

// segment is one file of the log.
type segment struct {
	path  string
	start uint64 // position of the first record
	end   uint64 // position past the last valid record
}

// segName is the file name of the segment of the log prefix whose first
// record is at position start.
func segName(prefix string, start uint64) string {
	return fmt.Sprintf("%s.%020d%s", prefix, start, segSuffix)
}

// readHeader checks a segment's header and returns its start position.
func readHeader(path string, h []byte) (uint64, error) {
	if len(h) < headerSize || string(h[:8]) != magic {
		return 0, fmt.Errorf("%s: %w (no settlement log header); move it out of the store's directory", path, ErrNotOurs)
	}
	if framed.Checksum(h[:20]) != binary.LittleEndian.Uint32(h[20:24]) {
		return 0, fmt.Errorf("%s: header checksum mismatch: %w", path, ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(h[8:12]); v != version {
		return 0, fmt.Errorf("%s: settlement log format %d, this gateway reads %d: %w", path, v, version, ErrNotOurs)
	}
	return binary.LittleEndian.Uint64(h[12:20]), nil
}

// scanSegment validates a segment, calling fn (when not nil) for each
// record. A torn tail (framed's rule) of the last segment ends it, and torn
// says so; any other bad record is ErrCorrupt.
func (l *Log) scanSegment(path string, last bool, fn func(pos uint64, rec []byte) error) (seg segment, torn string, err error) {
	data, err := l.fs.ReadFile(path)
	if err != nil {
		return seg, "", fmt.Errorf("settlement log segment %s: %w", path, err)
	}
	if last && headerless(data) {
		// Created, and power failed before its header was durable: a
		// segment's header is synced before any record is written to it.
		return seg, "", errHeaderless
	}
	start, err := readHeader(path, data)
	if err != nil {
		return seg, "", err
	}
	seg = segment{path: path, start: start, end: start}
	r := framed.NewBytes(path, data, headerSize, recordFormat)
	for {
		rec, ok := r.Next()
		if !ok {
			break
		}
		seg.end = start + uint64(r.End()-headerSize)
		if fn != nil {
			if err := fn(seg.end, rec); err != nil {
				return seg, "", err
			}
		}
	}
	if r.Err() == nil {
		return seg, "", nil
	}
	var bad *framed.Error
	if !errors.As(r.Err(), &bad) {
		return seg, "", r.Err() // read from memory: nothing else fails
	}
	if last && bad.Torn {
		return seg, fmt.Sprintf("%s (%d bytes dropped)", bad, bad.Cut()), nil
	}
	return seg, "", fmt.Errorf("settlement log segment %w: %w; the records after it cannot be trusted, restore the store directory from a backup",
		bad, ErrCorrupt)
}

// newSegment creates the segment starting at start and makes it current.
// Called with l.mu held (or by the flusher, which owns cur).
func (l *Log) newSegment(start uint64) error {
	path := filepath.Join(l.dir, segName(l.prefix, start))
	f, err := l.fs.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if errors.Is(err, os.ErrExist) {
		// A segment of the same start left by a failure: it holds no
		// acknowledged record past start (or start would have moved on).
		if err = l.fs.Remove(path); err == nil {
			f, err = l.fs.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
		}
	}
	if err != nil {
		return fmt.Errorf("create settlement log segment: %w", err)
	}
	h := make([]byte, headerSize)
	copy(h, magic)
	binary.LittleEndian.PutUint32(h[8:], version)
	binary.LittleEndian.PutUint64(h[12:], start)
	binary.LittleEndian.PutUint32(h[20:], framed.Checksum(h[:20]))
	if _, err := f.Write(h); err != nil {
		f.Close()
		l.fs.Remove(path)
		return fmt.Errorf("write settlement log segment header %s: %w", path, err)
	}
	if err := f.Datasync(); err != nil {
		f.Close()
		l.fs.Remove(path)
		return fmt.Errorf("sync settlement log segment %s: %w", path, err)
	}
	if err := l.syncDir(); err != nil {
		f.Close()
		l.fs.Remove(path)
		return err
	}
	l.cur, l.curSize = f, headerSize
	l.curSeg = segment{path: path, start: start, end: start}
	l.segs = append(l.segs, l.curSeg)
	l.syncMu.Lock()
	l.synced[path] = headerSize
	l.syncMu.Unlock()
	return nil
}

func (l *Log) syncDir() error {
	if err := l.fs.SyncDir(l.dir); err != nil {
		return fmt.Errorf("sync settlement log directory %s: %w", l.dir, err)
	}
	return nil
}
