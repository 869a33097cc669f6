package ledger

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/framed"
	"github.com/platformgw/gateway/internal/store/storetest"
)

var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

// syncEntry is what a sync call through the gateway appends: one user,
// product and endpoint, a Caddy request id (a random UUIDv4).
func syncEntry(seq uint64, at time.Time) store.LedgerEntry {
	return store.LedgerEntry{Seq: seq, ID: defaultID(seq), Time: at, UserID: "alice", ServiceID: "weather",
		EndpointID: "forecast", ProductID: "basic", RequestID: uuid.NewString(), Units: billing.Units(1e6),
		Source: store.SourceGateway}
}

// mixedEntry varies every field, the unusual shapes included.
func mixedEntry(r *rand.Rand, seq uint64, at time.Time) store.LedgerEntry {
	e := syncEntry(seq, at)
	e.UserID = fmt.Sprintf("user-%d", r.IntN(7))
	e.ServiceID = []string{"weather", "maps", "search"}[r.IntN(3)]
	e.EndpointID = []string{"", "a", "b"}[r.IntN(3)]
	e.ProductID = []string{"", "basic", "pro"}[r.IntN(3)]
	e.Source = []string{store.SourceGateway, store.SourceReport, store.SourceCompletion}[r.IntN(3)]
	e.Units = billing.Units(r.Int64N(1e9) - 1e8)
	switch r.IntN(6) {
	case 0:
		e.RequestID = ""
	case 1:
		e.RequestID = strings.ToUpper(e.RequestID)
	case 2:
		e.RequestID = "req-" + fmt.Sprint(r.IntN(1e6))
	}
	if r.IntN(4) == 0 {
		e.OccurredAt = at.Add(-time.Duration(r.Int64N(int64(100 * 24 * time.Hour))))
	}
	if r.IntN(20) == 0 {
		e.OccurredAt = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
	}
	if r.IntN(5) == 0 {
		e.IdempotencyKey = fmt.Sprintf("idem-%d", r.Int())
	}
	if r.IntN(3) == 0 {
		e.Overage = billing.Units(r.Int64N(1e7))
		e.Cost = billing.Units(r.Int64N(1e9))
	}
	if r.IntN(10) == 0 {
		e.UnitsClaimed = e.Units + billing.Units(r.Int64N(1e6)+1)
	}
	if r.IntN(10) == 0 {
		e.ID = "custom-" + fmt.Sprint(seq)
	}
	return e
}

func open(t testing.TB, dir string, o Options) *Ledger {
	t.Helper()
	l, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l
}

func scanAll(t testing.TB, l *Ledger, f store.LedgerFilter) []store.LedgerEntry {
	t.Helper()
	var out []store.LedgerEntry
	if err := l.Scan(context.Background(), f, func(e store.LedgerEntry) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return out
}

func sameEntries(t testing.TB, what string, got, want []store.LedgerEntry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, want %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if !g.Time.Equal(w.Time) || !g.OccurredAt.Equal(w.OccurredAt) {
			t.Fatalf("%s: entry %d times %v %v, want %v %v", what, i, g.Time, g.OccurredAt, w.Time, w.OccurredAt)
		}
		g.Time, g.OccurredAt, w.Time, w.OccurredAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("%s: entry %d\n got %+v\nwant %+v", what, i, g, w)
		}
	}
}

// abandon drops the ledger as a crash would (Abandon).
func (l *Ledger) abandon() { l.Abandon() }

func appendBatches(t testing.TB, l *Ledger, es []store.LedgerEntry, batch int, pos *uint64) {
	t.Helper()
	for i := 0; i < len(es); i += batch {
		*pos += 3
		if err := l.Append(es[i:min(i+batch, len(es))], *pos); err != nil {
			t.Fatalf("Append: %v", err)
		}
	}
}

