package ledger

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata from what this code writes")

// goldenEntries are mixed rows of one user (the rollup log's frames list
// users in map order, so one user keeps its bytes fixed), request ids
// included.
func goldenEntries(from, n int) []store.LedgerEntry {
	r := rand.New(rand.NewPCG(11, uint64(from)))
	var es []store.LedgerEntry
	for i := range n {
		seq := uint64(from + i)
		e := mixedEntry(r, seq, t0.Add(time.Duration(seq)*17*time.Minute))
		e.UserID = "alice"
		if e.RequestID != "" {
			e.RequestID = fmt.Sprintf("req-%08x", r.Uint32())
		}
		es = append(es, e)
	}
	return es
}

// writeGolden writes a ledger holding a sealed segment, an active raw
// segment of several blocks and a rollup log of two frames.
func writeGolden(t *testing.T, dir string) []store.LedgerEntry {
	t.Helper()
	now := func() time.Time { return t0 }
	o := Options{Now: now, SealBytes: 1 << 30, SealAge: 1000 * time.Hour, ChunkRows: 40}
	l := open(t, dir, o)
	es := goldenEntries(1, 100)
	var pos uint64
	appendBatches(t, l, es, 30, &pos)
	if err := l.Seal(); err != nil {
		t.Fatal(err)
	}
	more := goldenEntries(101, 45)
	appendBatches(t, l, more, 10, &pos)
	if err := l.Append(nil, pos+5); err != nil { // a block that only moves the position
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return append(es, more...)
}

// TestGoldenFormat: the files this code writes are byte for byte those in
// testdata/golden, written by the ledger before its framing moved to
// internal/store/framed, and those files open as the rows, rollups and
// position that were appended. So a ledger directory written by either
// version opens with the other.
func TestGoldenFormat(t *testing.T) {
	golden := filepath.Join("testdata", "golden")
	dir := t.TempDir()
	es := writeGolden(t, dir)
	written, _ := filepath.Glob(filepath.Join(dir, "*"))
	if *update {
		os.RemoveAll(golden)
		os.MkdirAll(golden, 0o755)
		for _, w := range written {
			b, _ := os.ReadFile(w)
			os.WriteFile(filepath.Join(golden, filepath.Base(w)), b, 0o644)
		}
	}
	want, _ := filepath.Glob(filepath.Join(golden, "*"))
	if len(want) != 3 || len(written) != len(want) {
		t.Fatalf("wrote %v, testdata has %v; want a sealed segment, a raw one and the rollup log", written, want)
	}
	for i, w := range written {
		got, _ := os.ReadFile(w)
		exp, err := os.ReadFile(want[i])
		if err != nil || filepath.Base(w) != filepath.Base(want[i]) || !bytes.Equal(got, exp) {
			t.Errorf("%s differs from the golden %s (%v)", w, want[i], err)
		}
	}

	// The golden files, as written by the old code, read back.
	dir = t.TempDir()
	for _, w := range want {
		b, _ := os.ReadFile(w)
		os.WriteFile(filepath.Join(dir, filepath.Base(w)), b, 0o600)
	}
	l := open(t, dir, Options{})
	defer l.Close()
	sameEntries(t, "the golden files", scanAll(t, l, store.LedgerFilter{}), es)
	if got, want := allRollups(t, l, store.RollupFilter{}), rollupsOf(es); !reflect.DeepEqual(got, want) {
		t.Errorf("the golden files' %d rollups differ from the %d of their rows", len(got), len(want))
	}
	if st := l.Stats(); st.Position != 3*4+3*5+5 || st.LastSeq != 145 || st.Sealed != 1 || st.Segments != 2 {
		t.Errorf("golden files: %+v", st)
	}
}
