package ledger

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// Before this package the bbolt store kept the ledger in its own "ledger"
// bucket: key time(8) seq(8) big-endian, value the entry as JSON with its
// quantities in the decimal text of billing.Units, read over the whole
// int64 range (store.Amount). ImportBolt moves such a bucket into segments
// once.

// legacyAmount reads a stored quantity: billing.Units' decimal text, but
// negative values and values past billing.MaxUnits accepted (store.Amount).
type legacyAmount = store.Amount

type legacyRecord struct {
	store.LedgerEntry
	Units        legacyAmount `json:"units"`
	Overage      legacyAmount `json:"overage,omitempty"`
	Cost         legacyAmount `json:"cost,omitempty"`
	UnitsClaimed legacyAmount `json:"unitsClaimed,omitempty"`
}

// DecodeLegacy decodes a row of the old bbolt ledger bucket.
func DecodeLegacy(v []byte) (store.LedgerEntry, error) {
	var r legacyRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return store.LedgerEntry{}, err
	}
	e := r.LedgerEntry
	e.Units, e.Overage, e.Cost, e.UnitsClaimed = billing.Units(r.Units), billing.Units(r.Overage),
		billing.Units(r.Cost), billing.Units(r.UnitsClaimed)
	return e, nil
}

// ImportResult says what ImportBolt moved.
type ImportResult struct {
	Rows    int64 // appended now
	Skipped int64 // already in the ledger (a resumed import)
}

// ImportBolt appends the rows of the old ledger bucket of db to l, in
// chunks of chunk rows (default 10,000), each Append durable, without
// moving Position. Rows whose Seq is not above l.LastSeq() are skipped, so
// an import a crash interrupted resumes where it stopped when run again.
// The store runs it once at Open, before anything else appends, then
// deletes the bucket (bbolt reuses the freed pages; `bbolt compact` gives
// the disk back). A row that does not decode stops the import with an
// error naming its key: nothing is dropped silently.
func (l *Ledger) ImportBolt(ctx context.Context, db *bolt.DB, bucket []byte, chunk int) (ImportResult, error) {
	if chunk <= 0 {
		chunk = 10000
	}
	var res ImportResult
	after := l.LastSeq()
	var resume []byte
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		var batch []store.LedgerEntry
		var next []byte
		err := db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucket)
			if b == nil {
				return nil
			}
			c := b.Cursor()
			k, v := c.First()
			if resume != nil {
				k, v = c.Seek(resume)
			}
			for ; k != nil; k, v = c.Next() {
				if len(batch) == chunk {
					next = append([]byte(nil), k...)
					return nil
				}
				if len(k) != 16 {
					return fmt.Errorf("ledger import: key %x is not time(8) seq(8)", k)
				}
				if binary.BigEndian.Uint64(k[8:]) <= after {
					res.Skipped++
					continue
				}
				e, err := DecodeLegacy(v)
				if err != nil {
					return fmt.Errorf("ledger import: row %x: %w", k, err)
				}
				if e.Seq <= after {
					return fmt.Errorf("ledger import: row %x has seq %d, not after %d: rows out of order", k, e.Seq, after)
				}
				after = e.Seq
				batch = append(batch, e)
			}
			return nil
		})
		if err != nil {
			return res, err
		}
		if len(batch) > 0 {
			if err := l.Append(batch, l.Position()); err != nil {
				return res, err
			}
			res.Rows += int64(len(batch))
		}
		if next == nil {
			return res, nil
		}
		resume = next
	}
}
