// Package ledger keeps the usage ledger of record compactly: a directory of
// segment files, the newest (active) one appended with checksummed blocks,
// the older ones sealed, column-encoded and zstd-compressed, each with its
// own dictionary of ids so that retention can drop whole files. Hourly
// rollups per subscription, endpoint and product are kept as rows are
// appended and outlive the raw rows. docs/operations.md has the disk and
// memory arithmetic; docs/reliability.md what a crash leaves.
//
// The store hands it settled entries in batches, with the position of its
// settlement log they cover: Append is durable when it returns, and
// Position says where to resume after a restart.
package ledger

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/framed"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// Options tune a ledger; the zero value is the defaults.
type Options struct {
	// SealBytes is the size at which the active segment is sealed
	// (default 64 MiB, about two million calls).
	SealBytes int64
	// SealAge seals the active segment once it is this old, so that
	// retention, which removes whole segments, has segments to remove
	// on a quiet gateway too (default 24h).
	SealAge time.Duration
	// ChunkRows is how many rows a sealed chunk holds (default 32768):
	// the unit a scan decompresses and the memory it needs.
	ChunkRows int
	// Logger gets what Open repaired and background sealing failures.
	Logger *zap.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// Level is the zstd level sealed segments are compressed at.
	Level zstd.EncoderLevel
	// Covers is the position the caller's own records say the ledger
	// reached (the store file's settlement-log position), 0 when it knows
	// none. Append syncs a block before the caller records its position,
	// so a bad tail of the active segment that would leave the ledger
	// short of Covers held acknowledged rows: Open refuses it as damage,
	// naming the file, the offset and the fault, and changes nothing,
	// instead of dropping it as a write a crash cut short.
	Covers uint64
	// FS is the file system the directory is on (nil: the OS's); the
	// storage simulation's disk in its tests.
	FS vfs.FS
	// ManualSeal starts no background sealer: raw segments other than
	// the active one are sealed by SealPending, Seal and Prune only. The
	// storage simulation sets it and calls SealPending from its own
	// schedule, so that a run is the same for the same seed.
	ManualSeal bool
}

