package boltstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	segledger "github.com/platformgw/gateway/internal/store/ledger"
)

// writeOldLedger writes n rows into the ledger bucket of the closed store
// file at path as the store wrote them before the ledger directory (key
// time(8) seq(8), the JSON of encodeLedger, the bucket's sequence the
// highest Seq), and returns them as the old store's export read them.
func writeOldLedger(t *testing.T, path string, n int) []store.LedgerEntry {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var out []store.LedgerEntry
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketLedger)
		if err != nil {
			return err
		}
		for i := 1; i <= n; i++ {
			e := store.LedgerEntry{Seq: uint64(i), ID: ledgerID(uint64(i)), Time: t0.Add(time.Duration(i/3) * time.Second),
				UserID: fmt.Sprint("u", i%4), ServiceID: "svc", EndpointID: "ep", ProductID: "basic",
				RequestID: fmt.Sprint("req-", i), Units: whole(int64(i%7 + 1)), Cost: billing.Units(i), Source: store.SourceGateway}
			if i%10 == 0 {
				e.Source, e.RequestID, e.IdempotencyKey, e.OccurredAt = store.SourceReport, "", fmt.Sprint("k", i), t0.Add(-time.Hour)
			}
			raw, err := encodeLedger(e)
			if err != nil {
				return err
			}
			if err := b.Put(append(u64(uint64(e.Time.UnixNano())), u64(e.Seq)...), raw); err != nil {
				return err
			}
			var rec ledgerRecord
			if err := json.Unmarshal(raw, &rec); err != nil {
				return err
			}
			out = append(out, rec.entry())
		}
		return b.SetSequence(uint64(n))
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameEntries(t *testing.T, what string, got, want []store.LedgerEntry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d rows, want %d", what, len(got), len(want))
	}
	for i := range got {
		if fmt.Sprintf("%+v", got[i]) != fmt.Sprintf("%+v", want[i]) {
			t.Fatalf("%s: row %d\n got %+v\nwant %+v", what, i, got[i], want[i])
		}
	}
}

// TestLedgerBucketMoves: a store file written by the store before the
// ledger directory opens with its ledger bucket moved into the directory:
// the export is the same row for row, the bucket is gone, and new rows
// are numbered and timed after the old ones. A move cut short (the
// directory has the first half) finishes at the next Open without a row
// twice.
func TestLedgerBucketMoves(t *testing.T) {
	for _, half := range []bool{false, true} {
		t.Run(fmt.Sprint("cut short ", half), func(t *testing.T) {
			path := storePath(t)
			s := openAt(t, path)
			a := subscribe(t, s, "u1", "svc", unlimited, 0)
			s.Close()
			// Remove what the new store made, so the file is as the old
			// store left it.
			os.RemoveAll(LedgerDir(path))
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			db.Update(func(tx *bolt.Tx) error {
				m := tx.Bucket(bucketMarker)
				m.Delete(keyLedgerSeq)
				return m.Delete(keyLedgerTime)
			})
			db.Close()
			old := writeOldLedger(t, path, 25000)
			if half {
				l, err := segledger.Open(LedgerDir(path), segledger.Options{})
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Append(old[:12345], 0); err != nil {
					t.Fatal(err)
				}
				l.Close()
			}

			s = openAt(t, path)
			sameEntries(t, "export after the move", ledger(t, s, store.LedgerFilter{}), old)
			s.view(func(tx *bolt.Tx) error {
				if tx.Bucket(bucketLedger) != nil {
					t.Error("the ledger bucket is still in the file")
				}
				return nil
			})
			if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
				t.Fatal(err)
			}
			all := ledger(t, s, store.LedgerFilter{})
			if e := all[len(all)-1]; e.Seq != 25001 || e.Time.Before(old[len(old)-1].Time) {
				t.Errorf("a new row after the move: seq %d time %s, want 25001 at or after %s", all[len(all)-1].Seq, all[len(all)-1].Time, old[len(old)-1].Time)
			}
			s.Close()

			// Once moved, it stays moved: the next Open has the same rows.
			s = openAt(t, path)
			defer s.Close()
			if got := ledger(t, s, store.LedgerFilter{}); len(got) != 25001 {
				t.Errorf("after a second Open: %d rows, want 25001", len(got))
			}
			if rep, err := CheckFile(path); err == nil {
				t.Errorf("CheckFile of an open store: %+v", rep)
			}
		})
	}
}

