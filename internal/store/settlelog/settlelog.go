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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/platformgw/gateway/internal/store/vfs"
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

// PaceFactor and MaxPaceWait pace sync mode's fdatasyncs (Options.Eager):
// at most one in PaceFactor of the writer's time is spent in fdatasync
// while settlements keep coming, and a settlement waits at most
// MaxPaceWait for its batch to start beyond the fdatasync before it.
const (
	PaceFactor  = 3
	MaxPaceWait = 5 * time.Millisecond
)

// DefaultFlushInterval is how often write mode fdatasyncs by default.
const DefaultFlushInterval = 5 * time.Millisecond

// Options configure a log.
type Options struct {
	Mode Mode
	// FlushInterval is write mode's background fdatasync period.
	FlushInterval time.Duration
	// SegmentBytes is the size past which a new segment is started.
	SegmentBytes int64
	// FS is the file system the segments are on (nil: the OS's); the
	// storage simulation's disk in its tests.
	FS vfs.FS
	// Eager starts each fdatasync of sync mode as soon as the one before
	// it ended. Without it (the default) the writer paces them: the next
	// fdatasync starts no sooner than PaceFactor times the last one's
	// duration after the last one started (waiting at most MaxPaceWait
	// more), so that on a disk whose fdatasync is slow, or costs CPU, the
	// settlements arriving meanwhile share one fdatasync instead of
	// queueing for the next few. A record appended when the log has been
	// idle that long is synced at once either way.
	Eager bool
	// Inline runs the background writer's work in the caller's
	// goroutine: a Batch's Wait writes and fdatasyncs it, write mode
	// syncs at Close only. The storage simulation sets it so that a run
	// is one sequence of file operations, the same for the same seed;
	// the gateway never does.
	Inline bool
}

const (
	magic         = "PGWSETL\x00"
	version       = 1
	headerSize    = 24 // magic(8) version(4) start(8) crc(4)
	maxRecord     = 1 << 30
	defaultSegMax = 64 << 20
	segSuffix     = ".settle"
	// cutSuffix names the copy of a segment made to replace it when a
	// refused batch could not be cut off in place (cutRefused); one a
	// crash left is removed at Open.
	cutSuffix = ".cut"
	// maxSpare is the largest buffer kept for reuse: a burst's larger
	// batch is left to the garbage collector.
	maxSpare = 1 << 20
)

// ErrNotOurs marks a file named like a segment that is not one of ours.
var ErrNotOurs = errors.New("not a settlement log segment of this gateway")

// ErrCorrupt marks a damaged record before the end of the log.
var ErrCorrupt = errors.New("settlement log damaged")

// ErrClosed is returned by appends after Close.
var ErrClosed = errors.New("settlement log closed")

// Log is an open settlement log.
type Log struct {
	dir, prefix string
	opts        Options
	fs          vfs.FS
	// TornTail, set by Open, describes a damaged tail record it dropped
	// ("" when none), for the caller to log.
	TornTail string

	old []segment // segments found at Open, oldest first

	mu      sync.Mutex
	cur     vfs.File // nil: no segment open (before Start, or after a failure)
	curSeg  segment
	curSize int64 // bytes of cur written, header included
	segs    []segment
	end     uint64 // position past the last record handed out
	batch   *Batch // sync mode: records waiting for the flusher
	wake    chan struct{}
	closed  bool
	running bool // Start launched the background writer
	// broken is set when a refused batch could not be cut off the disk
	// (cutRefused): every later append fails with it.
	broken error
	stop   chan struct{}
	done   chan struct{}

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
	closeLater vfs.File

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
	inline     *Log // Options.Inline: Wait flushes
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
	if b.inline != nil {
		b.inline.flush()
	}
	<-b.done
	return b.err
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
	l := &Log{dir: filepath.Dir(storePath), prefix: filepath.Base(storePath), opts: opts, fs: vfs.Or(opts.FS),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		synced: make(map[string]int64)}
	ents, err := l.fs.ReadDir(l.dir)
	if err != nil {
		return nil, fmt.Errorf("settlement log in %s: %w", l.dir, err)
	}
	var names []string
	for _, n := range ents {
		if !strings.HasPrefix(n, l.prefix+".") {
			continue
		}
		switch {
		case strings.HasSuffix(n, segSuffix):
			names = append(names, n)
		case strings.HasSuffix(n, segSuffix+cutSuffix):
			// A replacement a crash cut short: the segment it was
			// to replace is still there.
			if err := l.fs.Remove(filepath.Join(l.dir, n)); err != nil {
				return nil, fmt.Errorf("settlement log: remove %s, a copy a crash left: %w", n, err)
			}
		}
	}
	sort.Strings(names)
	for i, n := range names {
		seg, torn, err := l.scanSegment(filepath.Join(l.dir, n), i == len(names)-1, nil)
		if errors.Is(err, errHeaderless) {
			// It holds no record: it goes (found by the storage
			// simulation, power failing during a segment's creation).
			if err := l.fs.Remove(filepath.Join(l.dir, n)); err != nil {
				return nil, fmt.Errorf("settlement log: remove %s, a segment a crash left without a header: %w", n, err)
			}
			l.TornTail = n + ": a segment a crash left without a header (removed; it held no record)"
			continue
		}
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

// Segments lists the files Open would read as segments of the log of the
// store file storePath, without reading them: what a restore to that path
// must not find (they would be replayed onto the restored file).
func Segments(storePath string) ([]string, error) {
	dir, prefix := filepath.Dir(storePath), filepath.Base(storePath)+"."
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("settlement log in %s: %w", dir, err)
	}
	var segs []string
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, prefix) && strings.HasSuffix(n, segSuffix) {
			segs = append(segs, filepath.Join(dir, n))
		}
	}
	return segs, nil
}

// End is the position past the last record found at Open.
func (l *Log) End() uint64 {
	if len(l.old) == 0 {
		return 0
	}
	return l.old[len(l.old)-1].end
}

// Replay calls fn for every record found at Open whose position is past
// after, in log order.
func (l *Log) Replay(after uint64, fn func(pos uint64, rec []byte) error) error {
	for i, s := range l.old {
		if s.end <= after {
			continue
		}
		_, _, err := l.scanSegment(s.path, i == len(l.old)-1, func(pos uint64, rec []byte) error {
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
	if !l.opts.Inline {
		l.running = true
		go l.run()
	}
	return nil
}

// Release deletes the segments wholly at or before upto, other than the
// one being written, and syncs the directory when it deleted one: a
// removal a crash undid would bring back a segment that is no longer the
// last, and a torn tail Open dropped in it would read as damage then.
// The store calls it before Start at Open for the same reason: the new
// segment must not be durable while the old ones may come back.
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
		if err := l.fs.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) && first == nil {
			first = err
		}
		l.syncMu.Lock()
		delete(l.synced, p)
		l.syncMu.Unlock()
	}
	if len(drop) > 0 && first == nil {
		first = l.syncDir()
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
	switch {
	case started:
		close(l.stop)
		<-l.done
	case l.opts.Inline && l.opts.Mode == Write:
		l.syncWritten()
	case l.opts.Inline:
		l.flush()
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
			l.fs.Remove(s.path)
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
