package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
)

// The call outcomes (store.Outcomes): one bucket of hourly rows, summed
// as batches arrive (one process writes a bbolt file, so there is no node
// to keep apart), and one of the writers' last applied batch, changed in
// the same transaction.
var (
	// hour(8) user \0 service \0 endpoint \0 product \0 outcome -> outcomeValue
	bucketOutcomes = []byte("outcomes")
	// writer -> seq(8) unix seconds of its last batch(8)
	bucketOutcomeWriters = []byte("outcome_writers")
)

func init() { allBuckets = append(allBuckets, bucketOutcomes, bucketOutcomeWriters) }

// outcomeValueLen is a row's fixed-width value: calls, then each
// histogram's buckets and sum, big-endian.
const outcomeValueLen = 8 * (1 + 2*(store.LatencyBuckets+1))

func outcomeKey(k store.OutcomeKey) []byte {
	b := make([]byte, 8, 8+len(k.UserID)+len(k.ServiceID)+len(k.EndpointID)+len(k.ProductID)+len(k.Outcome)+4)
	binary.BigEndian.PutUint64(b, uint64(k.Hour.Unix()))
	b = append(b, k.UserID...)
	b = append(append(b, 0), k.ServiceID...)
	b = append(append(b, 0), k.EndpointID...)
	b = append(append(b, 0), k.ProductID...)
	return append(append(b, 0), k.Outcome...)
}

func parseOutcomeKey(b []byte) (store.OutcomeKey, bool) {
	if len(b) < 8 {
		return store.OutcomeKey{}, false
	}
	parts := strings.Split(string(b[8:]), "\x00")
	if len(parts) != 5 {
		return store.OutcomeKey{}, false
	}
	return store.OutcomeKey{
		Hour:   time.Unix(int64(binary.BigEndian.Uint64(b)), 0).UTC(),
		UserID: parts[0], ServiceID: parts[1], EndpointID: parts[2], ProductID: parts[3], Outcome: parts[4],
	}, true
}

func encodeOutcome(r store.OutcomeRow) []byte {
	b := make([]byte, 0, outcomeValueLen)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Calls))
	for _, l := range [2]store.Latency{r.Gateway, r.Backend} {
		for _, n := range l.Buckets {
			b = binary.BigEndian.AppendUint64(b, uint64(n))
		}
		b = binary.BigEndian.AppendUint64(b, uint64(l.SumMicros))
	}
	return b
}

func decodeOutcome(b []byte, r *store.OutcomeRow) bool {
	if len(b) != outcomeValueLen {
		return false
	}
	next := func() int64 {
		v := int64(binary.BigEndian.Uint64(b))
		b = b[8:]
		return v
	}
	r.Calls = next()
	for _, l := range [2]*store.Latency{&r.Gateway, &r.Backend} {
		for i := range l.Buckets {
			l.Buckets[i] = next()
		}
		l.SumMicros = next()
	}
	return true
}

// AddOutcomes adds the batch's rows unless its writer had this batch or a
// later one applied (store.Outcomes), durably before it returns.
func (s *Store) AddOutcomes(ctx context.Context, batch store.OutcomeBatch) (bool, error) {
	if err := store.CtxErr(ctx); err != nil {
		return false, err
	}
	if err := store.CheckOutcomeBatch(batch); err != nil {
		return false, err
	}
	applied := false
	err := s.update(func(tx *bolt.Tx) error {
		applied = false // the commit loop may run fn again
		wkey := []byte(batch.Writer)
		switch raw, err := getRaw(tx, bucketOutcomeWriters, wkey); {
		case err == nil && len(raw) != 16:
			return recordError(bucketOutcomeWriters, wkey, "not an outcome writer's record")
		case err == nil && binary.BigEndian.Uint64(raw) >= batch.Seq:
			return nil // applied before
		case err != nil && err != store.ErrNotFound:
			return err // a damaged record: never guess that the batch is new
		}
		for _, r := range batch.Rows {
			k := outcomeKey(r.OutcomeKey)
			sum := r
			if raw, err := getRaw(tx, bucketOutcomes, k); err == nil {
				var old store.OutcomeRow
				if !decodeOutcome(raw, &old) {
					return fmt.Errorf("outcome row %x: %d bytes, want %d", k, len(raw), outcomeValueLen)
				}
				sum.Add(old)
			} else if err != store.ErrNotFound {
				return err
			}
			if err := putRaw(tx, bucketOutcomes, k, encodeOutcome(sum)); err != nil {
				return err
			}
		}
		w := binary.BigEndian.AppendUint64(nil, batch.Seq)
		w = binary.BigEndian.AppendUint64(w, uint64(time.Now().Unix()))
		applied = true
		return putRaw(tx, bucketOutcomeWriters, wkey, w)
	})
	if err != nil {
		return false, err
	}
	return applied, nil
}

