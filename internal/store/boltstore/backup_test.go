package boltstore

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/platformgw/gateway/internal/store"
)

// TestBackup copies a store while it serves, settlements going on: the
// stream is a tar of the file and the ledger directory of the length said
// first; restored to a new path it checks, opens, holds the keys, and its
// ledger, rollups and counters agree with each other and hold every
// settlement acknowledged before the backup began.
func TestBackup(t *testing.T) {
	path := storePath(t)
	n := filledStore(t, path)
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	for range 300 {
		if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
			t.Fatal(err)
		}
	}
	// Seal a segment, so that the copy has sealed and raw segments (the
	// rows reach the ledger when the applier applies them: apply first).
	if err := s.applyAll(); err != nil {
		t.Fatal(err)
	}
	if err := s.led.Seal(); err != nil {
		t.Fatal(err)
	}
	before := len(ledger(t, s, store.LedgerFilter{}))
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 2000 && !stop.Load(); i++ {
				if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var buf bytes.Buffer
	var told int64
	written, err := s.Backup(&buf, func(n int64) { told = n })
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if written != int64(buf.Len()) || told != written {
		t.Errorf("Backup wrote %d, said %d, buffer %d", written, told, buf.Len())
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if len(names) < 4 || names[0] != "store.db" || !strings.HasPrefix(names[1], "store.db.ledger/") {
		t.Errorf("backup holds %v; want store.db, then the ledger's sealed and raw segments and rollup log", names)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".platform-backup-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}

	copyPath := filepath.Join(t.TempDir(), "restored", "platform.db")
	rep, err := Restore(bytes.NewReader(buf.Bytes()), copyPath)
	if err != nil || rep.Buckets[string(bucketKeys)] != n || rep.LedgerRows < int64(before) {
		t.Fatalf("Restore: %+v, %v (ledger rows before the backup %d)", rep, err, before)
	}
	if _, err := Restore(bytes.NewReader(buf.Bytes()), copyPath); !errors.Is(err, ErrExists) {
		t.Errorf("a restore over a store: %v", err)
	}
	if _, err := Restore(strings.NewReader("not a tar"), filepath.Join(t.TempDir(), "x.db")); err == nil {
		t.Error("a restore of garbage succeeded")
	}
	c := openAt(t, copyPath)
	defer c.Close()
	if k, err := c.KeyByID(ctx, "key_31_059"); err != nil || k.UserID != "user-059" {
		t.Errorf("key in the backup: %+v, %v", k, err)
	}
	rows := ledger(t, c, store.LedgerFilter{UserID: "u1"})
	units, _ := sumUnits(rows)
	if st := stateOf(t, c, a, t0); st.Used != units || len(rows) < before {
		t.Errorf("restored: counter used %s, ledger %s in %d rows (%d before the backup)", st.Used, units, len(rows), before)
	}
	checkRollups(t, c)
	s.Close()
}

// TestOpenRemovesStaleBackupDirs: the directories a backup or restore
// killed mid-copy left beside the store are removed when the store opens,
// and the log says which; another store's, and other files, are left.
func TestOpenRemovesStaleBackupDirs(t *testing.T) {
	path := storePath(t)
	dir := filepath.Dir(path)
	s := openAt(t, path)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	stale := []string{".platform-backup-platform.db-123", ".platform-restore-platform.db-45", ".platform-backup-678"}
	kept := []string{".platform-backup-other.db-9", ".platform-restore-7", ".platform-backup-x1"}
	for _, d := range append(slices.Clone(stale), kept...) {
		if err := os.MkdirAll(filepath.Join(dir, d, "store.db.ledger"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, d, "store.db"), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, ".platform-backup-platform.db-file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, ".platform-backup-platform.db-file") // not a directory: not ours

	s = openAt(t, path)
	core, logs := observer.New(zapcore.DebugLevel)
	s.SetLogger(zap.New(core))
	for _, d := range stale {
		if _, err := os.Lstat(filepath.Join(dir, d)); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", d, err)
		}
	}
	for _, d := range kept {
		if _, err := os.Lstat(filepath.Join(dir, d)); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
	var said []string
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "interrupted backup") {
			said = append(said, e.Message)
		}
	}
	if len(said) != 1 || !strings.Contains(said[0], "removed 3 directories") || !strings.Contains(said[0], stale[0]) {
		t.Errorf("log lines %q; want one naming the 3 directories removed", said)
	}
	// A backup works in a directory named for the store, gone when it ends.
	var buf bytes.Buffer
	if _, err := s.Backup(&buf, nil); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".platform-backup-platform.db-*")); len(left) != 1 {
		t.Errorf("after a backup: %v; want only the file", left)
	}
}

