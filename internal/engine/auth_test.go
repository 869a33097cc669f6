package engine

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// testRuntime is a runtime around a real bbolt store in a temp dir, with
// an empty catalog and a fixed clock.
func testRuntime(t *testing.T, at time.Time) *Runtime {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cat, err := catalog.Compile(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return New(Runtime{Catalog: cat, Data: st, Clock: func() time.Time { return at }})
}

// addKey stores a new key of user and returns it as the caller sends it.
func addKey(t *testing.T, rt *Runtime, user string, expires, revoked time.Time) (string, store.KeyRecord) {
	t.Helper()
	key, hash, err := servicekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	rec := store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: user, Created: rt.Now().Add(-time.Hour), ExpiresAt: expires}
	ctx := context.Background()
	if err := rt.Store().CreateKey(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if !revoked.IsZero() {
		if rec, err = rt.Store().RevokeKey(ctx, rec.ID, revoked); err != nil {
			t.Fatal(err)
		}
	}
	return key, rec
}

// TestAuthenticateKey: every way a Bearer key is refused, with its code,
// and a good key resolved to its record (and its use noted).
func TestAuthenticateKey(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rt := testRuntime(t, at)
	var used []string
	rt.KeyUsed = func(id string, when time.Time) {
		if !when.Equal(at) {
			t.Errorf("key use noted at %v, want the runtime's clock %v", when, at)
		}
		used = append(used, id)
	}
	good, goodRec := addKey(t, rt, "alice", time.Time{}, time.Time{})
	later, _ := addKey(t, rt, "alice", at.Add(time.Minute), time.Time{})
	expired, expiredRec := addKey(t, rt, "bob", at, time.Time{}) // expires exactly now
	revoked, revokedRec := addKey(t, rt, "carol", time.Time{}, at.Add(-time.Minute))
	unknown, _, _ := servicekey.Generate() // well formed, never stored
	// The last character changed: the checksum no longer holds.
	last := "A"
	if strings.HasSuffix(good, "A") {
		last = "B"
	}
	garbled := good[:len(good)-1] + last

	tests := []struct {
		name, auth string
		code       string
		user       string // the record returned with the refusal, if any
	}{
		{"good", "Bearer " + good, "", "alice"},
		{"scheme in any case, spaces", "bearer   " + good + " ", "", "alice"},
		{"expires later", "Bearer " + later, "", "alice"},
		{"no header", "", apierror.MissingKey, ""},
		{"basic scheme", "Basic " + good, apierror.MissingKey, ""},
		{"bearer without token", "Bearer ", apierror.MissingKey, ""},
		{"not a key", "Bearer hello", apierror.InvalidKey, ""},
		{"bad checksum", "Bearer " + garbled, apierror.InvalidKey, ""},
		{"unknown", "Bearer " + unknown, apierror.InvalidKey, ""},
		{"expired", "Bearer " + expired, apierror.KeyExpired, "bob"},
		{"revoked", "Bearer " + revoked, apierror.KeyRevoked, "carol"},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		if tt.auth != "" {
			r.Header.Set("Authorization", tt.auth)
		}
		used = nil
		rec, e := rt.AuthenticateKey(r)
		switch {
		case tt.code == "" && e != nil:
			t.Errorf("%s: refused %v", tt.name, e)
		case tt.code != "" && (e == nil || e.Code != tt.code):
			t.Errorf("%s: %v, want %s", tt.name, e, tt.code)
		case rec.UserID != tt.user:
			t.Errorf("%s: record of %q, want %q", tt.name, rec.UserID, tt.user)
		case tt.code == "" && len(used) != 1, tt.code != "" && len(used) != 0:
			t.Errorf("%s: uses noted %v", tt.name, used)
		}
	}
	if rec, e := rt.AuthenticateKey(bearer(good)); e != nil || rec.ID != goodRec.ID {
		t.Errorf("good key: %+v %v", rec, e)
	}
	if rec, _ := rt.AuthenticateKey(bearer(expired)); rec.ID != expiredRec.ID {
		t.Errorf("expired key: the record %q, want %q", rec.ID, expiredRec.ID)
	}
	if rec, _ := rt.AuthenticateKey(bearer(revoked)); rec.ID != revokedRec.ID {
		t.Errorf("revoked key: the record %q, want %q", rec.ID, revokedRec.ID)
	}
	// The serviceKey of the core routes: the same judge without a header.
	if _, e := rt.AuthenticateServiceKey(context.Background(), revoked); e == nil || e.Code != apierror.KeyRevoked {
		t.Errorf("service key revoked: %v", e)
	}
	if _, e := rt.AuthenticateServiceKey(context.Background(), good); e != nil {
		t.Errorf("service key good: %v", e)
	}
}

// TestAuthenticateKeyStoreClosed: a store that fails the lookup is a 500,
// never "invalid key" (which would tell a caller to change a good key).
func TestAuthenticateKeyStoreClosed(t *testing.T) {
	rt := testRuntime(t, time.Now())
	good, _ := addKey(t, rt, "alice", time.Time{}, time.Time{})
	rt.Store().Close()
	if _, e := rt.AuthenticateKey(bearer(good)); e == nil || e.Code != apierror.InternalError {
		t.Errorf("closed store: %v, want %s", e, apierror.InternalError)
	}
}

func bearer(key string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer "+key)
	return r
}
