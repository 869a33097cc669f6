package boltstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"strconv"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/store"
)

// ledgerSink keeps the ledger of record.
type ledgerSink interface {
	// Append makes entries durable; they cover settlement-log positions up to upto.
	Append(entries []store.LedgerEntry, upto uint64) error
	// Position is the settlement-log position everything up to which is in the sink.
	Position() uint64
	Scan(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error
	Close() error
}

// boltLedger keeps the ledger in the database's ledger bucket, keyed by
// time and sequence number so that it scans in time order. It writes in
// the applier's transaction (tx, set for the length of one apply), so its
// rows, the counters they change and the log position they cover commit
// together, and Position is the store's applied position.
type boltLedger struct {
	s  *Store
	tx *bolt.Tx
}

// keyLedgerPos is where the ledger's settlement-log position is kept.
var keyLedgerPos = []byte("ledger_position")

// ledgerFillPercent is how full the append-only ledger's pages are left.
const ledgerFillPercent = 0.95

func ledgerID(seq uint64) string { return "led_" + strconv.FormatUint(seq, 10) }

// Append writes entries in the current apply transaction. Entries at or
// before Position were written already (a replay) and are skipped.
func (l *boltLedger) Append(entries []store.LedgerEntry, upto uint64) error {
	tx := l.tx
	m := tx.Bucket(bucketMarker)
	if raw := m.Get(keyLedgerPos); len(raw) == 8 && binary.BigEndian.Uint64(raw) >= upto {
		return nil
	}
	b := tx.Bucket(bucketLedger)
	// Keys only grow, so every split is at the right edge: bbolt's default
	// of splitting at half full left every ledger page half empty, the
	// file twice the size of its rows.
	b.FillPercent = ledgerFillPercent
	for _, e := range entries {
		raw, err := encodeLedger(e)
		if err != nil {
			return err
		}
		if err := b.Put(append(u64(uint64(e.Time.UnixNano())), u64(e.Seq)...), raw); err != nil {
			return err
		}
		if e.Seq > b.Sequence() {
			if err := b.SetSequence(e.Seq); err != nil {
				return err
			}
		}
	}
	return m.Put(keyLedgerPos, u64(upto))
}

// Position reads the ledger's position from the database.
func (l *boltLedger) Position() uint64 {
	var pos uint64
	l.s.db.View(func(tx *bolt.Tx) error {
		if raw := tx.Bucket(bucketMarker).Get(keyLedgerPos); len(raw) == 8 {
			pos = binary.BigEndian.Uint64(raw)
		}
		return nil
	})
	return pos
}

// Close has nothing of its own to release: the database is the store's.
func (l *boltLedger) Close() error { return nil }

// ScanLedger streams matching entries in time order, once every
// settlement acknowledged before the call is in the ledger.
func (s *Store) ScanLedger(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error {
	if err := s.Err(); err != nil {
		return err
	}
	if err := s.applyAll(); err != nil {
		return err
	}
	return s.sink.Scan(ctx, f, fn)
}

var _ ledgerSink = (*boltLedger)(nil)

// scanChunk is how many ledger entries one read transaction copies out, so
// an export streams a ledger of any size in bounded memory without holding
// a transaction open while the caller writes.
const scanChunk = 512

// Scan streams matching entries in time order.
func (l *boltLedger) Scan(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error {
	var seek []byte
	if !f.From.IsZero() {
		seek = u64(uint64(f.From.UnixNano()))
	}
	var end uint64
	if !f.To.IsZero() {
		end = uint64(f.To.UnixNano())
	}
	for {
		if err := ctxErr(ctx); err != nil {
			return err
		}
		var chunk []store.LedgerEntry
		var resume []byte
		err := l.s.view(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucketLedger).Cursor()
			k, v := c.First()
			if seek != nil {
				k, v = c.Seek(seek)
			}
			for scanned := 0; k != nil; k, v = c.Next() {
				if end != 0 && binary.BigEndian.Uint64(k) >= end {
					return nil
				}
				if len(chunk) == scanChunk || scanned == 8*scanChunk {
					resume = append([]byte(nil), k...)
					return nil
				}
				scanned++
				var rec ledgerRecord
				if err := json.Unmarshal(v, &rec); err != nil {
					return err
				}
				e := rec.entry()
				if (f.UserID == "" || e.UserID == f.UserID) && (f.ServiceID == "" || e.ServiceID == f.ServiceID) {
					chunk = append(chunk, e)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, e := range chunk {
			if err := fn(e); err != nil {
				return err
			}
		}
		if resume == nil {
			return nil
		}
		seek = resume
	}
}
