package ledger

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/platformgw/gateway/internal/store/vfs"
)

// Snapshots: a consistent copy of the ledger directory, for backups.

// Snapshot writes a consistent copy of the ledger into dir (created; it
// must not exist): sealed segments hard-linked (they never change once
// written; copied where a link cannot be made), the raw segments and the
// rollup log copied up to the sizes that end with their last whole block
// and frame. The caller stops appending meanwhile (the store holds its
// applier); sealing and pruning wait until the copy is made. The copy
// opens as the ledger did at the moment of the snapshot.
func (l *Ledger) Snapshot(dir string) error {
	l.sealMu.Lock()
	defer l.sealMu.Unlock()
	l.snapMu.Lock()
	defer l.snapMu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	type part struct {
		path   string
		size   int64
		sealed bool
	}
	parts := make([]part, 0, len(l.segs)+1)
	for _, m := range l.segs {
		parts = append(parts, part{m.path, m.size, m.sealed})
	}
	parts = append(parts, part{filepath.Join(l.dir, rollupFile), l.rlogSize, false})
	l.mu.Unlock()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	for _, p := range parts {
		to := filepath.Join(dir, filepath.Base(p.path))
		if p.sealed {
			if err := os.Link(p.path, to); err == nil {
				continue
			}
			p.size = -1
		}
		if err := copyPrefix(l.fs, p.path, to, p.size); err != nil {
			return fmt.Errorf("ledger snapshot of %s: %w", p.path, err)
		}
	}
	return vfs.OS.SyncDir(dir)
}

// copyPrefix copies the first size bytes of from (all of it when size is
// negative) of from, on fsys, to a new file to (on the OS), synced.
func copyPrefix(fsys vfs.FS, from, to string, size int64) error {
	src, err := vfs.Open(fsys, from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	var r io.Reader = src
	if size >= 0 {
		r = io.LimitReader(src, size)
	}
	n, err := io.Copy(dst, r)
	if err == nil && size >= 0 && n != size {
		err = fmt.Errorf("%d bytes, want %d", n, size)
	}
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	return err
}