func (o *Options) defaults() {
	if o.SealBytes <= 0 {
		o.SealBytes = 64 << 20
	}
	if o.SealAge <= 0 {
		o.SealAge = 24 * time.Hour
	}
	if o.ChunkRows <= 0 {
		o.ChunkRows = 32768
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Level == 0 {
		o.Level = zstd.SpeedBetterCompression
	}
}

// Ledger is an open ledger directory. Its methods are safe for concurrent
// use; Append is meant for one writer (the store's applier).
type Ledger struct {
	dir  string
	opts Options
	fs   vfs.FS
	logp atomic.Pointer[zap.Logger]

	mu      sync.Mutex // guards what follows
	segs    []*segMeta // in sequence order; the last is the active one
	active  vfs.File
	adict   *dict    // the active segment's dictionary
	arow    rowState // the active segment's row deltas
	pos     uint64
	lastSeq uint64
	roll    *rollups
	broken  error // a failed write left the active segment unknown
	closed  bool

	snapMu     sync.Mutex // one rollup log write at a time; guards what follows
	rlog       vfs.File
	rlogSize   int64
	rlogSeq    uint64     // the last sequence number the log covers
	rlogBroken bool       // a write failed: the next one rewrites the log
	sealMu     sync.Mutex // one seal at a time
	closing    sync.Once
	sealReq    chan struct{}
	done       chan struct{}
	wg         sync.WaitGroup
	bg         error // the last background sealing error, for Close
}

// Open opens (creating if needed) the ledger in dir. It removes the .tmp
// files of writes that did not finish, drops a torn tail of the active
// segment (logging what it dropped), replays into the rollups the rows
// the rollup log does not cover, and seals in the background the raw
// segments a crash left unsealed. A damaged file is an error naming it.
func Open(dir string, opts Options) (*Ledger, error) {
	opts.defaults()
	fsys := vfs.Or(opts.FS)
	if err := fsys.MkdirAll(dir); err != nil {
		return nil, err
	}
	l := &Ledger{dir: dir, opts: opts, fs: fsys, sealReq: make(chan struct{}, 1), done: make(chan struct{})}
	l.logp.Store(opts.Logger)
	if err := l.load(); err != nil {
		return nil, err
	}
	if !opts.ManualSeal {
		l.wg.Add(1)
		go l.sealer()
		l.kickSealer()
	}
	return l, nil
}

func (l *Ledger) load() error {
	names, err := l.fs.ReadDir(l.dir)
	if err != nil {
		return err
	}
	raws := map[uint64]string{}
	sealed := map[uint64]string{}
	var bases []uint64
	for _, name := range names {
		if filepath.Ext(name) == tmpExt {
			l.logger().Warn("removing an unfinished ledger write", zap.String("file", name))
			if err := l.fs.Remove(filepath.Join(l.dir, name)); err != nil {
				return err
			}
			continue
		}
		base, ext, ok := parseSegName(name)
		if !ok {
			continue
		}
		if _, seen := raws[base]; !seen {
			if _, seen := sealed[base]; !seen {
				bases = append(bases, base)
			}
		}
		if ext == rawExt {
			raws[base] = filepath.Join(l.dir, name)
		} else {
			sealed[base] = filepath.Join(l.dir, name)
		}
	}
	slices.Sort(bases)
	rollPath := filepath.Join(l.dir, rollupFile)
	roll, rollSeq, end, tail, err := loadRollups(l.fs, rollPath)
	if err != nil {
		return err
	}
	if tail != nil {
		l.logger().Warn("dropping the torn last frame of the rollup log (a write a crash cut short; its rows are replayed)",
			zap.String("file", rollPath), zap.Int64("kept_bytes", end), zap.Int64("dropped_bytes", tail.Cut()),
			zap.String("fault", tail.What()))
		if err := framed.RepairIn(l.fs, tail); err != nil {
			return err
		}
	}
	l.roll = roll
	if end == 0 && len(bases) > 0 {
		l.logger().Warn("the rollup log is missing: rebuilding the hourly rollups from the raw rows (the rollups of rows already pruned cannot come back)",
			zap.String("file", rollPath))
	}
	if err := l.openRollupLog(rollPath, end); err != nil {
		return err
	}
	l.rlogSeq = rollSeq
	replay := func(e *store.LedgerEntry) error {
		if e.Seq > rollSeq {
			l.roll.add(e)
		}
		return nil
	}
	cr, err := newChunkReader()
	if err != nil {
		return err
	}
	defer cr.close()
	var last *rawState
	for i, base := range bases {
		if sp, ok := sealed[base]; ok {
			// The rename of a sealed file is the moment it replaces its
			// raw segment; a raw one still there is from a crash before
			// its removal.
			if rp, ok := raws[base]; ok {
				if err := l.fs.Remove(rp); err != nil {
					return err
				}
			}
			m, err := readSealedMeta(l.fs, sp, base)
			if err != nil {
				return err
			}
			if m.lastSeq > rollSeq && m.rows > 0 {
				if err := l.readSealed(cr, &m, 0, 0, replay); err != nil {
					return err
				}
			}
			l.segs = append(l.segs, &m)
			l.note(&m)
			continue
		}
		isLast := i == len(bases)-1
		st, err := readRaw(l.fs, raws[base], base, -1, isLast, replay)
		if err != nil {
			return err
		}
		if (st.broken || st.tail != nil) && l.opts.Covers > max(l.pos, st.meta.pos) {
			// Moving the file out (fileError's advice) would leave the
			// directory short of the store file too: restoring is the way.
			return fmt.Errorf("ledger file %s is damaged (%s): the store file records the ledger up to settlement-log position %d and the segment's whole blocks reach %d, so what is missing held acknowledged rows, not a write a crash cut short; nothing was changed",
				raws[base], st.fault, l.opts.Covers, max(l.pos, st.meta.pos))
		}
		if st.broken {
			l.logger().Warn("removing a ledger segment a crash left without a header", zap.String("file", raws[base]))
			if err := l.fs.Remove(raws[base]); err != nil {
				return err
			}
			continue
		}
		if st.tail != nil {
			l.logger().Warn("dropping the torn tail of the ledger's active segment (a write a crash cut short, never acknowledged)",
				zap.String("file", raws[base]), zap.Int64("kept_bytes", st.end), zap.Int64("dropped_bytes", st.tail.Cut()),
				zap.String("fault", st.tail.What()))
			if err := framed.RepairIn(l.fs, st.tail); err != nil {
				return err
			}
			st.meta.size = st.end
		}
		m := st.meta
		l.segs = append(l.segs, &m)
		l.note(&m)
		if isLast {
			last = st
		}
	}
	if last != nil {
		f, err := l.fs.OpenFile(last.meta.path, os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		l.active, l.adict, l.arow = f, last.dict, last.row
		return nil
	}
	return l.newActive()
}

func (l *Ledger) logger() *zap.Logger { return l.logp.Load() }

// SetLogger replaces the logger of Options (the store gets its own after
// Open).
func (l *Ledger) SetLogger(log *zap.Logger) {
	if log != nil {
		l.logp.Store(log)
	}
}

// note takes a segment's position and sequence numbers into the ledger's.
func (l *Ledger) note(m *segMeta) {
	l.pos = max(l.pos, m.pos)
	if m.rows > 0 {
		l.lastSeq = max(l.lastSeq, m.lastSeq)
	}
}

// newActive starts an empty active segment after the last one. Its header
// carries the position, so Position survives even before its first block.
func (l *Ledger) newActive() error {
	base := l.lastSeq + 1
	if n := len(l.segs); n > 0 && l.segs[n-1].base >= base {
		base = l.segs[n-1].base + 1
	}
	path := filepath.Join(l.dir, segName(base, rawExt))
	f, err := l.fs.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	created := l.opts.Now().UnixNano()
	_, err = f.Write(encodeRawHeader(l.pos, created))
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = l.fs.SyncDir(l.dir)
	}
	if err != nil {
		f.Close()
		l.fs.Remove(path)
		return err
	}
	l.segs = append(l.segs, &segMeta{base: base, path: path, startPos: l.pos, pos: l.pos, created: created, size: rawHeaderLen})
	l.active, l.adict, l.arow = f, newDict(), rowState{}
	return nil
}

// ErrClosed is returned after Close.
var ErrClosed = errors.New("ledger closed")

// Append makes entries durable (written and synced) and records that they
// cover settlement-log positions up to upto. Entries must have increasing
// Seq, above every Seq appended before; upto never goes back. An empty
// batch with a new upto only moves the position.
func (l *Ledger) Append(entries []store.LedgerEntry, upto uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if l.broken != nil {
		return fmt.Errorf("ledger: a failed write could not be undone, reopen the ledger: %w", l.broken)
	}
	if upto < l.pos {
		return fmt.Errorf("ledger: position %d is before the ledger's %d", upto, l.pos)
	}
	if len(entries) == 0 && upto == l.pos {
		return nil
	}
	seq := l.lastSeq
	for i := range entries {
		if entries[i].Seq <= seq {
			return fmt.Errorf("ledger: entry seq %d does not follow %d", entries[i].Seq, seq)
		}
		seq = entries[i].Seq
	}
	seg := l.segs[len(l.segs)-1]

	// The block: position, the dictionary ids it adds, the rows.
	var pending []string
	ids := make([][5]uint64, len(entries))
	for i := range entries {
		e := &entries[i]
		for j, s := range [5]string{e.UserID, e.ServiceID, e.EndpointID, e.ProductID, e.Source} {
			ids[i][j] = l.adict.lookup(s, &pending)
		}
	}
	w := colWriter{rowMode: true}
	w.cols[0] = make([]byte, framed.HeaderSize, framed.HeaderSize+64+len(entries)*48)
	w.uvarint(0, upto)
	w.uvarint(0, uint64(len(pending)))
	for _, s := range pending {
		w.str(0, s)
	}
	w.uvarint(0, uint64(len(entries)))
	row := l.arow
	for i := range entries {
		if err := encodeEntry(&w, &row, &entries[i], ids[i]); err != nil {
			return err
		}
	}
	b := w.cols[0]
	payload := b[framed.HeaderSize:]
	if len(payload) > maxBlock {
		return fmt.Errorf("ledger: a batch of %d bytes is over the %d a block holds; append smaller batches", len(payload), maxBlock)
	}
	framed.Put(b)
	if _, err := l.active.Write(b); err != nil {
		return l.undo(seg, err)
	}
	if err := l.active.Sync(); err != nil {
		return l.undo(seg, err)
	}
	for _, s := range pending {
		l.adict.add(s)
	}
	l.arow = row
	seg.size += int64(len(b))
	seg.pos = upto
	l.pos = upto
	for i := range entries {
		seg.note(&entries[i])
		l.roll.add(&entries[i])
	}
	if len(entries) > 0 {
		l.lastSeq = seq
	}
	if seg.rows > 0 && (seg.size >= l.opts.SealBytes || time.Duration(l.opts.Now().UnixNano()-seg.created) >= l.opts.SealAge) {
		l.rotate()
	}
	return nil
}

// undo cuts the active segment back to its last whole block after a
// failed write, so that a retry does not follow garbage. If even that
// fails the ledger refuses appends until it is reopened (Open drops the
// torn tail).
func (l *Ledger) undo(seg *segMeta, err error) error {
	if terr := l.active.Truncate(seg.size); terr != nil {
		l.broken = err
	}
	return fmt.Errorf("ledger: append: %w", err)
}

// Position is the settlement-log position everything up to which is in
// the ledger.
func (l *Ledger) Position() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pos
}

