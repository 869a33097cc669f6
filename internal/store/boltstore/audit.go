package boltstore

import (
	"context"
	"strconv"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
)

// bucketAudit holds the audit log: seq(8) -> AuditEntry. The bucket's own
// sequence numbers the entries, so they come out in the order written.
var bucketAudit = []byte("audit")

func init() { allBuckets = append(allBuckets, bucketAudit) }

// AppendAudit appends e to the audit log, durably, before it returns.
func (s *Store) AppendAudit(ctx context.Context, e store.AuditEntry) (store.AuditEntry, error) {
	if err := store.CtxErr(ctx); err != nil {
		return e, err
	}
	err := s.update(func(tx *bolt.Tx) error {
		es := []store.AuditEntry{e}
		if err := appendAudit(tx, es); err != nil {
			return err
		}
		e = es[0]
		return nil
	})
	return e, err
}

// appendAudit appends es to the audit log in tx, in order, setting each
// one's Seq: the entries of a change are written in the change's own
// transaction (CreateKey, RevokeKey, PutSubscription, a credit grant's
// apply), so a crash or a failed write keeps both or neither.
func appendAudit(tx *bolt.Tx, es []store.AuditEntry) error {
	b := tx.Bucket(bucketAudit)
	for i := range es {
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		es[i].Seq = seq
		if err := putJSON(tx, bucketAudit, u64(seq), es[i]); err != nil {
			return err
		}
	}
	return nil
}

// ListAudit pages through the audit log, newest first.
func (s *Store) ListAudit(_ context.Context, cursor string, limit int) ([]store.AuditEntry, string, error) {
	var before uint64
	if cursor != "" {
		// 63 bits, as PostgreSQL's bigserial: the same cursor is
		// malformed in both stores.
		n, err := strconv.ParseUint(cursor, 10, 63)
		if err != nil || n == 0 {
			return nil, "", store.ErrBadCursor
		}
		before = n
	}
	if limit < 1 {
		limit = 1
	}
	var out []store.AuditEntry
	next := ""
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketAudit).Cursor()
		var k, v []byte
		if before == 0 {
			k, v = c.Last()
		} else {
			// The first entry at or after the cursor; the page starts
			// just before it (the cursor's entry was on the last page).
			if k, _ = c.Seek(u64(before)); k == nil {
				k, v = c.Last()
			} else {
				k, v = c.Prev()
			}
		}
		for ; k != nil; k, v = c.Prev() {
			if len(out) == limit {
				next = strconv.FormatUint(out[len(out)-1].Seq, 10)
				return nil
			}
			var e store.AuditEntry
			if err := decodeJSON(bucketAudit, k, v, &e); err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	return out, next, err
}
