// Package settlelog is the gateway's settlement log: an append-only,
// checksummed record log in segment files beside the store file. A
// settlement is acknowledged once its record is in the log (written, or
// written and fdatasync'd, by the durability mode); the store applies the
// records to its database in the background and replays the ones past what
// the database holds at the next start.
//
// A segment file starts with a header (a magic that says the file is the
// gateway's settlement log, a format version and the log position its first
// record starts at) and holds records framed as
//
//	length uint32 LE | CRC-32C of the payload uint32 LE | payload
//
// A record's position is the log position just past it: positions grow
// across segments (a segment starts at or after the end of the one before),
// so "applied up to p" names a prefix of the log.
//
// The framing, and the rule for a record that does not read, are
// internal/store/framed's, shared with the ledger: a torn tail of the last
// segment (a write torn by a crash or power loss, never acknowledged) is
// dropped with a log line, and left in the file, which is never appended
// to again and goes once applied; damage anywhere else is a clear error
// naming the file and the offset, and the store refuses to start rather
// than skip a settlement.
package settlelog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/platformgw/gateway/internal/store/framed"
)

// Mode says when an append is acknowledged.
type Mode int

const (
	// Sync acknowledges a record once an fdatasync covering it returned:
	// it survives power loss. Records appended while one fdatasync runs
	// share the next one (group commit, no fixed delay).
	Sync Mode = iota
	// Write acknowledges a record once write(2) returned: it survives the
	// gateway being killed; the OS writes it out, and a background
	// fdatasync every FlushInterval bounds what power loss can take.
	Write
)

func (m Mode) String() string {
	if m == Write {
		return "write"
	}
	return "sync"
}

// ParseMode reads "sync" or "write".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "sync":
		return Sync, nil
	case "write":
		return Write, nil
	}
	return Sync, fmt.Errorf("durability %q: want sync or write", s)
}

// DefaultFlushInterval is how often write mode fdatasyncs by default.
const DefaultFlushInterval = 5 * time.Millisecond

// Options configure a log.
type Options struct {
	Mode Mode
	// FlushInterval is write mode's background fdatasync period.
	FlushInterval time.Duration
	// SegmentBytes is the size past which a new segment is started.
	SegmentBytes int64
}

const (
	magic         = "PGWSETL\x00"
	version       = 1
	headerSize    = 24 // magic(8) version(4) start(8) crc(4)
	maxRecord     = 1 << 30
	defaultSegMax = 64 << 20
	segSuffix     = ".settle"
	// maxSpare is the largest buffer kept for reuse: a burst's larger
	// batch is left to the garbage collector.
	maxSpare = 1 << 20
)

// recordFormat is what framed reads a segment's records as.
var recordFormat = framed.Format{Noun: "record", Max: maxRecord}

// ErrNotOurs marks a file named like a segment that is not one of ours.
var ErrNotOurs = errors.New("not a settlement log segment of this gateway")

// ErrCorrupt marks a damaged record before the end of the log.
var ErrCorrupt = errors.New("settlement log damaged")

// ErrClosed is returned by appends after Close.
var ErrClosed = errors.New("settlement log closed")

// segment is one file of the log.
type segment struct {
	path  string
	start uint64 // position of the first record
	end   uint64 // position past the last valid record
}

// Log is an open settlement log.
type Log struct {
	dir, prefix string
	opts        Options
	// TornTail, set by Open, describes a damaged tail record it dropped
	// ("" when none), for the caller to log.
	TornTail string

	old []segment // segments found at Open, oldest first

	mu      sync.Mutex
	cur     *os.File // nil: no segment open (before Start, or after a failure)
	curSeg  segment
	curSize int64 // bytes of cur written, header included
	segs    []segment
	end     uint64 // position past the last record handed out
	batch   *Batch // sync mode: records waiting for the flusher
	wake    chan struct{}
	closed  bool
	running bool // Start launched the background writer
	stop    chan struct{}
	done    chan struct{}

	// spare is a written batch's buffer, kept for the next batch (sync
	// mode); wbuf is write mode's frame buffer. Both are used under mu
	// only: a batch's buffer is written under mu and never read again.
	spare, wbuf []byte

	// observe, when set, is told of every fdatasync: how long it took and
	// how many records it made durable.
	observe  atomic.Pointer[func(d time.Duration, records int)]
	unsynced int // write mode: records written since the last sync (under mu)
	// syncing counts fdatasyncs running outside mu on cur; a segment
	// retired meanwhile is closed by the last of them (closeLater).
	syncing    int
	closeLater *os.File

	syncMu    sync.Mutex
	synced    map[string]int64 // per segment path, bytes known fdatasync'd
	written   uint64           // write mode: position written
	syncedPos uint64
}