// LastSeq is the highest Seq appended (0 for an empty ledger).
func (l *Ledger) LastSeq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastSeq
}

// LastTime is the Time of the newest row (zero for an empty ledger): the
// store's floor for the next row's time, which never goes backwards.
func (l *Ledger) LastTime() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last int64 = math.MinInt64
	for _, m := range l.segs {
		if m.rows > 0 {
			last = max(last, m.maxTime)
		}
	}
	if last == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, last).UTC()
}

// Stats describes the ledger on disk.
type Stats struct {
	Segments, Sealed int
	Rows             int64
	Bytes            int64
	Rollups          int
	Position         uint64
	LastSeq          uint64
}

// Stats returns the ledger's size.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Stats{Segments: len(l.segs), Rollups: l.roll.n, Position: l.pos, LastSeq: l.lastSeq}
	for _, m := range l.segs {
		if m.sealed {
			s.Sealed++
		}
		s.Rows += m.rows
		s.Bytes += m.size
	}
	return s
}

// Abandon lets go of the ledger as a crash would: no rollup log frame is
// written and the active segment is left as it is, so the next Open
// replays the rows after the last frame into the rollups. For tests that
// simulate a crash (the store's too); everything else calls Close.
func (l *Ledger) Abandon() {
	l.closing.Do(func() {
		close(l.done)
		l.wg.Wait()
		l.mu.Lock()
		l.closed = true
		l.active.Close()
		l.rlog.Close()
		l.mu.Unlock()
	})
}

// Close stops background sealing, writes a rollup log frame so the next
// Open replays nothing, and closes the active segment.
func (l *Ledger) Close() error {
	err := ErrClosed
	l.closing.Do(func() {
		close(l.done)
		l.wg.Wait()
		err = l.saveRollups()
		l.mu.Lock()
		l.closed = true
		if cerr := l.active.Close(); err == nil {
			err = cerr
		}
		if cerr := l.rlog.Close(); err == nil {
			err = cerr
		}
		l.mu.Unlock()
	})
	if err == ErrClosed {
		return nil
	}
	return err
}
