package vfs

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"
)

func write(t *testing.T, fsys FS, name string, b []byte, sync bool) File {
	t.Helper()
	f, err := fsys.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// TestSimCrash: what was synced (data and directory) survives a crash,
// handles of before it are dead, and what was not synced is kept or lost
// page by page, the same way for the same seed.
func TestSimCrash(t *testing.T) {
	image := func(seed uint64) []byte {
		s := NewSim(seed, Faults{})
		fsys := s.FS()
		fsys.MkdirAll("/d")
		f := write(t, fsys, "/d/a", bytes.Repeat([]byte{1}, 5000), true)
		if err := fsys.SyncDir("/d"); err != nil {
			t.Fatal(err)
		}
		f.Write(bytes.Repeat([]byte{2}, 10000))
		s.Crash()
		if _, err := f.Write([]byte{3}); !errors.Is(err, ErrCrashed) {
			t.Fatalf("a write after the crash: %v", err)
		}
		b, err := s.FS().ReadFile("/d/a")
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 5000 || !bytes.Equal(b[:4096], bytes.Repeat([]byte{1}, 4096)) {
			t.Fatalf("synced bytes lost: %d bytes", len(b))
		}
		return b
	}
	sizes := map[int]bool{}
	for seed := range uint64(20) {
		a, b := image(seed), image(seed)
		if !bytes.Equal(a, b) {
			t.Fatalf("seed %d: two runs differ", seed)
		}
		sizes[len(a)] = true
	}
	if len(sizes) < 2 {
		t.Errorf("every crash kept the same size: %v", sizes)
	}
}

// TestSimUnsyncedName: a file created and never made durable in its
// directory may be gone after a crash; after SyncDir it is not.
func TestSimUnsyncedName(t *testing.T) {
	gone := 0
	for seed := range uint64(20) {
		s := NewSim(seed, Faults{})
		fsys := s.FS()
		fsys.MkdirAll("/d")
		write(t, fsys, "/d/a", []byte("x"), true)
		s.Crash()
		if _, err := s.FS().ReadFile("/d/a"); errors.Is(err, os.ErrNotExist) {
			gone++
		}
	}
	if gone == 0 || gone == 20 {
		t.Errorf("%d of 20 crashes lost the unsynced name", gone)
	}
}

// TestSimFsyncgate: after a failed sync the pages it covered are clean:
// a later sync succeeds and still does not make them durable (some may
// have reached the disk, as on Linux).
func TestSimFsyncgate(t *testing.T) {
	lost := 0
	for seed := range uint64(40) {
		s := NewSim(seed, Faults{SyncErr: 10000})
		fsys := s.FS()
		fsys.MkdirAll("/d")
		f, _ := fsys.OpenFile("/d/a", os.O_CREATE|os.O_WRONLY, 0o600)
		f.Write(bytes.Repeat([]byte{7}, 3*simPage))
		if err := f.Sync(); !errors.Is(err, syscall.EIO) {
			t.Fatalf("sync: %v", err)
		}
		s.SetFaults(Faults{})
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		fsys.SyncDir("/d")
		s.Crash()
		b, _ := s.FS().ReadFile("/d/a")
		if !bytes.Equal(b, bytes.Repeat([]byte{7}, 3*simPage)) {
			lost++
		}
	}
	if lost == 0 {
		t.Error("no failed sync lost anything")
	}
}

// TestSimWriteFaults: a failed write wrote a prefix and says so.
func TestSimWriteFaults(t *testing.T) {
	s := NewSim(1, Faults{NoSpace: 10000})
	fsys := s.FS()
	fsys.MkdirAll("/d")
	f, _ := fsys.OpenFile("/d/a", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	n, err := f.Write(make([]byte, 100))
	if !errors.Is(err, syscall.ENOSPC) || n > 100 {
		t.Fatalf("%d, %v", n, err)
	}
	if size, _ := f.Size(); size != int64(n) {
		t.Errorf("size %d after a write of %d bytes", size, n)
	}
}

// TestSimCrashDuringOperation: power failing during a write or a sync
// fails it and every later operation of the process, keeps what was synced
// before, and leaves a part of the write: the same for the same seed and
// root, whatever directory the disk is mounted at.
func TestSimCrashDuringOperation(t *testing.T) {
	run := func(seed uint64, root string) ([32]byte, int) {
		s := NewSim(seed, Faults{})
		s.SetRoot(root)
		fsys := s.FS()
		fsys.MkdirAll(root)
		f := write(t, fsys, root+"/a", bytes.Repeat([]byte{1}, simPage), true)
		if err := fsys.SyncDir(root); err != nil {
			t.Fatal(err)
		}
		s.SetFaults(Faults{Crash: 10000})
		if _, err := f.Write(bytes.Repeat([]byte{2}, 3*simPage)); !errors.Is(err, ErrCrashed) {
			t.Fatalf("a write power failed during: %v", err)
		}
		if s.Crashes() != 1 {
			t.Fatalf("%d crashes", s.Crashes())
		}
		if err := f.Sync(); !errors.Is(err, ErrCrashed) {
			t.Fatalf("a sync after the crash: %v", err)
		}
		s.SetFaults(Faults{})
		b, err := s.FS().ReadFile(root + "/a")
		if err != nil || !bytes.Equal(b[:simPage], bytes.Repeat([]byte{1}, simPage)) {
			t.Fatalf("synced bytes lost: %d bytes, %v", len(b), err)
		}
		return s.Digest(), len(b)
	}
	sizes := map[int]bool{}
	for seed := range uint64(20) {
		a, n := run(seed, "/tmp/one")
		b, _ := run(seed, "/tmp/one")
		_, m := run(seed, "/var/two")
		if a != b {
			t.Fatalf("seed %d: two runs left different disks", seed)
		}
		if m != n {
			t.Fatalf("seed %d: under another root the crash kept %d bytes, not %d", seed, m, n)
		}
		sizes[n] = true
	}
	if len(sizes) < 2 {
		t.Errorf("every crash during a write left the same size: %v", sizes)
	}
}
