package pgstore

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// Nodes starting together on an empty database make one schema.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	dsn := newDatabase(t)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	stores := make([]*Store, 3)
	for i := range stores {
		wg.Go(func() {
			stores[i], errs[i] = Open(context.Background(), Options{DSN: dsn, NodeID: "n"})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	var n, max int
	if err := stores[0].pool.QueryRow(context.Background(), "SELECT count(*), max(version) FROM pgstore_migrations").Scan(&n, &max); err != nil {
		t.Fatal(err)
	}
	if n != SchemaVersion || max != SchemaVersion {
		t.Fatalf("migrations recorded: %d up to %d, want %d", n, max, SchemaVersion)
	}
	// A fourth node finds nothing to do.
	openNode(t, dsn, "late")
}

func TestKeysAcrossNodes(t *testing.T) {
	dsn := newDatabase(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	ctx := context.Background()
	h := sha256.Sum256([]byte("pk_secret"))
	k := store.KeyRecord{ID: "0b7c3f4e-0000-4000-8000-000000000001", Hash: h, UserID: "u1", Roles: []string{"consumer"}, Created: time.Now().UTC()}
	if err := a.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateKey(ctx, k); !errors.Is(err, store.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	got, err := b.KeyByHash(ctx, h)
	if err != nil || got.ID != k.ID || got.UserID != "u1" || got.Hash != h {
		t.Fatalf("KeyByHash on b: %+v %v", got, err)
	}
	if _, err := b.KeyByHash(ctx, sha256.Sum256([]byte("other"))); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}
	first := time.Now().UTC().Truncate(time.Second)
	if _, err := a.RevokeKey(ctx, k.ID, first); err != nil {
		t.Fatal(err)
	}
	r, err := a.RevokeKey(ctx, k.ID, first.Add(time.Hour))
	if err != nil || !r.RevokedAt.Equal(first) {
		t.Fatalf("second revoke kept %v (%v), want %v", r.RevokedAt, err, first)
	}
	list, err := b.ListKeys(ctx, "u1")
	if err != nil || len(list) != 1 {
		t.Fatalf("ListKeys: %v %v", list, err)
	}
	if _, err := b.KeyByID(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("KeyByID unknown: %v", err)
	}
}

func TestSubscriptionsAndCredits(t *testing.T) {
	dsn := newDatabase(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	ctx := context.Background()
	if _, err := a.GetSubscription(ctx, "u", "svc"); !errors.Is(err, store.ErrNoAccount) {
		t.Fatalf("missing: %v", err)
	}
	subscribe(t, a, "u", "svc", "basic")
	if _, err := b.AddCredits(ctx, "u", "svc", units(10), time.Now()); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	s2, err := b.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "svc", ProductID: "pro", Status: "ACTIVE", StartedAt: start, UpdatedAt: time.Now()})
	if err != nil || s2.Credits != units(10) || s2.StartedAt.Equal(start) {
		t.Fatalf("update keeps start and balance: %+v %v", s2, err)
	}
	got, err := a.GetSubscription(ctx, "u", "svc")
	if err != nil || got.ProductID != "pro" || got.Credits != units(10) {
		t.Fatalf("a sees %+v %v", got, err)
	}
	subscribe(t, a, "u", "svc2", "basic")
	subscribe(t, a, "v", "svc", "basic")
	page, next, err := a.ListSubscriptions(ctx, "", "", 2)
	if err != nil || len(page) != 2 || next == "" {
		t.Fatalf("page 1: %v %q %v", page, next, err)
	}
	page, next, err = a.ListSubscriptions(ctx, "", next, 2)
	if err != nil || len(page) != 1 || next != "" || page[0].UserID != "v" {
		t.Fatalf("page 2: %v %q %v", page, next, err)
	}
	if _, _, err := a.ListSubscriptions(ctx, "v", "!!", 2); !errors.Is(err, store.ErrBadCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}

func TestAuditPages(t *testing.T) {
	s := openNode(t, newDatabase(t), "a")
	ctx := context.Background()
	for i := range 5 {
		if _, err := s.AppendAudit(ctx, store.AuditEntry{Time: time.Now(), Actor: "t", Action: "key.create", Detail: string(rune('a' + i))}); err != nil {
			t.Fatal(err)
		}
	}
	var all []store.AuditEntry
	cursor := ""
	for range 10 {
		page, next, err := s.ListAudit(ctx, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if next == "" {
			break
		}
		cursor = next
	}
	if len(all) != 5 || all[0].Seq != 5 || all[4].Seq != 1 {
		t.Fatalf("audit newest first: %+v", all)
	}
	if _, _, err := s.ListAudit(ctx, "x", 2); !errors.Is(err, store.ErrBadCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}
