// Package disktest gives tests a disk that really fills up: a small tmpfs,
// so that the store's and the settlement log's own writes fail with
// ENOSPC as on a full production disk, rather than a fault injected
// where the test thinks the write happens.
package disktest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Small mounts a tmpfs of size (mount's syntax: "2m") on a temp dir and
// returns the dir. Mounting needs root (CI runs as root); elsewhere the
// test is skipped. The mount is lazily detached when the test ends, after
// the cleanups registered later (a store on it closed first).
func Small(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a full disk is simulated with a small tmpfs, which needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// Fill writes a file in dir until the file system is full and returns its
// path: removing it gives the room back.
func Fill(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{1}, 4096)
	for range 1 << 20 { // bounded: 4 GiB, far more than any test tmpfs
		if _, err := f.Write(chunk); err != nil {
			return path
		}
	}
	t.Fatal("the disk never filled")
	return ""
}
