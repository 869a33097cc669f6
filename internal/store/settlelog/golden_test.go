package settlelog

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata from what this code writes")

// goldenRecords are records of lengths around the frame's edges: one
// byte, a payload shorter and longer than the frame, and long ones.
func goldenRecords() [][]byte {
	var out [][]byte
	for i, n := range []int{1, 7, 8, 9, 60, 180, 255, 256, 1000, 3} {
		out = append(out, bytes.Repeat([]byte{byte('a' + i)}, n))
	}
	return out
}

// TestGoldenFormat: the segments this code writes are byte for byte those
// in testdata/golden, written by the settlement log before its framing
// moved to internal/store/framed; and those files read back as the records
// that were appended, at the same positions. So a log written by either
// version opens with the other.
func TestGoldenFormat(t *testing.T) {
	golden := filepath.Join("testdata", "golden")
	for _, mode := range []Mode{Sync, Write} {
		dir := t.TempDir()
		path := filepath.Join(dir, "platform.db")
		l, err := Open(path, Options{Mode: mode, SegmentBytes: 600})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(1000); err != nil {
			t.Fatal(err)
		}
		var positions []uint64
		for _, r := range goldenRecords() {
			pos, b, err := l.Append(r)
			if err == nil {
				err = b.Wait()
			}
			if err != nil {
				t.Fatal(err)
			}
			positions = append(positions, pos)
		}
		l.Close(0)
		written, _ := filepath.Glob(path + ".*" + segSuffix)
		if len(written) < 2 {
			t.Fatalf("%s: %d segments, want the log rotated", mode, len(written))
		}
		if *update && mode == Sync {
			os.RemoveAll(golden)
			os.MkdirAll(golden, 0o755)
			for _, w := range written {
				b, _ := os.ReadFile(w)
				os.WriteFile(filepath.Join(golden, filepath.Base(w)), b, 0o644)
			}
			os.WriteFile(filepath.Join(golden, "positions"), fmt.Append(nil, positions), 0o644)
		}
		want, _ := filepath.Glob(filepath.Join(golden, "*"+segSuffix))
		if len(want) != len(written) {
			t.Fatalf("%s: wrote %d segments, testdata has %d", mode, len(written), len(want))
		}
		for i, w := range written {
			got, _ := os.ReadFile(w)
			exp, err := os.ReadFile(want[i])
			if err != nil || filepath.Base(w) != filepath.Base(want[i]) || !bytes.Equal(got, exp) {
				t.Errorf("%s: %s differs from the golden %s (%v)", mode, w, want[i], err)
			}
		}
		if p, _ := os.ReadFile(filepath.Join(golden, "positions")); string(p) != fmt.Sprint(positions) {
			t.Errorf("%s: positions %v, golden %s", mode, positions, p)
		}
	}

	// The golden files, as written by the old code, read back.
	dir := t.TempDir()
	want, _ := filepath.Glob(filepath.Join(golden, "*"+segSuffix))
	for _, w := range want {
		b, _ := os.ReadFile(w)
		os.WriteFile(filepath.Join(dir, filepath.Base(w)), b, 0o600)
	}
	l, err := Open(filepath.Join(dir, "platform.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if l.TornTail != "" {
		t.Errorf("torn tail in the golden files: %s", l.TornTail)
	}
	var got [][]byte
	var positions []uint64
	if err := l.Replay(0, func(pos uint64, rec []byte) error {
		got = append(got, bytes.Clone(rec))
		positions = append(positions, pos)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(goldenRecords()) {
		t.Errorf("golden files replay %q", got)
	}
	if p, _ := os.ReadFile(filepath.Join(golden, "positions")); string(p) != fmt.Sprint(positions) {
		t.Errorf("golden files replay at positions %v, want %s", positions, p)
	}
	if l.End() != positions[len(positions)-1] {
		t.Errorf("End %d, want %d", l.End(), positions[len(positions)-1])
	}
}
