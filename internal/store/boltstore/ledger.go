package boltstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
	segledger "github.com/platformgw/gateway/internal/store/ledger"
)

// The ledger of record lives beside the store file, in the directory
// <store file>.ledger (internal/store/ledger: compact segments and hourly rollups),
// not in the database: at ~18 bytes a call instead of ~280 it is most of
// what keeps the store small. The applier appends each batch's entries to
// it, then commits the batch's counters to the database; the ledger's
// Position says which settlement-log records it has, so a replay after a
// crash between the two appends nothing twice (settle.go). The bbolt file
// lock makes the store the directory's only writer.

// LedgerDir is the ledger directory of the store file at path.
func LedgerDir(path string) string { return path + ".ledger" }

// Keys of the marker bucket that keep the ledger's numbering: the highest
// sequence number and the newest time handed out, written with every
// apply, so that numbers and times never go back even when pruning has
// taken every row that carried them.
var (
	keyLedgerSeq  = []byte("ledger_seq")
	keyLedgerTime = []byte("ledger_time")
	// keyLedgerPos is where the store kept the settlement-log position of
	// its ledger while the ledger was a bucket of the file.
	keyLedgerPos = []byte("ledger_position")
)

// importChunk is how many rows of the old ledger bucket one Append takes.
const importChunk = 10000

// appendChunk is how many of the applier's rows one Append takes at most
// (a block holds 256 MiB); a variable for the tests.
var appendChunk = 100000

func ledgerID(seq uint64) string { return "led_" + strconv.FormatUint(seq, 10) }

// ledgerAppended, when set (tests), runs after the ledger took a batch and
// before the database commits it; an error fails the apply there, as a
// crash between the two would.
var ledgerAppended func() error

// openLedger opens the ledger directory and moves the rows of the old
// ledger bucket into it, once. A store whose ledger has handed out
// numbers but whose directory is missing, or is behind the file, is
// refused: the directory was left behind in a move or a restore, and
// starting an empty one would lose the usage history.
func (s *Store) openLedger() error {
	dir := LedgerDir(s.path)
	var seq, applied, covers uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMarker)
		seq, applied = markerU64(m, keyLedgerSeq), markerU64(m, keySettled)
		covers = ledgerCovers(tx, applied)
		return nil
	})
	if err != nil {
		return err
	}
	if _, err := s.fs.ReadDir(dir); errors.Is(err, os.ErrNotExist) && seq > 0 {
		return fmt.Errorf("open store %s: its ledger directory %s is missing (the file has %d ledger rows numbered): move or restore the directory with the file (docs/operations.md, backups); the store is not started without its ledger",
			s.path, dir, seq)
	}
	led, err := segledger.Open(dir, segledger.Options{Covers: covers, FS: s.fs,
		ManualSeal: inlineBackground, Now: ledgerNow, SealBytes: ledgerSealBytes})
	if err != nil {
		return fmt.Errorf("open store %s: ledger directory %s: %w (restore it from the backup the store file came from; `caddy platform store check` names the damaged file)",
			s.path, dir, err)
	}
	s.led = led
	if err := s.migrateLedger(); err != nil {
		led.Close()
		return fmt.Errorf("open store %s: move the ledger bucket into %s: %w (nothing was lost: the bucket stays until the move finishes; fix the cause and start again)",
			s.path, dir, err)
	}
	if pos := led.Position(); pos < applied {
		led.Close()
		return fmt.Errorf("open store %s: its ledger directory %s covers the settlement log up to %d, the file up to %d: the directory is older than the file (restored from another backup?); restore both from the same backup (docs/operations.md, backups)",
			s.path, dir, pos, applied)
	}
	return nil
}

// ledgerCovers is the position the ledger directory must reach by the
// file's own record (applied), for the ledger to tell a damaged tail from a
// torn one (segledger.Options.Covers). While the old ledger bucket is
// still being moved, the directory may legitimately be short of it (the
// move's last blocks torn by a crash): then nothing is asked.
func ledgerCovers(tx *bolt.Tx, applied uint64) uint64 {
	if tx.Bucket(bucketLedger) != nil {
		return 0
	}
	return applied
}

