package boltstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

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
