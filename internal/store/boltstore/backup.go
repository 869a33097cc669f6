package boltstore

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store/settlelog"
)

// A backup is a tar stream (POSIX ustar; a file of 8 GiB or more has a GNU
// header, headerFormat) of two parts taken at one moment:
//
//	store.db                 the store file (bbolt's Tx.WriteTo)
//	store.db.ledger/<file>   the ledger directory (LedgerDir)
//
// Restore unpacks it to any store path. The settlement log is not in it:
// the copy is taken with every settlement acknowledged before the backup
// began applied to the file and the ledger, and the applier held while
// both are copied, so the two agree and nothing is waiting in a log.
// docs/operations.md (backups) says how to make and restore one.
const (
	backupStoreName  = "store.db"
	backupLedgerName = "store.db.ledger"
)

// Backup writes a consistent, complete copy of the store to w while it
// serves (see the format above). The copy is made in a directory next to
// the store first (the ledger's sealed segments hard-linked, so it costs
// little room), with the applier held only for that: a slow reader of w
// holds neither a transaction nor the applier. size, if not nil, is told
// the stream's length before the first byte is written. It returns the
// bytes written to w.
func (s *Store) Backup(w io.Writer, size func(int64)) (int64, error) {
	fail := func(err error) (int64, error) { return 0, fmt.Errorf("backup of store %s: %w", s.path, err) }
	if err := s.ready(); err != nil {
		return fail(err)
	}
	if err := s.applyAll(); err != nil { // the copy holds every settlement acknowledged
		return fail(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(s.path), tempPrefix(backupTemp, s.path)+"*")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmp)
	if err := s.snapshot(tmp); err != nil {
		return fail(err)
	}
	files, total, err := backupFiles(tmp)
	if err != nil {
		return fail(err)
	}
	if size != nil {
		size(total)
	}
	cw := &countWriter{w: w}
	tw := tar.NewWriter(cw)
	for _, f := range files {
		if err := addFile(tw, filepath.Join(tmp, filepath.FromSlash(f.name)), f); err != nil {
			return cw.n, fmt.Errorf("backup of store %s: %w", s.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return cw.n, fmt.Errorf("backup of store %s: %w", s.path, err)
	}
	return cw.n, nil
}

// snapshot copies the file and the ledger into dir with the applier held,
// so that both stop at the same settlement-log position.
func (s *Store) snapshot(dir string) error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	var applied uint64
	err := s.view(func(tx *bolt.Tx) error {
		applied = markerU64(tx.Bucket(bucketMarker), keySettled)
		f, err := os.OpenFile(filepath.Join(dir, backupStoreName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = tx.WriteTo(f)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return err
	}
	if pos := s.led.Position(); pos != applied {
		// A batch the ledger took but the file's commit failed: the
		// applier retries it.
		return fmt.Errorf("the ledger (at %d) and the file (at %d) are between two applies; try again", pos, applied)
	}
	return s.led.Snapshot(filepath.Join(dir, backupLedgerName))
}

// The directories Backup and Restore work in, beside the store file, are
// named for it (".platform-backup-<file>-<random>"), so that the process
// that opens the store, and holds its lock, knows those left there are its
// own: a backup is made by the process holding the store, a restore only
// to a store file that does not exist yet. One left behind (the process
// was killed mid-copy) is removed by the next Open.
const (
	backupTemp  = ".platform-backup-"
	restoreTemp = ".platform-restore-"
)

func tempPrefix(kind, storePath string) string { return kind + filepath.Base(storePath) + "-" }

// removeStaleTemps removes the directories an interrupted backup or
// restore left beside the store at path, and those of older versions
// (".platform-backup-<digits>", not yet named for their store), and returns
// what it did for the log ("" when there was nothing, warn when it could
// not remove one).
func removeStaleTemps(path string) (note string, warn bool) {
	dir := filepath.Dir(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Sprintf("could not look for directories of an interrupted backup next to the store: %v", err), true
	}
	var removed, failed []string
	for _, e := range entries {
		name := e.Name()
		old, digits := strings.CutPrefix(name, backupTemp)
		stale := strings.HasPrefix(name, tempPrefix(backupTemp, path)) || strings.HasPrefix(name, tempPrefix(restoreTemp, path)) ||
			digits && old != "" && strings.Trim(old, "0123456789") == ""
		if !stale || !e.IsDir() {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			failed = append(failed, fmt.Sprintf("%s (%v)", name, err))
			continue
		}
		removed = append(removed, name)
	}
	if len(removed) > 0 {
		note = fmt.Sprintf("removed %d directories an interrupted backup or restore left in %s: %s",
			len(removed), dir, strings.Join(removed, ", "))
	}
	if len(failed) > 0 {
		note = strings.TrimPrefix(note+"; could not remove "+strings.Join(failed, ", "), "; ")
	}
	return note, len(failed) > 0
}

type backupFile struct {
	name string // slash-separated, in the stream
	size int64
	mod  time.Time
}

// backupFiles lists what the stream holds, in its order, and the stream's
// exact length: a ustar header of 512 bytes per file, its content padded
// to 512, and two zero blocks at the end.
func backupFiles(dir string) ([]backupFile, int64, error) {
	st, err := os.Stat(filepath.Join(dir, backupStoreName))
	if err != nil {
		return nil, 0, err
	}
	files := []backupFile{{name: backupStoreName, size: st.Size(), mod: st.ModTime()}}
	ents, err := os.ReadDir(filepath.Join(dir, backupLedgerName))
	if err != nil {
		return nil, 0, err
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			return nil, 0, err
		}
		files = append(files, backupFile{name: backupLedgerName + "/" + e.Name(), size: fi.Size(), mod: fi.ModTime()})
	}
	total := int64(1024)
	for _, f := range files {
		total += 512 + (f.size+511)/512*512
	}
	return files, total, nil
}

func addFile(tw *tar.Writer, src string, f backupFile) error {
	r, err := os.Open(src)
	if err != nil {
		return err
	}
	defer r.Close()
	err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Size: f.size, Mode: 0o600,
		ModTime: f.mod.UTC().Truncate(time.Second), Format: headerFormat(f.size)})
	if err != nil {
		return err
	}
	n, err := io.Copy(tw, r)
	if err == nil && n != f.size {
		err = fmt.Errorf("%s: %d bytes, want %d", src, n, f.size)
	}
	return err
}

// ustarMaxSize is the largest size a ustar header holds (11 octal digits).
const ustarMaxSize = 1<<33 - 1

// headerFormat is ustar, or for a file too large for it (a store file that
// held the ledger before the ledger directory keeps its size until it is
// compacted) GNU tar's, which writes the size in base-256 in the same
// 512-byte header: the stream's length backupFiles computes stays exact,
// and GNU tar, bsdtar and Go's archive/tar read it.
func headerFormat(size int64) tar.Format {
	if size > ustarMaxSize {
		return tar.FormatGNU
	}
	return tar.FormatUSTAR
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ErrExists is returned by Restore when the target store file or its
// ledger directory exists: a restore never replaces a store.
var ErrExists = errors.New("a store is there already")

// Restore unpacks a backup (Backup's stream, or the file `caddy platform
// store backup` wrote) to the store file at path and its ledger
// directory, then checks the result like CheckFile. Neither may exist,
// nor a segment of the settlement log of path (settlelog.Segments). It
// unpacks into a directory next to path first and moves the parts into
// place only once the stream is whole and checks, the ledger directory
// before the file, so an interrupted restore leaves no store that starts.
func Restore(r io.Reader, storePath string) (Report, error) {
	fail := func(err error) (Report, error) { return Report{}, fmt.Errorf("restore to %s: %w", storePath, err) }
	for _, p := range []string{storePath, LedgerDir(storePath)} {
		if _, err := os.Lstat(p); err == nil {
			return fail(fmt.Errorf("%s exists: %w; restore to a new path, or move it away first", p, ErrExists))
		}
	}
	// Segments of the settlement log of the store that was there (a
	// crash leaves them) would be replayed onto the restored file at its
	// start: settlements of another history on top of the backup.
	segs, err := settlelog.Segments(storePath)
	if err != nil {
		return fail(err)
	}
	if len(segs) > 0 {
		return fail(fmt.Errorf("%s exists, a segment of the settlement log of the store that was there (its start would replay it onto the restored file): %w; move it away with that store, or restore to a new path",
			strings.Join(segs, ", "), ErrExists))
	}
	if err := os.MkdirAll(filepath.Dir(storePath), 0o700); err != nil {
		return fail(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(storePath), tempPrefix(restoreTemp, storePath)+"*")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Mkdir(filepath.Join(tmp, backupLedgerName), 0o700); err != nil {
		return fail(err)
	}
	tr := tar.NewReader(r)
	sawStore := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail(fmt.Errorf("not a whole store backup: %w", err))
		}
		name := h.Name
		dir, base := path.Split(name)
		ok := h.Typeflag == tar.TypeReg && (name == backupStoreName ||
			dir == backupLedgerName+"/" && base != "" && base != "." && base != ".." && !strings.ContainsAny(base, `/\`))
		if !ok {
			return fail(fmt.Errorf("not a store backup: it holds %q", name))
		}
		sawStore = sawStore || name == backupStoreName
		if err := writeRestored(filepath.Join(tmp, filepath.FromSlash(name)), tr); err != nil {
			return fail(err)
		}
	}
	if !sawStore {
		return fail(errors.New("not a store backup: it holds no store.db"))
	}
	if err := syncPath(filepath.Join(tmp, backupLedgerName)); err != nil {
		return fail(err)
	}
	rep, err := CheckFile(filepath.Join(tmp, backupStoreName))
	if err != nil {
		return fail(fmt.Errorf("the backup does not check: %w", err))
	}
	if err := os.Rename(filepath.Join(tmp, backupLedgerName), LedgerDir(storePath)); err != nil {
		return fail(err)
	}
	if err := os.Rename(filepath.Join(tmp, backupStoreName), storePath); err != nil {
		return fail(err)
	}
	return rep, syncPath(filepath.Dir(storePath))
}

func writeRestored(to string, r io.Reader) error {
	f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncPath(p string) error {
	d, err := os.Open(p)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