// migrateLedger moves the rows of the ledger bucket (the store's ledger
// before the segmented ledger) into the ledger directory, then deletes the
// bucket and keeps its numbering in the marker. Each step is safe to cut
// short: the import skips the rows the ledger has (by Seq), and the
// bucket goes, in one transaction with the numbering, only once every row
// is in the ledger.
func (s *Store) migrateLedger() error {
	var exists bool
	var pos uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		exists = tx.Bucket(bucketLedger) != nil
		if raw := tx.Bucket(bucketMarker).Get(keyLedgerPos); len(raw) == 8 {
			pos = binary.BigEndian.Uint64(raw)
		}
		return nil
	})
	if err != nil || !exists {
		return err
	}
	start := time.Now()
	res, err := s.led.ImportBolt(context.Background(), s.db, bucketLedger, importChunk)
	if err != nil {
		return err
	}
	// The bucket's rows covered the settlement log up to pos (they were
	// written in the applier's transaction): the ledger does now.
	if pos > s.led.Position() {
		if err := s.led.Append(nil, pos); err != nil {
			return err
		}
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLedger)
		m := tx.Bucket(bucketMarker)
		seq := max(b.Sequence(), s.led.LastSeq(), markerU64(m, keyLedgerSeq))
		if err := m.Put(keyLedgerSeq, u64(seq)); err != nil {
			return err
		}
		if t := s.led.LastTime(); !t.IsZero() {
			if err := m.Put(keyLedgerTime, u64(uint64(max(t.UnixNano(), int64(markerU64(m, keyLedgerTime)))))); err != nil {
				return err
			}
		}
		if err := m.Delete(keyLedgerPos); err != nil {
			return err
		}
		return tx.DeleteBucket(bucketLedger)
	})
	if err != nil {
		return err
	}
	s.ledgerNote = fmt.Sprintf("moved %d ledger rows from the store file into %s in %s (%d were there already); `bbolt compact` gives the file's freed pages back to the disk",
		res.Rows, LedgerDir(s.path), time.Since(start).Round(time.Millisecond), res.Skipped)
	return nil
}

func markerU64(m *bolt.Bucket, key []byte) uint64 {
	if raw := m.Get(key); len(raw) == 8 {
		return binary.BigEndian.Uint64(raw)
	}
	return 0
}

// appendLedger hands the ledger a batch's entries, those it does not have
// yet: a batch whose database commit failed after its entries went in is
// handed over again, and a replay may start before the ledger's position.
// It runs in the applier's transaction, before the commit, and records the
// numbering there.
func (s *Store) appendLedger(tx *bolt.Tx, entries []store.LedgerEntry, upto uint64) error {
	last := s.led.LastSeq()
	i := 0
	for i < len(entries) && entries[i].Seq <= last {
		i++
	}
	entries = entries[i:]
	rows := entries
	// A batch the applier could not write for a long while (a full disk)
	// goes in blocks of appendChunk rows, the position moved by the last:
	// a crash between them leaves rows the replay skips by Seq.
	for len(rows) > appendChunk {
		if err := s.led.Append(rows[:appendChunk], s.led.Position()); err != nil {
			return err
		}
		rows = rows[appendChunk:]
	}
	if upto > s.led.Position() || len(rows) > 0 {
		if err := s.led.Append(rows, max(upto, s.led.Position())); err != nil {
			return err
		}
	}
	if ledgerAppended != nil {
		if err := ledgerAppended(); err != nil {
			return err
		}
	}
	if n := len(entries); n > 0 {
		m := tx.Bucket(bucketMarker)
		if err := m.Put(keyLedgerSeq, u64(entries[n-1].Seq)); err != nil {
			return err
		}
		return m.Put(keyLedgerTime, u64(uint64(entries[n-1].Time.UnixNano())))
	}
	return nil
}