func TestRoundTripEveryField(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	var want []store.LedgerEntry
	for i := range 5000 {
		want = append(want, mixedEntry(r, uint64(i+1)*2, t0.Add(time.Duration(i)*time.Millisecond)))
	}
	l := open(t, dir, Options{SealBytes: 64 << 10, ChunkRows: 300})
	var pos uint64
	appendBatches(t, l, want, 37, &pos)
	sameEntries(t, "before sealing", scanAll(t, l, store.LedgerFilter{}), want)
	if err := l.Seal(); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Sealed < 2 || st.Rows != int64(len(want)) {
		t.Fatalf("stats after Seal: %+v", st)
	}
	sameEntries(t, "sealed", scanAll(t, l, store.LedgerFilter{}), want)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, Options{})
	defer l.Close()
	sameEntries(t, "reopened", scanAll(t, l, store.LedgerFilter{}), want)
	if rows, err := l.Verify(context.Background()); err != nil || rows != int64(len(want)) {
		t.Fatalf("Verify: %d rows, %v", rows, err)
	}
	if !l.LastTime().Equal(want[len(want)-1].Time) {
		t.Fatalf("LastTime %v, want %v", l.LastTime(), want[len(want)-1].Time)
	}
	if l.Position() != pos || l.LastSeq() != want[len(want)-1].Seq {
		t.Fatalf("reopened at position %d seq %d, want %d %d", l.Position(), l.LastSeq(), pos, want[len(want)-1].Seq)
	}
	// Filters, as the bbolt store's scan had them.
	f := store.LedgerFilter{UserID: "user-3", ServiceID: "maps", From: t0.Add(time.Second), To: t0.Add(3 * time.Second)}
	var filtered []store.LedgerEntry
	for _, e := range want {
		if e.UserID == f.UserID && e.ServiceID == f.ServiceID && !e.Time.Before(f.From) && e.Time.Before(f.To) {
			filtered = append(filtered, e)
		}
	}
	sameEntries(t, "filtered", scanAll(t, l, f), filtered)
	if got := scanAll(t, l, store.LedgerFilter{UserID: "nobody"}); len(got) != 0 {
		t.Fatalf("unknown user: %d entries", len(got))
	}
	// fn's error stops the scan and comes back.
	stop := errors.New("stop")
	n := 0
	if err := l.Scan(context.Background(), store.LedgerFilter{}, func(store.LedgerEntry) error {
		n++
		if n == 10 {
			return stop
		}
		return nil
	}); err != stop || n != 10 {
		t.Fatalf("Scan stopped with %v after %d", err, n)
	}
}

func TestAppendRefusesWhatWouldBreakReplay(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	defer l.Close()
	if err := l.Append([]store.LedgerEntry{syncEntry(5, t0)}, 10); err != nil {
		t.Fatal(err)
	}
	if err := l.Append([]store.LedgerEntry{syncEntry(5, t0)}, 11); err == nil {
		t.Error("a repeated seq was accepted")
	}
	if err := l.Append(nil, 9); err == nil {
		t.Error("a position going back was accepted")
	}
	if err := l.Append(nil, 12); err != nil || l.Position() != 12 {
		t.Errorf("position-only append: %v, position %d", err, l.Position())
	}
	bad := syncEntry(6, time.Date(1500, 1, 1, 0, 0, 0, 0, time.UTC))
	if err := l.Append([]store.LedgerEntry{bad}, 13); err == nil {
		t.Error("a time out of range was accepted")
	}
	if got := scanAll(t, l, store.LedgerFilter{}); len(got) != 1 || l.Position() != 12 {
		t.Errorf("after refusals: %d entries, position %d", len(got), l.Position())
	}
}