// Batch is a group of records made durable together.
type Batch struct {
	start, end uint64
	buf        []byte
	n          int
	done       chan struct{}
	err        error
}

// Done reports whether the batch is finished, and its error.
func (b *Batch) Done() (bool, error) {
	if b == nil {
		return true, nil
	}
	select {
	case <-b.done:
		return true, b.err
	default:
		return false, nil
	}
}

// Wait waits for the batch and returns its error.
func (b *Batch) Wait() error {
	if b == nil {
		return nil
	}
	<-b.done
	return b.err
}

// SegmentPrefix is the file name prefix of the segments of the store file
// named base.
func segName(prefix string, start uint64) string {
	return fmt.Sprintf("%s.%020d%s", prefix, start, segSuffix)
}

// Open reads the segments of the log of the store file storePath (in its
// directory, named after it) and checks every one; it appends nothing
// until Start. A file named like a segment that is not ours, or damage
// before the end of the log, is an error.
func Open(storePath string, opts Options) (*Log, error) {
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = defaultSegMax
	}
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = DefaultFlushInterval
	}
	l := &Log{dir: filepath.Dir(storePath), prefix: filepath.Base(storePath), opts: opts,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		synced: make(map[string]int64)}
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, fmt.Errorf("settlement log in %s: %w", l.dir, err)
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, l.prefix+".") && strings.HasSuffix(n, segSuffix) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for i, n := range names {
		seg, torn, err := scanSegment(filepath.Join(l.dir, n), i == len(names)-1, nil)
		if err != nil {
			return nil, err
		}
		if torn != "" {
			l.TornTail = torn
		}
		if len(l.old) > 0 && seg.start < l.old[len(l.old)-1].end {
			return nil, fmt.Errorf("settlement log segment %s starts at %d, before the end %d of %s: %w",
				seg.path, seg.start, l.old[len(l.old)-1].end, l.old[len(l.old)-1].path, ErrCorrupt)
		}
		l.old = append(l.old, seg)
	}
	l.segs = append(l.segs, l.old...)
	return l, nil
}