// ScanOutcomes calls fn with the rows f selects in key order
// (store.Outcomes). The rows of a range are copied out first, so fn runs
// outside the read transaction.
func (s *Store) ScanOutcomes(ctx context.Context, f store.OutcomeFilter, fn func(store.OutcomeRow) error) error {
	const chunk = 1024
	var from []byte
	if !f.From.IsZero() {
		// Match keeps the hour out if From is inside it.
		from = binary.BigEndian.AppendUint64(nil, uint64(f.From.UTC().Truncate(time.Hour).Unix()))
	}
	for {
		if err := store.CtxErr(ctx); err != nil {
			return err
		}
		var rows []store.OutcomeRow
		var last []byte
		done := true
		err := s.view(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucketOutcomes).Cursor()
			k, v := c.First()
			if from != nil {
				k, v = c.Seek(from)
			}
			for ; k != nil; k, v = c.Next() {
				key, ok := parseOutcomeKey(k)
				if !ok {
					return recordError(bucketOutcomes, k, "not an outcome key")
				}
				if !f.To.IsZero() && !key.Hour.Before(f.To) {
					return nil
				}
				if len(rows) == chunk {
					done = false
					return nil
				}
				last = bytes.Clone(k)
				if !f.Match(key) {
					continue
				}
				payload, err := unseal(bucketOutcomes, k, v)
				if err != nil {
					return err
				}
				r := store.OutcomeRow{OutcomeKey: key}
				if !decodeOutcome(payload, &r) {
					return recordError(bucketOutcomes, k, "not an outcome value")
				}
				rows = append(rows, r)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, r := range rows {
			if err := fn(r); err != nil {
				return err
			}
		}
		if done {
			return nil
		}
		// The next chunk starts after the last key this one looked at.
		from = append(last, 0)
	}
}

// PruneOutcomes forgets the rows of hours before before's, and writers
// idle since before (store.Outcomes).
func (s *Store) PruneOutcomes(ctx context.Context, before time.Time) (int, error) {
	if err := store.CtxErr(ctx); err != nil {
		return 0, err
	}
	if err := checkCutoff(before); err != nil {
		return 0, err
	}
	cut := binary.BigEndian.AppendUint64(nil, uint64(before.UTC().Truncate(time.Hour).Unix()))
	n := 0
	err := s.update(func(tx *bolt.Tx) error {
		n = 0
		c := tx.Bucket(bucketOutcomes).Cursor()
		for k, _ := c.First(); k != nil && bytes.Compare(k[:min(8, len(k))], cut) < 0; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
			n++
		}
		// Collected first: a bbolt cursor skips keys after a Delete.
		var idle [][]byte
		wb := tx.Bucket(bucketOutcomeWriters)
		err := wb.ForEach(func(k, v []byte) error {
			payload, err := unseal(bucketOutcomeWriters, k, v)
			if err != nil {
				return err
			}
			if len(payload) == 16 && int64(binary.BigEndian.Uint64(payload[8:])) < before.Unix() {
				idle = append(idle, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range idle {
			if err := wb.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

var _ store.Outcomes = (*Store)(nil)