// duBytes is what du reports for dir: the blocks its files take.
func duBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		n += fi.Sys().(*syscall.Stat_t).Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBytesPerSyncCall is the disk budget: 45,000 sync calls of one user,
// product and endpoint, each with a random UUIDv4 request id, appended in
// 20-call batches as the store's applier does, cost at most 50 bytes each
// on disk once sealed. The request id alone is 16 bytes of randomness that
// no compressor can shrink; see docs/operations.md.
func TestBytesPerSyncCall(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{})
	defer l.Close()
	r := rand.New(rand.NewPCG(3, 4))
	const n = 45000
	es := make([]store.LedgerEntry, n)
	at := t0
	for i := range es {
		at = at.Add(time.Duration(500+r.IntN(1000)) * time.Microsecond)
		es[i] = syncEntry(uint64(i+1), at)
	}
	var pos uint64
	appendBatches(t, l, es, 20, &pos)
	active := float64(duBytes(t, dir)) / n
	if err := l.Seal(); err != nil {
		t.Fatal(err)
	}
	sealed := float64(duBytes(t, dir)) / n
	t.Logf("bytes per call on disk: %.1f in the active segment, %.1f sealed (du of the directory)", active, sealed)
	if sealed > 50 {
		t.Errorf("%.1f bytes per sealed call, budget 50", sealed)
	}
	sameEntries(t, "sealed", scanAll(t, l, store.LedgerFilter{}), es)
}

// rollupsOf sums the raw rows as the ledger's rollups should.
func rollupsOf(es []store.LedgerEntry) []store.Rollup {
	r := newRollups()
	for i := range es {
		r.add(&es[i])
	}
	return r.collect(store.RollupFilter{})
}