// TestRestoreRefusesLeftoverSettlementLog: settlement log segments of the
// store that was there (a crash leaves them) would be replayed onto the
// restored file at its start, charging the restored store with calls of
// another history (here 20 rows of a user the backup has no subscription
// for). The restore refuses the path, names the segment, and changes
// nothing, as it does for a file or a ledger directory that is there.
func TestRestoreRefusesLeftoverSettlementLog(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	for range 10 {
		if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := s.Backup(&buf, nil); err != nil {
		t.Fatal(err)
	}
	b := subscribe(t, s, "u2", "svc", unlimited, 0)
	for range 20 {
		if _, err := s.Record(ctx, b, entryFor(b, whole(1), t0), okResponse); err != nil {
			t.Fatal(err)
		}
	}
	crash(t, s)
	segs, _ := filepath.Glob(path + ".*.settle")
	if len(segs) == 0 {
		t.Fatal("the crash left no settlement log segment")
	}
	// The operator moves the file and its ledger aside, not the segments.
	aside := t.TempDir()
	for _, p := range []string{path, LedgerDir(path)} {
		if err := os.Rename(p, filepath.Join(aside, filepath.Base(p))); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Restore(bytes.NewReader(buf.Bytes()), path)
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), filepath.Base(segs[0])) {
		t.Fatalf("restore beside a settlement log segment: %v; want ErrExists naming %s", err, segs[0])
	}
	for _, p := range []string{path, LedgerDir(path)} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("the refused restore made %s: %v", p, err)
		}
	}
	// Once the segments are moved away too, the restore is the backup.
	for _, p := range segs {
		if err := os.Rename(p, filepath.Join(aside, filepath.Base(p))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Restore(bytes.NewReader(buf.Bytes()), path); err != nil {
		t.Fatal(err)
	}
	c := openAt(t, path)
	if rows := ledger(t, c, store.LedgerFilter{}); len(rows) != 10 {
		t.Errorf("restored store has %d ledger rows, the backup 10", len(rows))
	}
}

// TestBackupLargeFile: a file of 8 GiB or more (a store file that held the
// ledger before the ledger directory keeps its size until compacted) does
// not fit a ustar header's size field. The backup wrote every part as
// ustar, so the header of such a file failed after the answer's status and
// length had gone out, and no backup of the store could ever be made. Its
// header is still one 512-byte block (the length said first stays exact),
// read back with the file's size.
func TestBackupLargeFile(t *testing.T) {
	src := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 8<<30 + 4096 // sparse: no disk is used
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, _ := os.Stat(src)
	w := &stopAfter{left: 512 + 4096}
	err = addFile(tar.NewWriter(w), src, backupFile{name: backupStoreName, size: st.Size(), mod: st.ModTime()})
	if !errors.Is(err, errStopped) {
		t.Fatalf("addFile of a %d-byte file: %v; want its header and content written", int64(size), err)
	}
	h, err := tar.NewReader(bytes.NewReader(w.buf.Bytes())).Next()
	if err != nil || h.Name != backupStoreName || h.Size != size || h.Typeflag != tar.TypeReg {
		t.Fatalf("header read back: %+v, %v", h, err)
	}
	if w.buf.Len() != 512+4096 {
		t.Errorf("wrote %d bytes before the content's first 4096; want one 512-byte header", w.buf.Len()-4096)
	}
}

var errStopped = errors.New("stopped")

// stopAfter takes left bytes, then fails.
type stopAfter struct {
	buf  bytes.Buffer
	left int
}

func (s *stopAfter) Write(p []byte) (int, error) {
	n := min(len(p), s.left)
	s.buf.Write(p[:n])
	s.left -= n
	if n < len(p) {
		return n, errStopped
	}
	return n, nil
}

// TestOpenRefusesStoreRemainsWithoutFile: a store path whose file is not
// there while its ledger directory, or a segment of its settlement log, is
// (a restore cut off between moving the ledger directory and the file into
// place, the file alone moved or deleted) was started as a new, empty
// store: every key, subscription and credit gone, and the old ledger rows
// (or the log's settlements, replayed) carried on under it. It is refused,
// naming what is there, and no file is made.
func TestOpenRefusesStoreRemainsWithoutFile(t *testing.T) {
	t.Run("ledger directory", func(t *testing.T) {
		path := storePath(t)
		s := openAt(t, path)
		a := subscribe(t, s, "u1", "svc", unlimited, 0)
		for range 10 {
			if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path, filepath.Join(t.TempDir(), "platform.db")); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, path, LedgerDir(path))
	})
	t.Run("settlement log", func(t *testing.T) {
		path := storePath(t)
		s := openAt(t, path)
		a := subscribe(t, s, "u1", "svc", unlimited, 0)
		if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
			t.Fatal(err)
		}
		crash(t, s)
		aside := t.TempDir()
		for _, p := range []string{path, LedgerDir(path)} {
			if err := os.Rename(p, filepath.Join(aside, filepath.Base(p))); err != nil {
				t.Fatal(err)
			}
		}
		segs, _ := filepath.Glob(path + ".*.settle")
		if len(segs) == 0 {
			t.Fatal("the crash left no settlement log segment")
		}
		wantRefused(t, path, segs[0])
	})
	t.Run("empty ledger directory", func(t *testing.T) {
		// An empty directory holds nothing to lose: a new store starts.
		path := storePath(t)
		if err := os.Mkdir(LedgerDir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		openAt(t, path).Close()
	})
}

func wantRefused(t *testing.T, path, there string) {
	t.Helper()
	s, err := Open(path)
	if err == nil {
		rows := ledger(t, s, store.LedgerFilter{})
		s.Close()
		t.Fatalf("opened a new store at %s beside %s (%d ledger rows in it)", path, there, len(rows))
	}
	if !strings.Contains(err.Error(), there) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Open: %v; want it to name %s", err, there)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the refused open made %s: %v", path, err)
	}
}
