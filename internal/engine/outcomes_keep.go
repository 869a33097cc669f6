package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// Counts a process could not add to the store by its stop (the database
// unreachable, a full disk) are not dropped with the process: Keep writes
// them, as the batches they would have been sent in, to a small file
// next to the store (the platform app names it), and the next process
// reads it (LoadKept) and sends those batches, unchanged, before its own.
// A batch keeps its writer and sequence number, so one that the store did
// apply at the stop (its answer lost) adds nothing when sent again; the
// file is removed once every batch in it was applied.

// KeepMaxRows bounds the rows a kept-outcomes file holds: past it the
// oldest batches are dropped (and counted as lost), so an outage that
// spans many restarts cannot grow the file without end. At about 400
// bytes a row the file stays under 40 MB.
var KeepMaxRows = 100_000

// keptFile is the file's format.
type keptFile struct {
	Version int         `json:"version"`
	Batches []keptBatch `json:"batches"`
}

type keptBatch struct {
	Writer string             `json:"writer"`
	Seq    uint64             `json:"seq"`
	Rows   []store.OutcomeRow `json:"rows"`
}

func batchCalls(b store.OutcomeBatch) (n int64) {
	for _, r := range b.Rows {
		n += r.Calls
	}
	return n
}

// Keep writes every count not yet added to a store (the batch sent and
// not confirmed, what was counted since, and what LoadKept read and was
// not sent) to path, replacing it, for LoadKept at the next start; with
// nothing left it removes path. It answers the calls the file holds, and
// the calls of the oldest batches dropped to stay within KeepMaxRows. A
// process calls it at its stop, after a last Flush failed. If it fails
// the counts stay in memory, for a later Flush or Keep.
func (c *OutcomeCounter) Keep(path string, now time.Time) (calls, dropped int64, err error) {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	all := append([]store.OutcomeBatch(nil), c.kept...)
	if c.pending != nil {
		all = append(all, *c.pending)
	}
	if rows := c.drain(now); len(rows) > 0 {
		c.seq++
		all = append(all, store.OutcomeBatch{Writer: c.writer, Seq: c.seq, Rows: rows})
	}
	rows := 0
	for _, b := range all {
		rows += len(b.Rows)
	}
	for len(all) > 1 && rows > KeepMaxRows {
		rows -= len(all[0].Rows)
		dropped += batchCalls(all[0])
		all = all[1:]
	}
	// From here on the counts are in all: kept, in order, if the file
	// cannot be written.
	c.kept, c.pending = all, nil
	if len(all) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, dropped, err
		}
		return 0, dropped, nil
	}
	f := keptFile{Version: 1, Batches: make([]keptBatch, len(all))}
	for i, b := range all {
		f.Batches[i] = keptBatch{Writer: b.Writer, Seq: b.Seq, Rows: b.Rows}
		calls += batchCalls(b)
	}
	data, err := json.Marshal(f)
	if err != nil {
		return 0, dropped, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return 0, dropped, err
	}
	// A crash leaves the old file or the new one, never a part.
	if err := vfs.WriteFileAtomic(vfs.OS, path, path+".tmp", data); err != nil {
		return 0, dropped, err
	}
	c.kept, c.keptPath = nil, path
	return calls, dropped, nil
}

// LoadKept reads the batches an earlier process kept in path (Keep), to
// be sent before anything else by the next Flush, which removes path
// once all of them were applied. A missing file is nothing kept. It
// answers how many batches and calls it read.
func (c *OutcomeCounter) LoadKept(path string) (batches int, calls int64, err error) {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	c.keptPath = path
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	var f keptFile
	if err := json.Unmarshal(data, &f); err != nil {
		return 0, 0, fmt.Errorf("kept call outcomes %s: %w", path, err)
	}
	if f.Version != 1 {
		return 0, 0, fmt.Errorf("kept call outcomes %s: version %d, want 1", path, f.Version)
	}
	type id struct {
		writer string
		seq    uint64
	}
	have := make(map[id]bool, len(c.kept))
	for _, b := range c.kept {
		have[id{b.Writer, b.Seq}] = true
	}
	var read []store.OutcomeBatch
	for _, kb := range f.Batches {
		b := store.OutcomeBatch{Writer: kb.Writer, Seq: kb.Seq, Rows: kb.Rows}
		if have[id{b.Writer, b.Seq}] || store.CheckOutcomeBatch(b) != nil {
			continue
		}
		read = append(read, b)
		calls += batchCalls(b)
	}
	c.kept = append(read, c.kept...)
	return len(read), calls, nil
}

// sendKept adds the kept batches to s in order, and removes their file
// once all are applied. Called with flushMu held.
func (c *OutcomeCounter) sendKept(ctx context.Context, s store.Outcomes) error {
	if len(c.kept) == 0 {
		return nil
	}
	for len(c.kept) > 0 {
		if _, err := s.AddOutcomes(ctx, c.kept[0]); err != nil && !errors.Is(err, store.ErrBadOutcomeBatch) {
			return err
		}
		c.kept = c.kept[1:]
	}
	c.kept = nil
	if c.keptPath != "" {
		// If this fails the next start sends the batches again, and the
		// store adds nothing for them.
		_ = os.Remove(c.keptPath)
	}
	return nil
}
