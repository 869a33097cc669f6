package settlelog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store/framed"
	"github.com/platformgw/gateway/internal/store/vfs"
)

func storeFile(t testing.TB) string { return filepath.Join(t.TempDir(), "platform.db") }

// appendAll starts a log at path and appends n records, "rec-<i>".
func appendAll(t testing.TB, path string, opts Options, n int) *Log {
	t.Helper()
	l, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(0); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		_, b, err := l.Append(fmt.Appendf(nil, "rec-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// replayed reopens the log at path and returns its records.
func replayed(t *testing.T, path string, after uint64) ([]string, *Log) {
	t.Helper()
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	if err := l.Replay(after, func(_ uint64, rec []byte) error {
		out = append(out, string(rec))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out, l
}

// TestAppendReplay: what both modes acknowledge is replayed in order, from
// any position, across segments; Release removes wholly applied segments
// only.
func TestAppendReplay(t *testing.T) {
	for _, mode := range []Mode{Sync, Write} {
		t.Run(mode.String(), func(t *testing.T) {
			path := storeFile(t)
			l := appendAll(t, path, Options{Mode: mode, SegmentBytes: 200}, 100)
			if n := len(l.Segments()); n < 3 {
				t.Fatalf("%d segments; want the log rotated", n)
			}
			l.Close(0) // nothing applied: every segment stays
			got, l2 := replayed(t, path, 0)
			if len(got) != 100 {
				t.Fatalf("%d records replayed, want 100", len(got))
			}
			for i, r := range got {
				if r != fmt.Sprintf("rec-%d", i) {
					t.Fatalf("record %d = %q", i, r)
				}
			}
			// From a position in the middle: exactly the records past it.
			var positions []uint64
			l2.Replay(0, func(pos uint64, _ []byte) error { positions = append(positions, pos); return nil })
			mid := positions[41]
			var after []string
			l2.Replay(mid, func(_ uint64, rec []byte) error { after = append(after, string(rec)); return nil })
			if len(after) != 58 || after[0] != "rec-42" {
				t.Fatalf("replay after record 41: %d records from %q", len(after), after[0])
			}
			// A new start carries on past the old records.
			if err := l2.Start(0); err != nil {
				t.Fatal(err)
			}
			pos, b, err := l2.Append([]byte("new"))
			if err != nil || b.Wait() != nil || pos <= positions[99] {
				t.Fatalf("append after restart: pos %d (last %d), %v", pos, positions[99], err)
			}
			before := len(l2.Segments())
			if err := l2.Release(mid); err != nil {
				t.Fatal(err)
			}
			if n := len(l2.Segments()); n >= before || n == 0 {
				t.Fatalf("Release kept %d of %d segments", n, before)
			}
			l2.Close(pos)
			ents, _ := os.ReadDir(filepath.Dir(path))
			if len(ents) != 0 {
				t.Fatalf("%d files left after everything was applied", len(ents))
			}
		})
	}
}

// lastSegment is the newest segment file of the log of path.
func lastSegment(t *testing.T, path string) string {
	t.Helper()
	m, _ := filepath.Glob(path + ".*" + segSuffix)
	if len(m) == 0 {
		t.Fatal("no segment")
	}
	return m[len(m)-1]
}

// TestTornTail: a record cut short or garbled at the very end of the log
// (a write a crash tore, never acknowledged) is dropped with a note; every
// record before it is replayed.
func TestTornTail(t *testing.T) {
	for name, damage := range map[string]func([]byte) []byte{
		"cut in the payload": func(b []byte) []byte { return b[:len(b)-3] },
		"cut in the frame":   func(b []byte) []byte { return b[:len(b)-len("rec-9")-5] },
		"checksum":           func(b []byte) []byte { b[len(b)-1] ^= 0xff; return b },
		"zeros after":        func(b []byte) []byte { return append(b, make([]byte, 100)...) },
	} {
		t.Run(name, func(t *testing.T) {
			path := storeFile(t)
			l := appendAll(t, path, Options{}, 10)
			l.Close(0)
			seg := lastSegment(t, path)
			data, _ := os.ReadFile(seg)
			os.WriteFile(seg, damage(data), 0o600)
			l2, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			want := 9
			if name == "zeros after" {
				want = 10
			}
			var n int
			l2.Replay(0, func(uint64, []byte) error { n++; return nil })
			if n != want || !strings.Contains(l2.TornTail, seg) {
				t.Fatalf("%d records, torn %q; want %d and a note naming %s", n, l2.TornTail, want, seg)
			}
		})
	}
}

// TestCorruptMiddle: damage before the end of the log stops the start with
// an error naming the file and the offset: the records after it cannot be
// skipped silently.
func TestCorruptMiddle(t *testing.T) {
	for name, segBytes := range map[string]int64{"an earlier segment": 150, "the last segment": 0} {
		t.Run(name, func(t *testing.T) {
			path := storeFile(t)
			l := appendAll(t, path, Options{SegmentBytes: segBytes}, 20)
			l.Close(0)
			segs, _ := filepath.Glob(path + ".*" + segSuffix)
			seg := segs[0] // with records after the damaged one either way
			data, _ := os.ReadFile(seg)
			data[headerSize+framed.HeaderSize] ^= 0xff // the first record's payload
			os.WriteFile(seg, data, 0o600)
			_, err := Open(path, Options{})
			off := fmt.Sprintf("offset %d", headerSize)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), seg) || !strings.Contains(err.Error(), off) {
				t.Errorf("Open = %v; want ErrCorrupt naming %s and %s", err, seg, off)
			}
		})
	}
}

// TestNotOurs: a file named like a segment that is not one, or of another
// format, is refused with a clear error; so is a directory that cannot be
// read.
func TestNotOurs(t *testing.T) {
	path := storeFile(t)
	seg := filepath.Join(filepath.Dir(path), segName("platform.db", 0))
	os.WriteFile(seg, []byte("SQLite format 3\x00 and more bytes than a header"), 0o600)
	if _, err := Open(path, Options{}); !errors.Is(err, ErrNotOurs) || !strings.Contains(err.Error(), seg) {
		t.Errorf("foreign file: %v", err)
	}
	l := appendAll(t, storeFile(t), Options{}, 1)
	l.Close(0)
	other := lastSegment(t, l.curSeg.path[:strings.Index(l.curSeg.path, ".db")+3])
	data, _ := os.ReadFile(other)
	data[8] = 9 // format version 9
	os.WriteFile(other, data, 0o600)
	if _, err := Open(filepath.Join(filepath.Dir(other), "platform.db"), Options{}); err == nil {
		t.Error("a segment of another version (bad header checksum) opened")
	}
	if os.Geteuid() != 0 { // root reads any directory
		dir := t.TempDir()
		os.Chmod(dir, 0)
		defer os.Chmod(dir, 0o700)
		if _, err := Open(filepath.Join(dir, "platform.db"), Options{}); err == nil {
			t.Error("unreadable directory opened")
		}
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing", "platform.db"), Options{}); err == nil {
		t.Error("missing directory opened")
	}
}

// TestGroupSync: concurrent appenders in sync mode share fdatasyncs, and
// every acknowledged record is within the synced position.
func TestGroupSync(t *testing.T) {
	path := storeFile(t)
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(0); err != nil {
		t.Fatal(err)
	}
	var syncs, records int
	var mu sync.Mutex
	l.Observe(func(_ time.Duration, n int) { mu.Lock(); syncs++; records += n; mu.Unlock() })
	var wg sync.WaitGroup
	var failed bool
	for range 32 {
		wg.Go(func() {
			for range 20 {
				pos, b, err := l.Append([]byte("x"))
				if err == nil {
					err = b.Wait()
				}
				if err != nil || l.SyncedPosition() < pos {
					mu.Lock()
					failed = true
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	l.Close(0)
	if failed || records != 640 || syncs >= 640 {
		t.Fatalf("failed %v; %d records in %d syncs", failed, records, syncs)
	}
	t.Logf("%d records in %d fdatasyncs", records, syncs)
}

// TestWriteModeSyncsInBackground: write mode acknowledges once written,
// and the background flush makes it durable within the flush interval.
func TestWriteModeSyncsInBackground(t *testing.T) {
	path := storeFile(t)
	l, err := Open(path, Options{Mode: Write, FlushInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(0); err != nil {
		t.Fatal(err)
	}
	defer l.Close(0)
	pos, b, err := l.Append([]byte("x"))
	if err != nil || b != nil {
		t.Fatalf("write mode append: %v, batch %v", err, b)
	}
	for i := 0; l.SyncedPosition() < pos; i++ {
		if i == 5000 {
			t.Fatal("never synced")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestInline: with Options.Inline nothing runs in the background: an
// appended record is neither written nor synced until its batch is waited
// for (or the log closed), then it is durable, in the waiter's goroutine.
func TestInline(t *testing.T) {
	path := storeFile(t)
	l, err := Open(path, Options{Inline: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(0); err != nil {
		t.Fatal(err)
	}
	pos, b, err := l.Append([]byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if done, _ := b.Done(); done || l.SyncedPosition() >= pos {
		t.Fatal("an inline log wrote a batch nobody waited for")
	}
	if err := b.Wait(); err != nil || l.SyncedPosition() < pos {
		t.Fatalf("after Wait: %v, synced to %d, want %d", err, l.SyncedPosition(), pos)
	}
	last, _, _ := l.Append([]byte("b"))
	l.Close(0)
	got, l2 := replayed(t, path, 0)
	l2.Close(last)
	if len(got) != 2 || got[1] != "b" {
		t.Fatalf("replayed %q: Close did not write the pending batch", got)
	}
}

// TestHeaderlessLastSegment: a last segment that a crash left between its
// creation and its header's fdatasync (empty, zeros, a part of the header)
// holds no record: Open removes it and says so. Anywhere but last, and a
// short file that is not a part of our header, it is an error still.
func TestHeaderlessLastSegment(t *testing.T) {
	for name, content := range map[string][]byte{"empty": nil, "zeros": make([]byte, 4096), "part of the header": []byte(magic[:5])} {
		path := storeFile(t)
		l := appendAll(t, path, Options{}, 3)
		last := l.End()
		l.Close(0)
		seg := filepath.Join(filepath.Dir(path), segName("platform.db", last+100))
		os.WriteFile(seg, content, 0o600)
		got, l2 := replayed(t, path, 0)
		if len(got) != 3 || !strings.Contains(l2.TornTail, "without a header") {
			t.Errorf("%s: replayed %d records, torn tail note %q", name, len(got), l2.TornTail)
		}
		l2.Close(0)
		if _, err := os.Stat(seg); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the headerless segment is still there: %v", name, err)
		}
	}
	path := storeFile(t)
	seg := filepath.Join(filepath.Dir(path), segName("platform.db", 0))
	os.WriteFile(seg, []byte("SQLite"), 0o600)
	if _, err := Open(path, Options{}); !errors.Is(err, ErrNotOurs) {
		t.Errorf("a short foreign file: %v", err)
	}
}

// slowSyncFS is the OS's file system with an fdatasync that takes d, and
// records when each started.
type slowSyncFS struct {
	vfs.FS
	d      time.Duration
	mu     sync.Mutex
	starts []time.Time
}

type slowSyncFile struct {
	vfs.File
	fs *slowSyncFS
}

func (f *slowSyncFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return slowSyncFile{file, f}, nil
}

func (f slowSyncFile) Datasync() error {
	f.fs.mu.Lock()
	f.fs.starts = append(f.fs.starts, time.Now())
	f.fs.mu.Unlock()
	time.Sleep(f.fs.d)
	return f.File.Datasync()
}

// TestPacedGroupCommit: sync mode paces its fdatasyncs. With callers
// settling all the time, the next fdatasync starts no sooner than
// PaceFactor times the last one's duration after it started (so more
// records share each), while Eager starts each as soon as the one before
// ended; a record appended to an idle log is synced at once either way.
func TestPacedGroupCommit(t *testing.T) {
	run := func(took time.Duration, eager bool) (starts []time.Time, records, syncs int) {
		fs := &slowSyncFS{FS: vfs.OS, d: took}
		l, err := Open(storeFile(t), Options{FS: fs, Eager: eager})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(0); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		l.Observe(func(_ time.Duration, n int) { mu.Lock(); syncs++; records += n; mu.Unlock() })
		// An idle log: the first record's fdatasync starts at once.
		appended := time.Now()
		_, b, err := l.Append([]byte("first"))
		if err == nil {
			err = b.Wait()
		}
		if err != nil {
			t.Fatal(err)
		}
		fs.mu.Lock()
		waited := fs.starts[len(fs.starts)-1].Sub(appended)
		fs.mu.Unlock()
		if took >= 20*time.Millisecond && waited >= took {
			t.Errorf("eager %v: an idle log's first fdatasync started %v after the append", eager, waited)
		}
		// Then 8 callers settle one record after another for 12 syncs' time.
		var wg sync.WaitGroup
		deadline := time.Now().Add(12 * took)
		for range 8 {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					_, b, err := l.Append([]byte("x"))
					if err == nil {
						err = b.Wait()
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		l.Close(0)
		fs.mu.Lock()
		defer fs.mu.Unlock()
		return fs.starts, records, syncs
	}
	// Paced: between two fdatasyncs of the busy part, at least
	// PaceFactor times one's duration, or one's duration and MaxPaceWait
	// when that is less (Close's last one aside; the slack is the write
	// before each fdatasync). A fast disk (2 ms) meets the factor, a slow
	// one (20 ms) the cap.
	var pacedRecords, pacedSyncs int
	for _, took := range []time.Duration{2 * time.Millisecond, 20 * time.Millisecond} {
		var paced []time.Time
		paced, pacedRecords, pacedSyncs = run(took, false)
		want := took + min((PaceFactor-1)*took, MaxPaceWait) - time.Millisecond/2
		for i := 2; i < len(paced)-1; i++ {
			if gap := paced[i].Sub(paced[i-1]); gap < want {
				t.Errorf("paced, %v fdatasyncs: fdatasync %d started %v after the one before, want >= %v", took, i, gap, want)
			}
		}
	}
	const took = 20 * time.Millisecond
	eager, eagerRecords, eagerSyncs := run(took, true)
	// Eager: each starts right after the one before (well under twice
	// its duration).
	short := 0
	for i := 2; i < len(eager)-1; i++ {
		if eager[i].Sub(eager[i-1]) < 2*took {
			short++
		}
	}
	if short == 0 {
		t.Errorf("eager: no fdatasync started right after the one before: %v", eager)
	}
	if pacedSyncs >= eagerSyncs || pacedRecords/pacedSyncs <= eagerRecords/eagerSyncs {
		t.Errorf("paced: %d records in %d fdatasyncs; eager: %d in %d: pacing shared none", pacedRecords, pacedSyncs, eagerRecords, eagerSyncs)
	}
	t.Logf("paced: %d records in %d fdatasyncs; eager: %d in %d", pacedRecords, pacedSyncs, eagerRecords, eagerSyncs)
}

// faultFS is the OS's file system with faults a test switches on: the
// next fdatasync of a segment fails (its data stays in the file, as after
// a real EIO, where some of it may reach the disk), truncation fails, and
// renames fail.
type faultFS struct {
	vfs.FS
	delay        time.Duration // every fdatasync of a segment takes this long
	failSync     atomic.Int32  // fdatasyncs of segments left to fail
	failAll      atomic.Bool   // every fdatasync of a segment fails
	failTruncate atomic.Bool
	failRename   atomic.Bool
	failWrite    atomic.Bool // the next write to a segment writes most of its bytes, then fails
}

type faultFile struct {
	vfs.File
	fs   *faultFS
	name string
}

func (f *faultFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return faultFile{file, f, name}, nil
}

func (f *faultFS) Rename(from, to string) error {
	if f.failRename.Load() {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.EIO}
	}
	return f.FS.Rename(from, to)
}

func (f faultFile) Datasync() error {
	if strings.HasSuffix(f.name, segSuffix) {
		time.Sleep(f.fs.delay)
		if f.fs.failAll.Load() || f.fs.failSync.Add(-1) >= 0 {
			return &os.PathError{Op: "fdatasync", Path: f.name, Err: syscall.EIO}
		}
	}
	return f.File.Datasync()
}

func (f faultFile) Write(p []byte) (int, error) {
	if strings.HasSuffix(f.name, segSuffix) && f.fs.failWrite.CompareAndSwap(true, false) {
		n, _ := f.File.Write(p[:len(p)-1])
		return n, &os.PathError{Op: "write", Path: f.name, Err: syscall.EIO}
	}
	return f.File.Write(p)
}

func (f faultFile) Truncate(size int64) error {
	if f.fs.failTruncate.Load() {
		return &os.PathError{Op: "truncate", Path: f.name, Err: syscall.EIO}
	}
	return f.File.Truncate(size)
}

// TestRefusedBatchNeverReplayed: a batch whose fdatasync failed was
// refused to its callers, so no later start may replay it, though its
// bytes are in the segment. It is cut off the file; when the file cannot
// be truncated, or the cut synced, the segment is replaced by a copy of
// its records before the batch (the cut used to be tried once, its errors
// ignored: the refused records stayed, and the next start replayed them,
// charging calls whose callers had an error). When even that fails, the
// log takes no more appends, with an error that says why.
func TestRefusedBatchNeverReplayed(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		truncate, sync, rename bool // what fails besides the batch's fdatasync
		broken                 bool
	}{
		{name: "cut in place"},
		{name: "truncate fails", truncate: true},
		{name: "the cut's fdatasync fails", sync: true},
		{name: "truncate and rename fail", truncate: true, rename: true, broken: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := storeFile(t)
			fsys := &faultFS{FS: vfs.OS}
			l, err := Open(path, Options{FS: fsys})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Start(0); err != nil {
				t.Fatal(err)
			}
			appendWait := func(rec string) error {
				_, b, err := l.Append([]byte(rec))
				if err != nil {
					return err
				}
				return b.Wait()
			}
			if err := appendWait("acknowledged-1"); err != nil {
				t.Fatal(err)
			}
			fsys.failSync.Store(1)
			if tc.sync {
				fsys.failSync.Store(2)
			}
			fsys.failTruncate.Store(tc.truncate)
			fsys.failRename.Store(tc.rename)
			if err := appendWait("refused"); err == nil {
				t.Fatal("the batch's fdatasync failed, and its append was acknowledged")
			}
			fsys.failTruncate.Store(false)
			fsys.failRename.Store(false)
			err = appendWait("acknowledged-2")
			if tc.broken {
				if err == nil || !strings.Contains(err.Error(), "could not be cut off") {
					t.Fatalf("an append after a refused batch that stayed on the disk: %v, want the log's refusal", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if err := l.Close(0); err != nil && !tc.broken {
				t.Fatal(err)
			}
			got, l2 := replayed(t, path, 0)
			defer l2.Close(0)
			want := []string{"acknowledged-1", "acknowledged-2"}
			if tc.broken {
				// The refused record may come back: the error said so.
				want = []string{"acknowledged-1", "refused"}
			}
			if !slices.Equal(got, want) {
				t.Errorf("replayed %q, want %q", got, want)
			}
			ents, _ := os.ReadDir(filepath.Dir(path))
			for _, e := range ents {
				if strings.HasSuffix(e.Name(), cutSuffix) {
					t.Errorf("a copy was left behind: %s", e.Name())
				}
			}
		})
	}
}

// TestPacedPauseEdges: what arrives while the writer waits out its pace
// is synced before it is acknowledged, and never left waiting: a record
// appended in the pause to a log that then goes idle, a Close in the
// pause, and fdatasyncs that fail while paced (every caller of those
// batches gets the error, none an acknowledgement, and the log syncs
// again once the disk does).
func TestPacedPauseEdges(t *testing.T) {
	start := func(t *testing.T, fsys *faultFS) *Log {
		l, err := Open(storeFile(t), Options{FS: fsys})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(0); err != nil {
			t.Fatal(err)
		}
		return l
	}
	wait := func(t *testing.T, b *Batch) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- b.Wait() }()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("an append waits on after 5 s")
			return nil
		}
	}
	t.Run("a record in the pause, then idle", func(t *testing.T) {
		fsys := &faultFS{FS: vfs.OS, delay: 20 * time.Millisecond}
		l := start(t, fsys)
		defer l.Close(0)
		_, b, _ := l.Append([]byte("a"))
		if err := wait(t, b); err != nil {
			t.Fatal(err)
		}
		pos, b, _ := l.Append([]byte("b")) // within 2 × 20 ms of the sync: paced
		if err := wait(t, b); err != nil {
			t.Fatal(err)
		}
		if got := l.SyncedPosition(); got < pos {
			t.Errorf("acknowledged at synced position %d, before the record's %d", got, pos)
		}
	})
	t.Run("Close in the pause", func(t *testing.T) {
		fsys := &faultFS{FS: vfs.OS, delay: 20 * time.Millisecond}
		l := start(t, fsys)
		_, b, _ := l.Append([]byte("a"))
		if err := wait(t, b); err != nil {
			t.Fatal(err)
		}
		pos, b, _ := l.Append([]byte("b"))
		closed := make(chan error, 1)
		go func() { closed <- l.Close(0) }()
		if err := wait(t, b); err != nil {
			t.Fatalf("a record appended before Close: %v", err)
		}
		if got := l.SyncedPosition(); got < pos {
			t.Errorf("acknowledged at synced position %d, before the record's %d", got, pos)
		}
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Append([]byte("c")); !errors.Is(err, ErrClosed) {
			t.Errorf("append after Close: %v", err)
		}
	})
	t.Run("fdatasyncs fail while paced", func(t *testing.T) {
		fsys := &faultFS{FS: vfs.OS, delay: 2 * time.Millisecond}
		l := start(t, fsys)
		defer l.Close(0)
		fsys.failAll.Store(true)
		var wg sync.WaitGroup
		var acked atomic.Int64
		for i := range 40 {
			wg.Go(func() {
				_, b, err := l.Append(fmt.Appendf(nil, "refused-%d", i))
				if err == nil && wait(t, b) == nil {
					acked.Add(1)
				}
			})
		}
		wg.Wait()
		if n := acked.Load(); n > 0 {
			t.Fatalf("%d appends acknowledged while every fdatasync failed", n)
		}
		fsys.failAll.Store(false)
		pos, b, err := l.Append([]byte("after"))
		if err != nil {
			t.Fatal(err)
		}
		if err := wait(t, b); err != nil {
			t.Fatalf("an append once the disk syncs again: %v", err)
		}
		if got := l.SyncedPosition(); got < pos {
			t.Errorf("synced position %d, before the record's %d", got, pos)
		}
	})
}

// TestFailedWriteNeverReplayed: in write mode a record whose write failed
// part-way was refused to its caller; what of it reached the file is cut
// off (by a copy of the segment when truncating fails), so no later start
// replays it, and the log goes on in a new segment.
func TestFailedWriteNeverReplayed(t *testing.T) {
	for _, truncate := range []bool{false, true} {
		t.Run(fmt.Sprint("truncate fails: ", truncate), func(t *testing.T) {
			path := storeFile(t)
			fsys := &faultFS{FS: vfs.OS}
			l, err := Open(path, Options{FS: fsys, Mode: Write})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Start(0); err != nil {
				t.Fatal(err)
			}
			// Two records in one write would be refused together; one
			// whole record before the failed one is the case to get
			// right: its bytes are all in the file.
			if _, _, err := l.Append([]byte("acknowledged-1")); err != nil {
				t.Fatal(err)
			}
			fsys.failWrite.Store(true)
			fsys.failTruncate.Store(truncate)
			if _, _, err := l.Append([]byte("refused-but-almost-whole")); err == nil {
				t.Fatal("a failed write was acknowledged")
			}
			fsys.failTruncate.Store(false)
			if _, _, err := l.Append([]byte("acknowledged-2")); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(0); err != nil {
				t.Fatal(err)
			}
			got, l2 := replayed(t, path, 0)
			defer l2.Close(0)
			if want := []string{"acknowledged-1", "acknowledged-2"}; !slices.Equal(got, want) {
				t.Errorf("replayed %q, want %q", got, want)
			}
		})
	}
}
