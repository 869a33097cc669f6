package settlelog

import (
	"fmt"
	"time"

	"github.com/platformgw/gateway/internal/store/framed"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// The writer: appends, sync mode's group commit and write mode's
// background fdatasync.

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
	if l.broken != nil {
		return 0, nil, l.broken
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
		if l.opts.Inline {
			b.inline = l
		}
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
		// A part of buf may have been written, whole records of it too:
		// cut off, as a refused batch is.
		if cerr := l.cutRefused(l.curSize); cerr != nil {
			l.broken = cerr
		}
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
	if l.cur.Datasync() == nil {
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
func (l *Log) beginSync() vfs.File {
	if l.cur != nil {
		l.syncing++
	}
	return l.cur
}

func (l *Log) endSync(f vfs.File) {
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
	var next time.Time // when the next fdatasync may start (paced)
	pace := time.NewTimer(time.Hour)
	pace.Stop()
	defer pace.Stop()
	for {
		select {
		case <-l.wake:
			if d := time.Until(next); d > 0 && !l.opts.Eager {
				pace.Reset(d)
				select {
				case <-pace.C:
				case <-l.stop:
					l.flush()
					return
				}
			}
			if start, took := l.flush(); took > 0 {
				next = start.Add(took + min((PaceFactor-1)*took, MaxPaceWait))
			}
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
	if f.Datasync() == nil {
		l.noteSynced(path, size, pos)
		l.observed(start, n)
	}
}

// flush writes and fdatasyncs the pending batch (sync mode), and returns
// when the fdatasync started and how long it took (0 when there was none).
func (l *Log) flush() (start time.Time, took time.Duration) {
	l.mu.Lock()
	b := l.batch
	l.batch = nil
	if b == nil {
		l.mu.Unlock()
		return start, 0
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
	var f vfs.File
	if err == nil {
		f = l.beginSync()
	}
	l.mu.Unlock()
	early := plantedAckBeforeSync && err == nil
	if early {
		close(b.done) // the planted bug (planted_on.go): told before the sync
	}
	if err == nil {
		defer l.endSync(f)
		start = time.Now()
		err = f.Datasync()
		took = max(time.Since(start), 1)
		if err == nil {
			l.noteSynced(path, size, b.end)
			l.observed(start, b.n)
		} else {
			err = fmt.Errorf("sync settlement log: %w", err)
			l.mu.Lock()
			if l.cur == f {
				// The batch is refused: cut it off so that it is never
				// replayed, and start anew.
				if cerr := l.cutRefused(before); cerr != nil {
					l.broken = cerr
				}
				l.cur.Close()
				l.cur = nil
			}
			l.mu.Unlock()
		}
	}
	if !early {
		b.err = err
		close(b.done)
	}
	return start, took
}

// cutRefused cuts a refused batch, everything of the current segment from
// before on, off the disk, so that no later start replays a record whose
// caller was told it failed. After a failed fdatasync some of the batch
// may be on the disk (fsyncgate), so the cut is synced too: unsynced, a
// power loss could undo it (found by the storage simulation, seed 23).
// When the segment cannot be cut and synced in place, its records before
// the batch are copied to a new file that replaces it. An error means the
// refused records may still be there: the caller stops appending (broken).
// Called with l.mu held.
func (l *Log) cutRefused(before int64) error {
	if l.cur.Truncate(before) == nil && l.cur.Datasync() == nil {
		return nil
	}
	path := l.curSeg.path
	data, err := l.fs.ReadFile(path)
	if err == nil && int64(len(data)) < before {
		err = fmt.Errorf("read %d bytes back, want %d", len(data), before)
	}
	if err == nil {
		err = vfs.WriteFileAtomic(l.fs, path, path+cutSuffix, data[:before])
	}
	if err != nil {
		return fmt.Errorf("settlement log segment %s: a refused batch could not be cut off (%w); "+
			"no settlement is taken until the disk is repaired and the gateway restarted, and that start "+
			"may replay the refused records of positions %d and after in it", path, err, l.curSeg.start+uint64(before-headerSize))
	}
	return nil
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
