package ledger

import (
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// TestManualSeal: a ledger opened with ManualSeal seals nothing on its
// own; SealPending seals every raw segment but the active one, in the
// caller's goroutine, and the rows read the same.
func TestManualSeal(t *testing.T) {
	l := open(t, t.TempDir(), Options{SealBytes: 512, ManualSeal: true})
	defer l.Close()
	var pos uint64
	var es []store.LedgerEntry
	for i := range 40 {
		es = append(es, syncEntry(uint64(i+1), t0.Add(time.Duration(i)*time.Second)))
	}
	appendBatches(t, l, es, 4, &pos)
	st := l.Stats()
	if st.Segments < 3 || st.Sealed != 0 {
		t.Fatalf("%d segments, %d sealed before SealPending: want several, none sealed", st.Segments, st.Sealed)
	}
	if err := l.SealPending(); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Sealed != st.Segments-1 {
		t.Fatalf("%d of %d segments sealed, want all but the active one", st.Sealed, st.Segments)
	}
	sameEntries(t, "after SealPending", scanAll(t, l, store.LedgerFilter{}), es)
}
