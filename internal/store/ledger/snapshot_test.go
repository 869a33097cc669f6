package ledger

import (
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// TestSnapshot: a snapshot of a ledger with sealed segments, an active
// segment and a rollup log opens as the ledger was: the same rows, the
// same rollups, the same position and sequence. Prunes and seals running
// beside it wait; a snapshot of a closed ledger is refused.
func TestSnapshot(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{SealBytes: 64 << 10})
	r := rand.New(rand.NewPCG(3, 4))
	var es []store.LedgerEntry
	for i := range 6000 {
		es = append(es, mixedEntry(r, uint64(i+1), t0.Add(time.Duration(i)*time.Minute)))
	}
	var pos uint64
	appendBatches(t, l, es, 250, &pos)
	if err := l.Seal(); err != nil {
		t.Fatal(err)
	}
	more := make([]store.LedgerEntry, 0, 300)
	for i := range 300 {
		more = append(more, mixedEntry(r, uint64(6001+i), t0.Add(time.Duration(6000+i)*time.Minute)))
	}
	appendBatches(t, l, more, 100, &pos)
	es = append(es, more...)

	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := l.Prune(t0.Add(-time.Hour)); err != nil { // removes nothing, but takes its locks
			t.Error(err)
		}
	})
	copyDir := filepath.Join(t.TempDir(), "copy")
	if err := l.Snapshot(copyDir); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	st := l.Stats()
	c := open(t, copyDir, Options{})
	defer c.Close()
	sameEntries(t, "the snapshot", scanAll(t, c, store.LedgerFilter{}), es)
	if got, want := allRollups(t, c, store.RollupFilter{}), allRollups(t, l, store.RollupFilter{}); !reflect.DeepEqual(got, want) {
		t.Errorf("the snapshot's %d rollups differ from the ledger's %d", len(got), len(want))
	}
	if cs := c.Stats(); cs.Position != st.Position || cs.LastSeq != st.LastSeq || cs.Rows != st.Rows {
		t.Errorf("snapshot %+v, ledger %+v", cs, st)
	}
	checkRollups(t, "the snapshot", c)
	l.Close()
	if err := l.Snapshot(filepath.Join(t.TempDir(), "after")); err != ErrClosed {
		t.Errorf("a snapshot of a closed ledger: %v", err)
	}
}
