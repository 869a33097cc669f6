package boltstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The audit log keeps entries across a reopen and pages through them
// newest first without losing or repeating one.
func TestAuditAppendListReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range 5 {
		e, err := s.AppendAudit(ctx, store.AuditEntry{Time: at, Actor: "admin-api", Action: "key.create", KeyID: fmt.Sprint("k", i)})
		if err != nil {
			t.Fatal(err)
		}
		if e.Seq != uint64(i+1) {
			t.Fatalf("seq %d, want %d", e.Seq, i+1)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []string
	cursor := ""
	for range 10 {
		page, next, err := s.ListAudit(ctx, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			got = append(got, e.KeyID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if fmt.Sprint(got) != "[k4 k3 k2 k1 k0]" {
		t.Fatalf("audit pages %v", got)
	}
	if _, _, err := s.ListAudit(ctx, "x", 2); !errors.Is(err, store.ErrBadCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}

// TestCreditsAddedReplayedWithAuditAfterCrash: credits an operator adds
// are one settlement-log record with their audit entry (AddCredits): a
// crash after the log took it and before the applier wrote it to the
// file restores both at the next start, the entry completed with the
// balance, and a second restart adds neither again.
func TestCreditsAddedReplayedWithAuditAfterCrash(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour // nothing is applied before the crash
	defer func() { applyGrantsAtOnce = true }()
	applyGrantsAtOnce = false
	path := storePath(t)
	s := openAt(t, path)
	subscribe(t, s, "u1", "svc", prepaid, whole(5))
	e := store.AuditEntry{Time: t0, Actor: "console:op", Action: "credits.add", UserID: "u1", ServiceID: "svc", Detail: "amount 2.5"}
	if _, err := s.AddCredits(ctx, "u1", "svc", billing.Units(2_500_000), t0, e); err != nil {
		t.Fatal(err)
	}
	var onFile int
	s.view(func(tx *bolt.Tx) error { onFile = tx.Bucket(bucketAudit).Stats().KeyN; return nil })
	crash(t, s)

	for _, when := range []string{"after the crash", "after a second restart"} {
		s = openAt(t, path)
		sub, err := s.GetSubscription(ctx, "u1", "svc")
		if err != nil || sub.Credits != billing.Units(7_500_000) {
			t.Fatalf("%s: %+v, %v; want a balance of 7.5", when, sub, err)
		}
		entries, _, err := s.ListAudit(ctx, "", 10)
		if err != nil || len(entries) != 1 || entries[0].Detail != "amount 2.5, balance 7.5" || entries[0].Actor != "console:op" ||
			entries[0].Seq != 1 || !entries[0].Time.Equal(t0) {
			t.Fatalf("%s: audit log %+v, %v; want the one credits.add entry", when, entries, err)
		}
		s.Close()
	}
	if onFile != 0 {
		t.Errorf("the test meant the entry to be only in the log, but the file had %d", onFile)
	}
}