// ScanLedger streams matching entries in time order, once every
// settlement acknowledged before the call is in the ledger.
func (s *Store) ScanLedger(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error {
	if err := s.ready(); err != nil {
		return err
	}
	if err := s.applyAll(); err != nil {
		return err
	}
	return s.led.Scan(ctx, f, fn)
}

// ScanRollups streams the hourly rollups of the ledger (store.RollupReader),
// once every settlement acknowledged before the call is in them.
func (s *Store) ScanRollups(ctx context.Context, f store.RollupFilter, fn func(store.Rollup) error) error {
	if err := s.ready(); err != nil {
		return err
	}
	if err := s.applyAll(); err != nil {
		return err
	}
	return s.led.ScanRollups(ctx, f, fn)
}

// PruneLedger removes the ledger's raw rows older than before, in whole
// segments (store.LedgerPruner); the rollups stay. The audit entries,
// completed with what goes, are committed to the file before the first
// segment file is removed.
func (s *Store) PruneLedger(ctx context.Context, before time.Time, audit ...store.AuditEntry) (store.PruneResult, error) {
	if err := s.ready(); err != nil {
		return store.PruneResult{Before: before}, err
	}
	if err := store.CtxErr(ctx); err != nil {
		return store.PruneResult{Before: before}, err
	}
	if err := checkCutoff(before); err != nil {
		return store.PruneResult{Before: before}, err
	}
	if len(audit) == 0 {
		return s.led.Prune(before)
	}
	return s.led.PruneWith(before, func(planned store.PruneResult) error {
		return s.update(func(tx *bolt.Tx) error { return appendAudit(tx, store.WithPruned(audit, planned)) })
	})
}

// PruneRollups forgets the hourly rollups of hours before before
// (store.RollupPruner).
func (s *Store) PruneRollups(ctx context.Context, before time.Time) (int, error) {
	if err := s.ready(); err != nil {
		return 0, err
	}
	if err := store.CtxErr(ctx); err != nil {
		return 0, err
	}
	if err := checkCutoff(before); err != nil {
		return 0, err
	}
	return s.led.PruneRollups(before)
}

// checkCutoff refuses a prune cutoff that is zero or in the future: it
// would remove rows still being written (store.ErrBadCutoff).
func checkCutoff(before time.Time) error {
	if before.IsZero() || before.After(time.Now()) {
		return fmt.Errorf("%w: %s", store.ErrBadCutoff, before.Format(time.RFC3339))
	}
	return nil
}

// ready is nil when the store can read its ledger: sound, and not the
// Unusable stand-in (which has none).
func (s *Store) ready() error {
	if err := s.Err(); err != nil {
		return err
	}
	if s.led == nil {
		return ErrClosed
	}
	return nil
}

// LedgerStats describes the ledger directory (for the scale tests and the
// operators' numbers).
func (s *Store) LedgerStats() segledger.Stats {
	if s.led == nil {
		return segledger.Stats{}
	}
	return s.led.Stats()
}

// checkLedgerAgainst verifies every row of the ledger directory of the
// store file at path, if it has one, and that it is not behind the file
// (applied is the file's settlement-log position): the ledger's part of
// CheckFile. Then, when db is not nil, it compares the counters of db with
// the ledger's rows up to ledgerSeq (crossCheck); a store without a ledger
// directory has no rows, and its counters are compared with none. The
// gateway must not be running (CheckFile holds the file's lock); opening
// finishes what a crash left, as a start would.
func checkLedgerAgainst(path string, applied uint64, db *bolt.DB, ledgerSeq uint64) (rows int64, cc CrossCheck, err error) {
	dir := LedgerDir(path)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if db != nil {
			cc, err = crossCheck(db, nil, ledgerSeq)
		}
		return 0, cc, err
	}
	// applied is 0 while the old ledger bucket is still in the file, as
	// ledgerCovers asks.
	led, err := segledger.Open(dir, segledger.Options{Covers: applied})
	if err != nil {
		return 0, cc, fmt.Errorf("ledger directory %s: %w", dir, err)
	}
	if pos := led.Position(); pos < applied {
		led.Close()
		return 0, cc, fmt.Errorf("ledger directory %s covers the settlement log up to %d, the file up to %d: the directory is older than the file; restore both from the same backup",
			dir, pos, applied)
	}
	rows, err = led.Verify(context.Background())
	if err == nil && db != nil {
		cc, err = crossCheck(db, led, ledgerSeq)
	}
	if cerr := led.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return rows, cc, fmt.Errorf("ledger directory %s: %w", dir, err)
	}
	return rows, cc, nil
}

var (
	_ store.RollupReader = (*Store)(nil)
	_ store.LedgerPruner = (*Store)(nil)
	_ store.RollupPruner = (*Store)(nil)
)