func allRollups(t testing.TB, l *Ledger, f store.RollupFilter) []store.Rollup {
	t.Helper()
	var out []store.Rollup
	if err := l.ScanRollups(context.Background(), f, func(r store.Rollup) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func checkRollups(t *testing.T, what string, l *Ledger) {
	t.Helper()
	got := allRollups(t, l, store.RollupFilter{})
	want := rollupsOf(scanAll(t, l, store.LedgerFilter{}))
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: %d rollups differ from the %d the raw rows sum to", what, len(got), len(want))
	}
}

// TestCrashesKeepRollupsEqualToRows crashes the ledger at the points that
// matter (a block cut short, a rollup file write cut short, an older
// rollup file than the segments) and checks after each Open that the
// rollups are the sum of the surviving raw rows and that Position is the
// last surviving block's.
func TestCrashesKeepRollupsEqualToRows(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(5, 6))
	o := Options{SealBytes: 32 << 10, ChunkRows: 200}
	l := open(t, dir, o)
	var pos uint64
	seq := uint64(0)
	at := t0
	next := func(n int) []store.LedgerEntry {
		var es []store.LedgerEntry
		for range n {
			seq++
			at = at.Add(time.Duration(r.IntN(30)) * time.Second)
			es = append(es, mixedEntry(r, seq, at))
		}
		return es
	}
	all := next(3000)
	appendBatches(t, l, all, 50, &pos)
	if err := l.Seal(); err != nil {
		t.Fatal(err)
	}
	oldRollups, err := os.ReadFile(filepath.Join(dir, rollupFile))
	if err != nil {
		t.Fatal(err)
	}
	more := next(2000)
	appendBatches(t, l, more, 50, &pos)
	all = append(all, more...)
	if err := l.Seal(); err != nil {
		t.Fatal(err)
	}
	tail := next(500)
	appendBatches(t, l, tail, 50, &pos)
	all = append(all, tail...)
	active := l.segs[len(l.segs)-1].path
	l.abandon()

	// 1. The last block cut in the middle, and a rollup file write cut
	// short, and the rollup file from two seals ago: everything after it
	// is replayed from sealed and raw rows.
	fi, _ := os.Stat(active)
	if err := os.Truncate(active, fi.Size()-30); err != nil {
		t.Fatal(err)
	}
	// The log as it was two seals ago, then half of the next frame.
	newRollups, err := os.ReadFile(filepath.Join(dir, rollupFile))
	if err != nil || len(newRollups) <= len(oldRollups) || string(newRollups[:len(oldRollups)]) != string(oldRollups) {
		t.Fatalf("the rollup log did not grow by appending (%v)", err)
	}
	torn := newRollups[:len(oldRollups)+(len(newRollups)-len(oldRollups))/2]
	if err := os.WriteFile(filepath.Join(dir, rollupFile), torn, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, rollupFile+tmpExt), oldRollups[:len(oldRollups)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, o)
	all = all[:len(all)-50] // the last batch was torn
	pos -= 3
	sameEntries(t, "after a torn tail", scanAll(t, l, store.LedgerFilter{}), all)
	if l.Position() != pos {
		t.Fatalf("position %d after a torn tail, want %d", l.Position(), pos)
	}
	checkRollups(t, "after a torn tail and an old rollup file", l)
	if _, err := os.Stat(filepath.Join(dir, rollupFile+tmpExt)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the unfinished rollup write is still there: %v", err)
	}

	// 2. Appends go on after the repaired tail; a crash with no rollup
	// file written since.
	tail = next(120)
	appendBatches(t, l, tail, 40, &pos)
	all = append(all, tail...)
	l.abandon()
	l = open(t, dir, o)
	sameEntries(t, "after a crash", scanAll(t, l, store.LedgerFilter{}), all)
	checkRollups(t, "after a crash", l)

	// 3. A crash after a sealed file was renamed, before its raw file
	// went: Open keeps the sealed one.
	if err := l.Seal(); err != nil {
		t.Fatal(err)
	}
	sealed := l.segs[len(l.segs)-2]
	l.abandon()
	if err := os.WriteFile(strings.TrimSuffix(sealed.path, sealedExt)+rawExt, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, o)
	sameEntries(t, "with a stale raw file", scanAll(t, l, store.LedgerFilter{}), all)
	checkRollups(t, "with a stale raw file", l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, o)
	checkRollups(t, "after a clean close", l)
	// 4. After a failed rollup log write the next one rewrites the log
	// whole (a .tmp file and a rename).
	l.snapMu.Lock()
	l.rlogBroken = true
	l.snapMu.Unlock()
	tail = next(10)
	appendBatches(t, l, tail, 10, &pos)
	all = append(all, tail...)
	before, _ := os.Stat(filepath.Join(dir, rollupFile))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(filepath.Join(dir, rollupFile))
	if after.Size() >= before.Size()+200 {
		t.Errorf("the rollup log was not rewritten: %d bytes, %d before", after.Size(), before.Size())
	}
	l = open(t, dir, o)
	defer l.Close()
	sameEntries(t, "after a rewritten rollup log", scanAll(t, l, store.LedgerFilter{}), all)
	checkRollups(t, "after a rewritten rollup log", l)
	if l.Position() != pos {
		t.Fatalf("position %d, want %d", l.Position(), pos)
	}
}