// End is the position past the last record found at Open.
func (l *Log) End() uint64 {
	if len(l.old) == 0 {
		return 0
	}
	return l.old[len(l.old)-1].end
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
func scanSegment(path string, last bool, fn func(pos uint64, rec []byte) error) (seg segment, torn string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return seg, "", fmt.Errorf("settlement log segment %s: %w", path, err)
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

// Replay calls fn for every record found at Open whose position is past
// after, in log order.
func (l *Log) Replay(after uint64, fn func(pos uint64, rec []byte) error) error {
	for i, s := range l.old {
		if s.end <= after {
			continue
		}
		_, _, err := scanSegment(s.path, i == len(l.old)-1, func(pos uint64, rec []byte) error {
			if pos <= after {
				return nil
			}
			return fn(pos, rec)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Start opens a new segment for appends, starting at or after from and
// after every record found at Open, and starts the background writer.
func (l *Log) Start(from uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.end = max(from, l.End())
	if err := l.newSegment(l.end); err != nil {
		return err
	}
	l.running = true
	go l.run()
	return nil
}

// newSegment creates the segment starting at start and makes it current.
// Called with l.mu held (or by the flusher, which owns cur).
func (l *Log) newSegment(start uint64) error {
	path := filepath.Join(l.dir, segName(l.prefix, start))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if errors.Is(err, os.ErrExist) {
		// A segment of the same start left by a failure: it holds no
		// acknowledged record past start (or start would have moved on).
		if err = os.Remove(path); err == nil {
			f, err = os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
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
		os.Remove(path)
		return fmt.Errorf("write settlement log segment header %s: %w", path, err)
	}
	if err := fdatasync(f); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("sync settlement log segment %s: %w", path, err)
	}
	if err := syncDir(l.dir); err != nil {
		f.Close()
		os.Remove(path)
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

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("settlement log directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync settlement log directory %s: %w", dir, err)
	}
	return nil
}

// Append adds rec to the log and returns its position and the batch that
// makes it durable (nil in write mode, where it was written before Append
// returned, or failed with the error returned). Appends are ordered: a
// caller that needs its records in an order appends them under its own
// lock.
func (l *Log) Append(rec []byte) (uint64, *Batch, error) {
	if len(rec) == 0 || len(rec) > maxRecord {
		return 0, nil, fmt.Errorf("settlement record of %d bytes", len(rec))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, nil, ErrClosed
	}
	start := l.end
	if l.opts.Mode == Write {
		buf := framed.Append(l.wbuf[:0], rec)
		if cap(buf) <= maxSpare {
			l.wbuf = buf
		}
		pos := start + uint64(len(buf))
		if err := l.writeLocked(start, buf); err != nil {
			return 0, nil, err
		}
		l.end = pos
		l.unsynced++
		l.syncMu.Lock()
		l.written = pos
		l.syncMu.Unlock()
		return pos, nil, nil
	}
	b := l.batch
	if b == nil {
		b = &Batch{start: start, done: make(chan struct{}), buf: l.spare}
		l.spare = nil
		l.batch = b
	}
	b.buf = framed.Append(b.buf, rec)
	b.n++
	l.end = start + framed.HeaderSize + uint64(len(rec))
	b.end = l.end
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return l.end, b, nil
}

// writeLocked writes buf, whose first byte is at position start, to the
// current segment, starting a new one when needed (after a failure, or
// when the current one is full). A failed write is cut off the file, and
// the segment given up: the next write starts a new segment at its own
// position, so no damaged bytes ever precede an acknowledged record.
func (l *Log) writeLocked(start uint64, buf []byte) error {
	if l.cur != nil && l.curSize >= l.opts.SegmentBytes {
		l.retire()
	}
	if l.cur == nil {
		if err := l.newSegment(start); err != nil {
			return err
		}
	}
	if _, err := l.cur.Write(buf); err != nil {
		l.cur.Truncate(l.curSize)
		l.retire()
		return fmt.Errorf("append to settlement log: %w", err)
	}
	l.curSize += int64(len(buf))
	l.curSeg.end = start + uint64(len(buf))
	l.segs[len(l.segs)-1].end = l.curSeg.end
	return nil
}

// retire syncs and closes the current segment; its records stay until
// applied.
func (l *Log) retire() {
	if l.cur == nil {
		return
	}
	if fdatasync(l.cur) == nil {
		l.noteSynced(l.curSeg.path, l.curSize, l.curSeg.end)
	}
	if l.syncing > 0 {
		l.closeLater = l.cur // an fdatasync outside mu still uses it
	} else {
		l.cur.Close()
	}
	l.cur = nil
}

// beginSync takes cur for an fdatasync outside mu (mu held); endSync
// gives it back, closing it if it was retired meanwhile.
func (l *Log) beginSync() *os.File {
	if l.cur != nil {
		l.syncing++
	}
	return l.cur
}

func (l *Log) endSync(f *os.File) {
	l.mu.Lock()
	l.syncing--
	if l.syncing == 0 && l.closeLater != nil {
		l.closeLater.Close()
		l.closeLater = nil
	}
	l.mu.Unlock()
}

func (l *Log) noteSynced(path string, size int64, pos uint64) {
	l.syncMu.Lock()
	if size > l.synced[path] {
		l.synced[path] = size
	}
	l.syncedPos = max(l.syncedPos, pos)
	l.syncMu.Unlock()
}

// run is the background writer: in sync mode it writes and fdatasyncs
// each batch; in write mode it fdatasyncs every FlushInterval.
func (l *Log) run() {
	defer close(l.done)
	if l.opts.Mode == Write {
		t := time.NewTicker(l.opts.FlushInterval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				l.syncWritten()
			case <-l.stop:
				l.syncWritten()
				return
			}
		}
	}
	for {
		select {
		case <-l.wake:
			l.flush()
		case <-l.stop:
			l.flush()
			return
		}
	}
}

// syncWritten fdatasyncs what write mode wrote.
func (l *Log) syncWritten() {
	l.mu.Lock()
	path, size, pos := l.curSeg.path, l.curSize, l.curSeg.end
	l.syncMu.Lock()
	done := l.synced[path] >= size
	l.syncMu.Unlock()
	if l.cur == nil || done {
		l.mu.Unlock()
		return
	}
	f := l.beginSync()
	n := l.unsynced
	l.unsynced = 0
	l.mu.Unlock()
	defer l.endSync(f)
	start := time.Now()
	if fdatasync(f) == nil {
		l.noteSynced(path, size, pos)
		l.observed(start, n)
	}
}

// flush writes and fdatasyncs the pending batch (sync mode).
func (l *Log) flush() {
	l.mu.Lock()
	b := l.batch
	l.batch = nil
	if b == nil {
		l.mu.Unlock()
		return
	}
	// The batch is written under mu (appends queue into the next batch
	// meanwhile, they do not wait for the write), then synced outside it.
	before, was := l.curSize, l.curSeg.path
	err := l.writeLocked(b.start, b.buf)
	if cap(b.buf) <= maxSpare {
		l.spare = b.buf[:0]
	}
	b.buf = nil
	path, size := l.curSeg.path, l.curSize
	if path != was {
		before = headerSize // a new segment was started for this batch
	}
	var f *os.File
	if err == nil {
		f = l.beginSync()
	}
	l.mu.Unlock()
	if err == nil {
		defer l.endSync(f)
		start := time.Now()
		if err = fdatasync(f); err == nil {
			l.noteSynced(path, size, b.end)
			l.observed(start, b.n)
		} else {
			err = fmt.Errorf("sync settlement log: %w", err)
			l.mu.Lock()
			if l.cur == f {
				// The batch is refused: cut it off so that it is never
				// replayed, and start anew.
				l.cur.Truncate(before)
				l.cur.Close()
				l.cur = nil
			}
			l.mu.Unlock()
		}
	}
	b.err = err
	close(b.done)
}

// Observe sets a function told of every fdatasync of the log (nil: none).
func (l *Log) Observe(fn func(d time.Duration, records int)) {
	if fn == nil {
		l.observe.Store(nil)
		return
	}
	l.observe.Store(&fn)
}

func (l *Log) observed(start time.Time, n int) {
	if fn := l.observe.Load(); fn != nil && n > 0 {
		(*fn)(time.Since(start), n)
	}
}

// Release deletes the segments wholly at or before upto, other than the
// one being written.
func (l *Log) Release(upto uint64) error {
	l.mu.Lock()
	var keep []segment
	var drop []string
	for _, s := range l.segs {
		if s.end <= upto && (l.cur == nil || s.path != l.curSeg.path) {
			drop = append(drop, s.path)
		} else {
			keep = append(keep, s)
		}
	}
	l.segs = keep
	l.mu.Unlock()
	var first error
	for _, p := range drop {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) && first == nil {
			first = err
		}
		l.syncMu.Lock()
		delete(l.synced, p)
		l.syncMu.Unlock()
	}
	return first
}

// Close finishes the pending batch, syncs and closes the log. When
// everything up to applied is in the database, every segment goes.
func (l *Log) Close(applied uint64) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	started := l.running
	l.mu.Unlock()
	if started {
		close(l.stop)
		<-l.done
	}
	l.mu.Lock()
	l.retire()
	end := l.end
	l.mu.Unlock()
	if applied >= end {
		l.mu.Lock()
		segs := l.segs
		l.segs = nil
		l.mu.Unlock()
		for _, s := range segs {
			os.Remove(s.path)
		}
	}
	return nil
}

// SyncedSizes is, per segment file, how many bytes are known to be on
// stable storage: what power loss cannot take (for tests that simulate
// it).
func (l *Log) SyncedSizes() map[string]int64 {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	out := make(map[string]int64, len(l.synced))
	for k, v := range l.synced {
		out[k] = v
	}
	return out
}

// SyncedPosition is the position up to which records are on stable
// storage.
func (l *Log) SyncedPosition() uint64 {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	return l.syncedPos
}

// Segments lists the segment files, oldest first (for tests and checks).
func (l *Log) Segments() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(l.segs))
	for i, s := range l.segs {
		out[i] = s.path
	}
	return out
}
