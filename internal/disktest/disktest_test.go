package disktest

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestSmallFills: once Fill returns, a write fails with ENOSPC; once the
// filler is removed, it succeeds again.
func TestSmallFills(t *testing.T) {
	dir := Small(t, "1m")
	filler := Fill(t, dir)
	err := os.WriteFile(filepath.Join(dir, "more"), make([]byte, 64<<10), 0o600)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a write on the full disk: %v, want ENOSPC", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "more"), make([]byte, 64<<10), 0o600); err != nil {
		t.Fatalf("a write once the filler is gone: %v", err)
	}
}
