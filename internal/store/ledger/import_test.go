package ledger_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/ledger"
)

// oldRow is a ledger row as the bbolt store wrote it before the segmented
// ledger (internal/store/boltstore/records.go ledgerRecord, holdrecord.go
// encodeLedger): the entry's JSON, quantities as decimal text.
type oldRow struct {
	store.LedgerEntry
	Units        billing.Units `json:"units"`
	Overage      billing.Units `json:"overage,omitempty"`
	Cost         billing.Units `json:"cost,omitempty"`
	UnitsClaimed billing.Units `json:"unitsClaimed,omitempty"`
}

// stopAfter is a context that ends after its Err was asked calls times.
type stopAfter struct {
	context.Context
	calls int
}

func (s *stopAfter) Err() error {
	if s.calls == 0 {
		return context.Canceled
	}
	s.calls--
	return nil
}

// digest folds an export into a hash, field by field, in order.
func digest(h hash.Hash, e store.LedgerEntry) {
	fmt.Fprintf(h, "%d|%s|%d|%s|%s|%s|%s|%s|%d|%s|%s|%s|%s|%s|%s\n", e.Seq, e.ID, e.Time.UnixNano(), e.UserID, e.ServiceID,
		e.EndpointID, e.ProductID, e.RequestID, e.OccurredAt.UnixNano(), e.Units, e.Overage, e.Cost, e.Source,
		e.IdempotencyKey, e.UnitsClaimed)
}

// TestImportFromTheOldBucket fills a bbolt store's ledger bucket with a
// million rows in the old shape, exports it through the bbolt store's own
// ScanLedger, imports it into segments (resuming after an interruption
// half way) and checks the segments export exactly the same rows.
func TestImportFromTheOldBucket(t *testing.T) {
	n := 1_000_000
	if testing.Short() || raceOn {
		n = 60_000
	}
	path := filepath.Join(t.TempDir(), "platform.db")
	s, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := 0; i < n; {
		err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("ledger"))
			if err != nil {
				return err
			}
			for j := 0; j < 50000 && i < n; j++ {
				i++
				at += int64(r.IntN(2000)) * int64(time.Microsecond)
				e := oldRow{LedgerEntry: store.LedgerEntry{Seq: uint64(i), ID: fmt.Sprintf("led_%d", i),
					Time: time.Unix(0, at).UTC(), UserID: fmt.Sprintf("u%d", r.IntN(50)), ServiceID: "svc",
					EndpointID: "ep", ProductID: "basic", RequestID: uuid.NewString(), Source: store.SourceGateway},
					Units: billing.Units(r.Int64N(5e6))}
				if i%97 == 0 {
					e.Source, e.RequestID, e.IdempotencyKey = store.SourceReport, "", fmt.Sprint("k", i)
					e.OccurredAt = time.Unix(0, at-int64(time.Hour)).UTC()
					e.Units = -e.Units // stored figures may be negative
				}
				if i%13 == 0 {
					e.Overage, e.Cost, e.UnitsClaimed = 7, billing.Units(r.Int64N(1e9)), e.Units+1
				}
				v, err := json.Marshal(e)
				if err != nil {
					return err
				}
				k := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(at)), uint64(i))
				if err := b.Put(k, v); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	// Before: the rows as the old store exported them, in key order.
	before := sha256.New()
	rows := 0
	db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("ledger")).ForEach(func(_, v []byte) error {
			e, err := ledger.DecodeLegacy(v)
			if err != nil {
				return err
			}
			rows++
			digest(before, e)
			return nil
		})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if rows != n {
		t.Fatalf("the old export has %d rows, want %d", rows, n)
	}

	db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	dir := t.TempDir()
	l, err := ledger.Open(dir, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Interrupted half way (the context ends after n/2 rows), then run
	// again: it resumes.
	ctx := &stopAfter{Context: context.Background(), calls: n / 2 / 1000}
	res, err := l.ImportBolt(ctx, db, []byte("ledger"), 1000)
	if err != context.Canceled || res.Rows != int64(n/2) {
		t.Fatalf("interrupted import: %+v %v", res, err)
	}
	l.Close()
	l, err = ledger.Open(dir, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if res, err := l.ImportBolt(context.Background(), db, []byte("ledger"), 1000); err != nil || res.Rows != int64(n-n/2) || res.Skipped != int64(n/2) {
		t.Fatalf("the resumed import: %+v %v", res, err)
	}
	if err := l.Seal(); err != nil {
		t.Fatal(err)
	}
	after := sha256.New()
	rows = 0
	if err := l.Scan(context.Background(), store.LedgerFilter{}, func(e store.LedgerEntry) error {
		rows++
		digest(after, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if rows != n || string(before.Sum(nil)) != string(after.Sum(nil)) {
		t.Fatalf("after import: %d rows, export digest equal: %v", rows, string(before.Sum(nil)) == string(after.Sum(nil)))
	}
	st := l.Stats()
	t.Logf("%d rows imported: %d segments, %.1f bytes a row", n, st.Segments, float64(st.Bytes)/float64(n))
	db.Close()

	// The store does the same at Open, into its own ledger directory.
	s, err = boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	opened := sha256.New()
	rows = 0
	if err := s.ScanLedger(context.Background(), store.LedgerFilter{}, func(e store.LedgerEntry) error {
		rows++
		digest(opened, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if rows != n || string(before.Sum(nil)) != string(opened.Sum(nil)) {
		t.Fatalf("the store's export after Open: %d rows, digest equal: %v", rows, string(before.Sum(nil)) == string(opened.Sum(nil)))
	}
}
