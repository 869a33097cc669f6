// Package vfs is the small file-system interface under the store's
// append-only files: the settlement log (internal/store/settlelog), the
// ledger's segments and rollup log (internal/store/ledger) and framed's
// Repair. Production uses OS, the operating system's files; the storage
// simulation (sim.go, docs/reliability.md) uses Sim, a deterministic
// in-memory disk that loses unsynced writes at a crash and injects faults.
//
// The interface is what those files need and no more: open, read, write,
// sync, truncate, rename, list, remove. bbolt stays on the OS: it opens its
// file itself.
package vfs

import (
	"io"
	"os"
	"path/filepath"
)

// File is an open file.
type File interface {
	io.Reader
	io.Writer
	io.ReaderAt
	io.WriterAt
	Truncate(size int64) error
	// Sync is fsync: data and metadata durable.
	Sync() error
	// Datasync is fdatasync: the data, and the size when it changed.
	Datasync() error
	// Size is the file's size now.
	Size() (int64, error)
	Close() error
}

// FS is a file system. Errors wrap the os package's (os.ErrNotExist,
// os.ErrExist), as *os.File's do.
type FS interface {
	// OpenFile opens name with the flags of os.OpenFile.
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	// ReadFile reads the whole of name.
	ReadFile(name string) ([]byte, error)
	// ReadDir lists the names of the entries of dir, sorted.
	ReadDir(dir string) ([]string, error)
	Rename(from, to string) error
	Remove(name string) error
	MkdirAll(dir string) error
	// SyncDir makes the creations, renames and removals in dir durable.
	SyncDir(dir string) error
}

// Open opens name for reading.
func Open(fsys FS, name string) (File, error) { return fsys.OpenFile(name, os.O_RDONLY, 0) }

// Or is fsys, or OS when it is nil: the zero value of an options struct
// means the operating system.
func Or(fsys FS) FS {
	if fsys == nil {
		return OS
	}
	return fsys
}

// WriteFileAtomic replaces path by a file holding b: written to tmp,
// fsynced, renamed over path, the directory synced. On an error tmp is
// removed and path is as it was, or already b (the rename done, its
// directory sync failed).
func WriteFileAtomic(fsys FS, path, tmp string, b []byte) error {
	f, err := fsys.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fsys.Rename(tmp, path)
	}
	if err == nil {
		err = fsys.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		fsys.Remove(tmp)
	}
	return err
}
