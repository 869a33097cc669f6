package e2e

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// isUUID: key ids are UUIDs, the type the upstream SDKs declare for
// serviceKeyId (the Java SDK parses it as java.util.UUID).
func isUUID(s string) bool { return uuidPattern.MatchString(s) }

// TestCompatLegacyKeyID: a key whose id has the older "key_…" form, as a
// store written before ids were UUIDs holds, still invokes and validates
// (serviceKeyId is its stored id), and revoking it by that id refuses it.
func TestCompatLegacyKeyID(t *testing.T) {
	be := newTestBackend(t, coreSecret, "Platform")
	g := startGateway(t, t.TempDir(), coreCatalog(be.URL))
	key, hash, err := servicekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	const oldID = "key_T1ZQnbgCQzTK3MN3M8AJ"
	if err := g.store().CreateKey(context.Background(), store.KeyRecord{
		ID: oldID, Hash: hash, UserID: "u-old", Created: time.Now().UTC(),
	}); err != nil {
		t.Fatal(err)
	}
	g.subscribe("u-old", "pre", "basic", "ACTIVE")

	body := coreBody(t, "serviceKey", key, "serviceId", "pre")
	a := corePost(t, usageSigned{URL: coreValidateURL, Secret: coreSecret, Body: body}, coreSecret)
	a.expect(t, 200, "")
	a.mustSigned(t)
	want := fmt.Sprintf(`{"valid":true,"serviceKeyId":%q,"userId":"u-old","serviceId":"pre","serviceProductId":"basic",`+
		`"roles":[],"subscriptionStatus":"ACTIVE","billingModelType":"SUBSCRIPTION","measurementType":"PER_REQUEST",`+
		`"unitLabel":"request","timestamp":%s,"error":null,"validationSchemaVersion":3}`, oldID, a.Timestamp)
	if string(a.Body) != want {
		t.Errorf("body\n got %s\nwant %s", a.Body, want)
	}

	if _, err := g.store().RevokeKey(context.Background(), oldID, time.Now()); err != nil {
		t.Fatalf("revoke by the old id: %v", err)
	}
	a = corePost(t, usageSigned{URL: coreValidateURL, Secret: coreSecret, Body: body}, coreSecret)
	a.expect(t, 401, "key_revoked")
}
