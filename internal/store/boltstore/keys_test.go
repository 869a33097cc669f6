package boltstore

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

func sameKey(a, b store.KeyRecord) bool {
	return a.ID == b.ID && a.Hash == b.Hash && a.UserID == b.UserID && slices.Equal(a.Roles, b.Roles) &&
		a.Label == b.Label && a.Created.Equal(b.Created) && a.ExpiresAt.Equal(b.ExpiresAt) && a.RevokedAt.Equal(b.RevokedAt)
}

// TestKeyIDsOldAndNew: a store written before key ids were UUIDs keeps its
// "key_…" ids working after a restart next to the UUIDs issued since, and a
// UUID is found in any case.
func TestKeyIDsOldAndNew(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	old := store.KeyRecord{ID: "key_AbCdEfGhIjKlMnOpQrSt", Hash: keyHash("sk_old"), UserID: "u1", Created: t0}
	if err := s.CreateKey(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openAt(t, path)
	fresh := store.KeyRecord{ID: servicekey.NewID(), Hash: keyHash("sk_new"), UserID: "u1", Created: t0.Add(time.Minute)}
	if err := s.CreateKey(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if got, err := s.KeyByID(ctx, strings.ToUpper(fresh.ID)); err != nil || !sameKey(got, fresh) {
		t.Errorf("KeyByID(upper case UUID) = %+v, %v", got, err)
	}
	if got, err := s.ListKeys(ctx, "u1"); err != nil || len(got) != 2 {
		t.Errorf("ListKeys = %+v, %v; want both keys", got, err)
	}
	k, err := s.RevokeKey(ctx, old.ID, t0.Add(time.Hour))
	if err != nil || k.ID != old.ID || !k.RevokedAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("RevokeKey(old id) = %+v, %v", k, err)
	}
	if k, err := s.KeyByHash(ctx, old.Hash); err != nil || k.RevokedAt.IsZero() {
		t.Errorf("the old key is not revoked: %+v, %v", k, err)
	}
	if k, err := s.KeyByID(ctx, fresh.ID); err != nil || !k.RevokedAt.IsZero() {
		t.Errorf("revoking the old key touched the new one: %+v, %v", k, err)
	}
}
