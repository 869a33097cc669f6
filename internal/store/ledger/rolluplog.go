package ledger

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/platformgw/gateway/internal/store/vfs"
)

// The rollup log on disk (rollup.go has its frames): opened and started at
// Open, appended a frame at a time, rewritten whole when it has grown.

// openRollupLog opens the rollup log for appending (end is where its
// frames end: load cut a torn tail off already), or starts one.
func (l *Ledger) openRollupLog(path string, end int64) error {
	f, err := l.fs.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if end == 0 {
		// A new log: its header, durable before any frame.
		if err = f.Truncate(0); err == nil {
			_, err = f.WriteAt([]byte(rollupMagic), 0)
		}
		if err == nil {
			err = f.Sync()
		}
		if err == nil {
			err = l.fs.SyncDir(l.dir)
		}
		end = int64(len(rollupMagic))
	}
	if err != nil {
		f.Close()
		return err
	}
	l.rlog, l.rlogSize = f, end
	return nil
}

// rollupLogSlack is how much bigger than its content the rollup log may
// grow before it is rewritten whole.
const rollupLogSlack = 4

// saveRollups writes a rollup log frame covering every row appended so
// far: the rollups changed since the last frame, or, when the log has
// grown to rollupLogSlack times its content or a write failed, all of them
// in a new log.
func (l *Ledger) saveRollups() error {
	l.snapMu.Lock()
	defer l.snapMu.Unlock()
	l.mu.Lock()
	if l.lastSeq == l.rlogSeq && !l.roll.changed() && !l.rlogBroken {
		l.mu.Unlock()
		return nil
	}
	full := l.rlogBroken || (l.rlogSize > 16<<20 && l.rlogSize > rollupLogSlack*40*int64(l.roll.n))
	b, sent, gone := l.roll.frame(l.lastSeq, full)
	seq := l.lastSeq
	l.mu.Unlock()
	var err error
	if full {
		err = l.rewriteRollupLog(b)
	} else {
		err = l.appendRollupLog(b)
	}
	if err != nil {
		l.mu.Lock()
		l.roll.redo(sent, gone)
		l.mu.Unlock()
		l.rlogBroken = true
		return fmt.Errorf("ledger: writing the rollup log: %w", err)
	}
	l.rlogSeq = seq
	return nil
}

// appendRollupLog appends frame b, synced; a failed write is cut off.
func (l *Ledger) appendRollupLog(b []byte) error {
	_, err := l.rlog.WriteAt(b, l.rlogSize)
	if err == nil {
		err = l.rlog.Sync()
	}
	if err != nil {
		l.rlog.Truncate(l.rlogSize)
		return err
	}
	l.rlogSize += int64(len(b))
	return nil
}

// rewriteRollupLog replaces the log by one holding frame b (every rollup).
func (l *Ledger) rewriteRollupLog(b []byte) error {
	path := filepath.Join(l.dir, rollupFile)
	if err := vfs.WriteFileAtomic(l.fs, path, path+tmpExt, append([]byte(rollupMagic), b...)); err != nil {
		return err
	}
	f, err := l.fs.OpenFile(path, os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	l.rlog.Close()
	l.rlog, l.rlogSize = f, int64(len(rollupMagic)+len(b))
	l.rlogBroken = false
	return nil
}
