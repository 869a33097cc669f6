package ledger

import (
	"errors"
	"math"
	"os"
	"slices"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// Retention: whole sealed segments go, and old hours' rollups.

// Prune removes the sealed segments whose newest row is older than before,
// at once and whole. A rollup log frame is written first, so that rollups
// never depend on rows that are gone. The active segment is never removed:
// it is sealed by size or age (SealAge), or here when all its rows are
// older than before, and goes then.
func (l *Ledger) Prune(before time.Time) (store.PruneResult, error) {
	return l.PruneWith(before, nil)
}

// PruneWith is Prune that calls commit, when it is not nil, with what the
// prune is about to remove (the segments chosen, their rows and bytes),
// after the rollup log frame is written and before any file goes; an
// error from commit removes nothing and is the prune's. The store writes
// the prune's audit entry there, so that no rows go without one. It is not
// called when nothing is to go.
func (l *Ledger) PruneWith(before time.Time, commit func(planned store.PruneResult) error) (store.PruneResult, error) {
	res := store.PruneResult{Before: before}
	cut := before.UnixNano()
	if before.Year() < 1678 {
		cut = math.MinInt64
	} else if before.Year() > 2261 {
		cut = math.MaxInt64
	}
	prunable := func(i int, m *segMeta) bool { return m.sealed && i < len(l.segs)-1 && m.maxTime < cut }
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return res, ErrClosed
	}
	// An active segment whose rows are all older (a gateway that went
	// quiet, so nothing sealed it by age) is sealed now, to go too.
	if a := l.segs[len(l.segs)-1]; a.rows > 0 && a.maxTime < cut {
		l.mu.Unlock()
		if err := l.Seal(); err != nil {
			return res, err
		}
		l.mu.Lock()
	}
	l.mu.Unlock()
	// Files go under sealMu, so that a Snapshot never lists one that is
	// about to go.
	l.sealMu.Lock()
	defer l.sealMu.Unlock()
	l.mu.Lock()
	any := false
	for i, m := range l.segs {
		any = any || prunable(i, m)
	}
	l.mu.Unlock()
	if !any {
		return res, nil
	}
	if err := l.saveRollups(); err != nil {
		return res, err
	}
	l.mu.Lock()
	var gone []*segMeta
	keep := l.segs[:0:0]
	planned := store.PruneResult{Before: before}
	for i, m := range l.segs {
		if prunable(i, m) {
			gone = append(gone, m)
			planned.Segments++
			planned.Rows += m.rows
			planned.Bytes += m.size
			continue
		}
		keep = append(keep, m)
	}
	if commit != nil {
		// The segments chosen stay listed until commit said yes: a sealed
		// segment changes no more, and none is sealed or removed
		// meanwhile (sealMu).
		l.mu.Unlock()
		if err := commit(planned); err != nil {
			return res, err
		}
		l.mu.Lock()
		keep = l.segs[:0:0]
		for _, m := range l.segs {
			if !slices.Contains(gone, m) {
				keep = append(keep, m)
			}
		}
	}
	l.segs = keep
	l.mu.Unlock()
	var errs []error
	for _, m := range gone {
		if err := l.fs.Remove(m.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		res.Segments++
		res.Rows += m.rows
		res.Bytes += m.size
	}
	if len(gone) > 0 {
		errs = append(errs, l.fs.SyncDir(l.dir))
	}
	return res, errors.Join(errs...)
}

// PruneRollups forgets the hourly rollups of hours before before and
// records that in the rollup log; it returns how many went.
func (l *Ledger) PruneRollups(before time.Time) (int, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, ErrClosed
	}
	n := l.roll.dropBefore(hourOf(before))
	l.mu.Unlock()
	if n == 0 {
		return 0, nil
	}
	return n, l.saveRollups()
}