// TestDamageIsReported: damage is an error naming the file, never rows
// silently skipped.
func TestDamageIsReported(t *testing.T) {
	build := func(t *testing.T) (string, *Ledger) {
		dir := t.TempDir()
		l := open(t, dir, Options{SealBytes: 16 << 10, ChunkRows: 100})
		es := make([]store.LedgerEntry, 2000)
		for i := range es {
			es[i] = syncEntry(uint64(i+1), t0.Add(time.Duration(i)*time.Second))
		}
		var pos uint64
		appendBatches(t, l, es, 25, &pos)
		if err := l.Seal(); err != nil {
			t.Fatal(err)
		}
		return dir, l
	}
	flip := func(t *testing.T, path string, off int64) {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b := []byte{0}
		if off < 0 {
			fi, _ := f.Stat()
			off += fi.Size()
		}
		f.ReadAt(b, off)
		b[0] ^= 0x55
		f.WriteAt(b, off)
	}
	t.Run("sealed chunk", func(t *testing.T) {
		dir, l := build(t)
		defer l.Close()
		path := l.segs[0].path
		flip(t, path, int64(len(sealedMagic))+3)
		err := l.Scan(context.Background(), store.LedgerFilter{}, func(store.LedgerEntry) error { return nil })
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("scan of a damaged chunk: %v", err)
		}
		_ = dir
	})
	t.Run("sealed footer", func(t *testing.T) {
		dir, l := build(t)
		path := l.segs[0].path
		l.Close()
		flip(t, path, -20)
		if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("Open with a damaged footer: %v", err)
		}
	})
	t.Run("middle of the active segment", func(t *testing.T) {
		dir := t.TempDir()
		l := open(t, dir, Options{})
		var pos uint64
		for i := range 10 {
			pos++
			if err := l.Append([]store.LedgerEntry{syncEntry(uint64(i+1), t0)}, pos); err != nil {
				t.Fatal(err)
			}
		}
		path := l.segs[0].path
		l.abandon()
		flip(t, path, rawHeaderLen+framed.HeaderSize+5) // the first block's payload
		if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("Open with a damaged block before good ones: %v", err)
		}
	})
	t.Run("rollup file", func(t *testing.T) {
		dir, l := build(t)
		// One more row, so that Close writes a frame after those of the
		// seals: the damaged frame is then never the last (a damaged last
		// frame is a torn write, dropped). Without it the seals running
		// beside the appends sometimes wrote a single frame.
		if err := l.Append([]store.LedgerEntry{syncEntry(2001, t0.Add(2001*time.Second))}, 1<<20); err != nil {
			t.Fatal(err)
		}
		l.Close()
		path := filepath.Join(dir, rollupFile)
		flip(t, path, 12)
		if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("Open with a damaged rollup file: %v", err)
		}
	})
}

func TestPruneKeepsRollups(t *testing.T) {
	dir := t.TempDir()
	now := t0.Add(90 * 24 * time.Hour)
	o := Options{Now: func() time.Time { return now }}
	l := open(t, dir, o)
	defer l.Close()
	var pos uint64
	var all []store.LedgerEntry
	// One sealed segment per 10 days of rows.
	for d := range 9 {
		var es []store.LedgerEntry
		for i := range 100 {
			seq := uint64(d*100 + i + 1)
			es = append(es, syncEntry(seq, t0.Add(time.Duration(d)*10*24*time.Hour+time.Duration(i)*time.Hour)))
		}
		appendBatches(t, l, es, 50, &pos)
		all = append(all, es...)
		if err := l.Seal(); err != nil {
			t.Fatal(err)
		}
	}
	before := allRollups(t, l, store.RollupFilter{})
	cut := t0.Add(35 * 24 * time.Hour)
	var sizes int64
	for _, m := range l.segs[:4] {
		sizes += m.size
	}
	du := duBytes(t, dir)
	res, err := l.Prune(cut)
	if err != nil {
		t.Fatal(err)
	}
	if res.Segments != 4 || res.Rows != 400 || res.Bytes != sizes {
		t.Fatalf("Prune removed %+v, want 4 segments, 400 rows, %d bytes", res, sizes)
	}
	if du2 := duBytes(t, dir); du2 >= du {
		t.Fatalf("du %d after prune, %d before", du2, du)
	}
	sameEntries(t, "after prune", scanAll(t, l, store.LedgerFilter{}), all[400:])
	if after := allRollups(t, l, store.RollupFilter{}); !reflect.DeepEqual(after, before) {
		t.Fatalf("rollups changed with the raw rows pruned: %d, were %d", len(after), len(before))
	}
	// Rollups past a rollup retention (60 days before now: the first 30
	// days of rows) go with PruneRollups.
	keepFrom := now.Add(-60 * 24 * time.Hour).Truncate(time.Hour)
	dropped, err := l.PruneRollups(keepFrom)
	if err != nil {
		t.Fatal(err)
	}
	after := allRollups(t, l, store.RollupFilter{})
	var want []store.Rollup
	for _, r := range before {
		if !r.Hour.Before(keepFrom) {
			want = append(want, r)
		}
	}
	if !reflect.DeepEqual(after, want) || dropped != len(before)-len(want) {
		t.Fatalf("rollups after prune: %d (dropped %d), want %d", len(after), dropped, len(want))
	}
	// And after a reopen, rollups still cover the pruned rows.
	l.Close()
	l = open(t, dir, o)
	defer l.Close()
	if got := allRollups(t, l, store.RollupFilter{}); !reflect.DeepEqual(got, want) {
		t.Fatalf("rollups after reopen: %d, want %d", len(got), len(want))
	}
	// An active segment whose rows are all older goes too: sealed, then
	// removed.
	late := []store.LedgerEntry{syncEntry(100000, now.Add(-time.Hour)), syncEntry(100001, now.Add(-time.Minute))}
	appendBatches(t, l, late, 2, &pos)
	if res, err := l.Prune(now.Add(-30 * time.Minute)); err != nil || res.Segments != 5 || res.Rows != 500 {
		t.Fatalf("prune before the active segment's newest row: %+v %v", res, err)
	}
	if res, err := l.Prune(now); err != nil || res.Segments != 1 || res.Rows != 2 {
		t.Fatalf("prune of every row: %+v %v", res, err)
	}
	if got := scanAll(t, l, store.LedgerFilter{}); len(got) != 0 {
		t.Fatalf("%d rows after pruning everything", len(got))
	}
	// A user's period summary from rollups.
	var calls int64
	if err := l.ScanRollups(context.Background(), store.RollupFilter{UserID: "alice", From: t0.Add(40 * 24 * time.Hour),
		To: t0.Add(50 * 24 * time.Hour)}, func(r store.Rollup) error {
		calls += r.Calls
		return nil
	}); err != nil || calls != 100 {
		t.Fatalf("summary of days 40-50: %d calls (%v), want 100", calls, err)
	}
}