// TestLedgerDirMissing: a store whose ledger has rows refuses to start
// without its directory (left behind in a move) or with an older one.
func TestLedgerDirMissing(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
		t.Fatal(err)
	}
	s.Close()
	saved := t.TempDir() + "/ledger"
	if err := os.Rename(LedgerDir(path), saved); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(path); err == nil || !strings.Contains(err.Error(), "ledger directory") || !strings.Contains(err.Error(), "missing") {
		if err == nil {
			s.Close()
		}
		t.Fatalf("Open without the ledger directory: %v", err)
	}
	if _, err := os.Stat(LedgerDir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open made a ledger directory: %v", err)
	}
	if _, err := CheckFile(path); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("CheckFile without the ledger directory: %v", err)
	}
	os.Rename(saved, LedgerDir(path))
	s = openAt(t, path)
	if got := ledger(t, s, store.LedgerFilter{}); len(got) != 1 {
		t.Fatalf("with the directory back: %d rows", len(got))
	}
	s.Close()
	rep, err := CheckFile(path)
	if err != nil || rep.LedgerRows != 1 {
		t.Fatalf("CheckFile: %+v %v", rep, err)
	}
}

// TestLedgerCrashPoints: a crash before the applier ran, between the
// ledger's append and the file's commit, and after both, each followed by
// a restart (and a second crash and restart): every acknowledged unit is
// in the ledger once, and the counters and the hourly rollups equal it.
func TestLedgerCrashPoints(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour // the test applies
	defer func(n int) { appendChunk = n }(appendChunk)
	appendChunk = 7 // every apply goes to the ledger in several blocks
	for _, point := range []string{"before the apply", "between ledger and file", "in the ledger's last block", "after the apply"} {
		t.Run(point, func(t *testing.T) {
			path := storePath(t)
			s := openAt(t, path)
			w := runWorkload(t, s, false)
			switch point {
			case "between ledger and file", "in the ledger's last block":
				cut := errors.New("crash")
				ledgerAppended = func() error { return cut }
				err := s.applyAll()
				ledgerAppended = nil
				if !errors.Is(err, cut) {
					t.Fatalf("apply: %v", err)
				}
				if s.led.Position() == 0 || s.applied.Load() != 0 {
					t.Fatalf("ledger at %d, file at %d: want the ledger ahead", s.led.Position(), s.applied.Load())
				}
			case "after the apply":
				if err := s.applyAll(); err != nil {
					t.Fatal(err)
				}
			}
			crash(t, s)
			if point == "in the ledger's last block" {
				// The last block (the one that moved the position) torn.
				segs, _ := filepath.Glob(filepath.Join(LedgerDir(path), "seg-*.raw"))
				last := segs[len(segs)-1]
				fi, err := os.Stat(last)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(last, fi.Size()-5); err != nil {
					t.Fatal(err)
				}
			}
			for round := range 2 {
				s = openAt(t, path)
				checkAgainstLedger(t, s, w.acked, whole(1007), 8*5)
				checkRollups(t, s)
				if round == 0 {
					crash(t, s)
				}
			}
			s.Close()
		})
	}
}

// checkRollups: the hourly rollups sum to the ledger's rows.
func checkRollups(t *testing.T, s *Store) {
	t.Helper()
	rows := ledger(t, s, store.LedgerFilter{})
	var units, cost billing.Units
	for _, e := range rows {
		units += e.Units
		cost += e.Cost
	}
	var calls int64
	var ru, rc billing.Units
	if err := s.ScanRollups(ctx, store.RollupFilter{}, func(r store.Rollup) error {
		calls += r.Calls
		ru += r.Units
		rc += r.Cost
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if calls != int64(len(rows)) || ru != units || rc != cost {
		t.Errorf("rollups: %d calls %s units %s cost; ledger: %d rows %s units %s cost", calls, ru, rc, len(rows), units, cost)
	}
}
