package ledger

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// Reading the ledger back: rows in append order, segment by segment, and
// the hourly rollups.

// Verify reads every row of every segment, checking every checksum: the
// ledger's part of a store check. The first damage is an error naming its
// file.
func (l *Ledger) Verify(ctx context.Context) (rows int64, err error) {
	err = l.Scan(ctx, store.LedgerFilter{}, func(store.LedgerEntry) error {
		rows++
		return nil
	})
	return rows, err
}

// Scan calls fn for each entry matching f (From <= Time < To, zero bounds
// open) in append order, which is time order, stopping at fn's first
// error. It reads one block or chunk at a time, so its memory does not
// grow with the ledger, and takes no lock while fn runs. A damaged
// segment is an error naming its file.
func (l *Ledger) Scan(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	segs := make([]segMeta, len(l.segs))
	for i, m := range l.segs {
		segs[i] = *m
	}
	l.mu.Unlock()
	from, to := int64(0), int64(0)
	if !f.From.IsZero() {
		from = f.From.UnixNano()
	}
	if !f.To.IsZero() {
		to = f.To.UnixNano()
	}
	visit := func(e *store.LedgerEntry) error {
		if (f.UserID != "" && e.UserID != f.UserID) || (f.ServiceID != "" && e.ServiceID != f.ServiceID) ||
			(!f.From.IsZero() && e.Time.Before(f.From)) || (!f.To.IsZero() && !e.Time.Before(f.To)) {
			return nil
		}
		return fn(*e)
	}
	var cr *chunkReader
	defer func() {
		if cr != nil {
			cr.close()
		}
	}()
	for i := range segs {
		m := &segs[i]
		if err := ctx.Err(); err != nil {
			return err
		}
		if m.rows == 0 || !overlaps(m.minTime, m.maxTime, from, to) {
			continue
		}
		if !m.sealed {
			_, err := readRaw(l.fs, m.path, m.base, m.size, false, visit)
			if !errors.Is(err, os.ErrNotExist) {
				if err != nil {
					return err
				}
				continue
			}
			// Sealed since the scan began: read the sealed file.
			sm, err := readSealedMeta(l.fs, filepath.Join(l.dir, segName(m.base, sealedExt)), m.base)
			if err != nil {
				return err
			}
			*m = sm
		}
		if (f.UserID != "" && !m.dict.has(f.UserID)) || (f.ServiceID != "" && !m.dict.has(f.ServiceID)) {
			continue
		}
		if cr == nil {
			var err error
			if cr, err = newChunkReader(); err != nil {
				return err
			}
		}
		if err := l.readSealed(cr, m, from, to, visit); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // pruned while the scan ran
			}
			return err
		}
	}
	return nil
}

// readSealed reads the chunks of a sealed segment that may hold rows in
// [from, to).
func (l *Ledger) readSealed(cr *chunkReader, m *segMeta, from, to int64, fn func(*store.LedgerEntry) error) error {
	f, err := vfs.Open(l.fs, m.path)
	if err != nil {
		return err
	}
	defer f.Close()
	for i := range m.chunks {
		c := &m.chunks[i]
		if !overlaps(c.minTime, c.maxTime, from, to) {
			continue
		}
		if err := cr.read(f, m, i, fn); err != nil {
			return err
		}
	}
	return nil
}

// ScanRollups calls fn for each hourly rollup matching f in (hour, user,
// service, endpoint, product) order.
func (l *Ledger) ScanRollups(ctx context.Context, f store.RollupFilter, fn func(store.Rollup) error) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	rs := l.roll.collect(f)
	l.mu.Unlock()
	for i, r := range rs {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}