func TestScanWhileAppendingAndSealing(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{SealBytes: 8 << 10, ChunkRows: 64})
	defer l.Close()
	done := make(chan error)
	go func() {
		var pos uint64
		for i := range 1000 {
			pos++
			if err := l.Append([]store.LedgerEntry{syncEntry(uint64(i+1), t0.Add(time.Duration(i)*time.Millisecond))}, pos); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range 20 {
		es := scanAll(t, l, store.LedgerFilter{})
		for i := range es {
			if es[i].Seq != uint64(i+1) {
				t.Fatalf("scan during appends: entry %d has seq %d", i, es[i].Seq)
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := scanAll(t, l, store.LedgerFilter{}); len(got) != 1000 {
		t.Fatalf("%d entries", len(got))
	}
}

// TestRollupFilter checks the hour index against a plain filter, rows
// added out of hour order included (a replay after a crash can do that).
func TestRollupFilter(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	ro := newRollups()
	var es []store.LedgerEntry
	for i := range 3000 {
		e := mixedEntry(r, uint64(i+1), t0.Add(time.Duration(r.IntN(200*3600))*time.Second))
		es = append(es, e)
		ro.add(&e)
	}
	all := ro.collect(store.RollupFilter{})
	for range 200 {
		f := store.RollupFilter{UserID: []string{"", "user-1", "user-4"}[r.IntN(3)], ServiceID: []string{"", "maps"}[r.IntN(2)]}
		if r.IntN(4) > 0 {
			f.From = t0.Add(time.Duration(r.IntN(220*3600)-10*3600) * time.Second)
		}
		if r.IntN(4) > 0 {
			f.To = t0.Add(time.Duration(r.IntN(220*3600)-10*3600) * time.Second)
		}
		var want []store.Rollup
		for _, x := range all {
			if (f.UserID == "" || x.UserID == f.UserID) && (f.ServiceID == "" || x.ServiceID == f.ServiceID) &&
				(f.From.IsZero() || !x.Hour.Before(f.From)) && (f.To.IsZero() || x.Hour.Before(f.To)) {
				want = append(want, x)
			}
		}
		if got := ro.collect(f); !reflect.DeepEqual(got, want) {
			t.Fatalf("%+v: %d rollups, want %d", f, len(got), len(want))
		}
	}
	var calls int64
	for _, x := range all {
		calls += x.Calls
	}
	if calls != int64(len(es)) {
		t.Fatalf("rollups count %d calls, %d rows", calls, len(es))
	}
}

// ledgerSink is the seam the bbolt store's settlement applier hands
// entries to; the ledger must satisfy it as it is.
type ledgerSink interface {
	Append(entries []store.LedgerEntry, upto uint64) error
	Position() uint64
	Scan(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error
	Close() error
}

var _ ledgerSink = (*Ledger)(nil)

// TestCodecCarriesEveryField round-trips an entry with every field of
// store.LedgerFields set through the segment codec, in the active segment
// and sealed.
func TestCodecCarriesEveryField(t *testing.T) {
	want := storetest.FullLedgerEntry(t)
	l := open(t, t.TempDir(), Options{})
	defer l.Close()
	if err := l.Append([]store.LedgerEntry{want}, 1); err != nil {
		t.Fatal(err)
	}
	for _, stage := range []string{"active", "sealed"} {
		got := scanAll(t, l, store.LedgerFilter{})
		if len(got) != 1 {
			t.Fatalf("%s: %d entries", stage, len(got))
		}
		storetest.CheckLedgerEntry(t, "the ledger codec ("+stage+")", got[0], want)
		if err := l.Seal(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestZeroHeaderLastSegment: a crash between a new active segment's
// creation and its header's sync can leave the file at its size with
// nothing but zeros in it (the size reached the disk, the page did not).
// That last segment held no row, and goes; the ledger opened with "bad
// segment header at offset 0" instead (found by the storage simulation,
// power failing during a prune's seal). A file of zeros before the last,
// or one the store file says held rows, is still damage.
func TestZeroHeaderLastSegment(t *testing.T) {
	build := func(t *testing.T) (string, []store.LedgerEntry, uint64) {
		dir := t.TempDir()
		l := open(t, dir, Options{})
		es := make([]store.LedgerEntry, 30)
		for i := range es {
			es[i] = syncEntry(uint64(i+1), t0.Add(time.Duration(i)*time.Second))
		}
		var pos uint64
		appendBatches(t, l, es, 10, &pos)
		l.Close()
		return dir, es, pos
	}
	zeros := func(t *testing.T, dir string, base uint64, size int) string {
		path := filepath.Join(dir, segName(base, rawExt))
		if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, size := range []int{rawHeaderLen, 4096} {
		t.Run(fmt.Sprint("last, ", size, " bytes"), func(t *testing.T) {
			dir, es, pos := build(t)
			path := zeros(t, dir, 1000, size)
			l := open(t, dir, Options{Covers: pos})
			defer l.Close()
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("the segment of zeros is still there: %v", err)
			}
			sameEntries(t, "after the segment of zeros", scanAll(t, l, store.LedgerFilter{}), es)
			if err := l.Append([]store.LedgerEntry{syncEntry(31, t0.Add(31*time.Second))}, pos+1); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("the store file says it held rows", func(t *testing.T) {
		dir, _, pos := build(t)
		path := zeros(t, dir, 1000, 4096)
		if _, err := Open(dir, Options{Covers: pos + 10}); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("Open: %v, want the damage named", err)
		}
	})
	t.Run("not the last", func(t *testing.T) {
		dir, _, _ := build(t)
		path := zeros(t, dir, 0, 4096) // before the segment of the rows
		if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("Open: %v, want the damage named", err)
		}
	})
}
