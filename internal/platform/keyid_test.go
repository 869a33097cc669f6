package platform

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// isUUID: new key ids are UUIDs in lower case, the type the upstream SDKs
// declare for serviceKeyId.
func isUUID(s string) bool { return uuidPattern.MatchString(s) }

// TestAdminLegacyKeyID: a key stored with an id of the older "key_…" form,
// as stores made before ids were UUIDs hold, is still shown, listed and
// revoked by that id, through the admin API and the CLI; a UUID id is found
// in upper case too.
func TestAdminLegacyKeyID(t *testing.T) {
	env := admStart(t)
	ctx := context.Background()
	const oldID = "key_AbCdEfGhIjKlMnOpQrSt"
	oldKey, hash, err := servicekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := env.app.DataStore().CreateKey(ctx, store.KeyRecord{
		ID: oldID, Hash: hash, UserID: "olduser", Created: time.Now().UTC().Add(-time.Hour),
	}); err != nil {
		t.Fatal(err)
	}

	r := admJSON(t, "GET", "/platform/keys/"+oldID, "")
	var shown ops.KeyView
	r.decode(t, &shown)
	if r.status != 200 || shown.ID != oldID || shown.UserID != "olduser" || shown.Status != ops.KeyActive {
		t.Fatalf("show old id: %d %s", r.status, r.body)
	}
	if out := cliMust(t, "key", "list", "--user", "olduser"); !strings.Contains(out, oldID) {
		t.Errorf("key list does not show the old id:\n%s", out)
	}
	out := cliMust(t, "key", "revoke", oldID)
	if !strings.Contains(out, "Revoked "+oldID+" of user olduser") {
		t.Errorf("key revoke printed:\n%s", out)
	}
	if rec, err := env.app.DataStore().KeyByHash(ctx, servicekey.Hash(oldKey)); err != nil || rec.RevokedAt.IsZero() {
		t.Fatalf("old-format key after revoke: %+v, %v", rec, err)
	}

	r = admJSON(t, "POST", "/platform/keys", `{"userId": "newuser"}`)
	var created ops.KeyView
	r.decode(t, &created)
	if r.status != 201 || !isUUID(created.ID) {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	r = admJSON(t, "DELETE", "/platform/keys/"+strings.ToUpper(created.ID), "")
	var revoked ops.KeyView
	r.decode(t, &revoked)
	if r.status != 200 || revoked.ID != created.ID || revoked.Status != ops.KeyRevoked {
		t.Fatalf("revoke by upper-case UUID: %d %s", r.status, r.body)
	}
}
