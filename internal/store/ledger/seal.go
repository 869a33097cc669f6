package ledger

import (
	"fmt"
	"path/filepath"
	"slices"

	"go.uber.org/zap"
)

// Sealing: the active segment is rotated by size or age, and the sealer
// replaces every raw segment but the active one by its sealed form.

// rotate closes the active segment for sealing and starts a new one. A
// failure to start the new one is logged, and appends go on in the old.
func (l *Ledger) rotate() {
	old := l.active
	if err := l.newActive(); err != nil {
		l.logger().Error("could not start a new ledger segment; the active one grows on", zap.Error(err))
		return
	}
	old.Close()
	l.kickSealer()
}

func (l *Ledger) kickSealer() {
	select {
	case l.sealReq <- struct{}{}:
	default:
	}
}

// sealer seals, in the background, every raw segment but the active one.
func (l *Ledger) sealer() {
	defer l.wg.Done()
	for {
		select {
		case <-l.done:
			return
		case <-l.sealReq:
		}
		if err := l.sealPending(l.done); err != nil {
			l.logger().Error("sealing a ledger segment failed; it stays raw (readable) and is retried at the next seal",
				zap.Error(err))
		}
	}
}

// SealPending seals, now and in the caller's goroutine, every raw segment
// but the active one: the background sealer's work, for a ledger opened
// with ManualSeal.
func (l *Ledger) SealPending() error { return l.sealPending(nil) }

// sealPending seals the raw segments but the active one, oldest first,
// until one fails or stop is closed. A failure is kept for Close.
func (l *Ledger) sealPending(stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		l.mu.Lock()
		var next *segMeta
		for _, m := range l.segs[:len(l.segs)-1] {
			if !m.sealed {
				c := *m
				next = &c
				break
			}
		}
		l.mu.Unlock()
		if next == nil {
			return nil
		}
		if err := l.sealOnce(next); err != nil {
			err = fmt.Errorf("seal %s: %w", next.path, err)
			l.mu.Lock()
			l.bg = err
			l.mu.Unlock()
			return err
		}
	}
}

// sealOnce seals m unless it is sealed already (by Seal or the sealer).
func (l *Ledger) sealOnce(m *segMeta) error {
	l.sealMu.Lock()
	defer l.sealMu.Unlock()
	l.mu.Lock()
	i := slices.IndexFunc(l.segs, func(s *segMeta) bool { return s.base == m.base })
	still := i >= 0 && !l.segs[i].sealed
	l.mu.Unlock()
	if !still {
		return nil
	}
	return l.seal(m)
}

// seal replaces raw segment m by its sealed form: written under a .tmp
// name, synced, renamed, the directory synced; only then is the raw file
// removed, and a rollup log frame written to cover it.
func (l *Ledger) seal(m *segMeta) error {
	final := filepath.Join(l.dir, segName(m.base, sealedExt))
	tmp := final + tmpExt
	if m.rows == 0 {
		return l.replace(m, nil)
	}
	sm, err := sealRaw(l.fs, m, tmp, l.opts.ChunkRows, l.opts.Level)
	if err != nil {
		return err
	}
	if err := l.fs.Rename(tmp, final); err != nil {
		l.fs.Remove(tmp)
		return err
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return err
	}
	sm.path, sm.base = final, m.base
	if err := l.replace(m, &sm); err != nil {
		return err
	}
	return l.saveRollups()
}

// replace swaps raw segment m for sealed (nil: just drops an empty one)
// and removes the raw file. A scan that holds the raw segment reads on
// from its open file, or from the sealed one if it had not opened it yet.
func (l *Ledger) replace(m *segMeta, sealed *segMeta) error {
	l.mu.Lock()
	i := slices.IndexFunc(l.segs, func(s *segMeta) bool { return s.base == m.base })
	if i >= 0 {
		if sealed != nil {
			l.segs[i] = sealed
		} else {
			l.segs = slices.Delete(l.segs, i, i+1)
		}
	}
	l.mu.Unlock()
	if err := l.fs.Remove(m.path); err != nil {
		return err
	}
	return l.fs.SyncDir(l.dir)
}

// Seal seals the active segment now (if it holds rows) and waits until
// every raw segment but the new active one is sealed: tests, the scale
// benchmark and an operator's "make it prunable now".
func (l *Ledger) Seal() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	if seg := l.segs[len(l.segs)-1]; seg.rows > 0 {
		l.rotate()
	}
	var todo []segMeta
	for _, m := range l.segs[:len(l.segs)-1] {
		if !m.sealed {
			todo = append(todo, *m)
		}
	}
	l.mu.Unlock()
	for i := range todo {
		if err := l.sealOnce(&todo[i]); err != nil {
			return err
		}
	}
	return nil
}
