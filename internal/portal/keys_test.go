package portal

import (
	"net/http"
	"strings"
	"testing"
)

// TestPortalRevokeConfirmation: the first step of a revocation (GET) shows
// the key and changes nothing; another user's key is not found, a key
// already revoked has nothing to confirm, and with key management off
// there is no such step.
func TestPortalRevokeConfirmation(t *testing.T) {
	e := local(t, "allow_key_management")
	key, rec := e.user("alice", "basic")
	_, bob := e.user("bob", "basic")
	c := e.newClient()
	c.signIn(key)
	resp, page := c.get("/portal/keys/revoke?key_id=" + rec.ID)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "This is the key you signed in with") || !strings.Contains(page, `name="key_id" value="`+rec.ID+`"`) {
		t.Errorf("the confirmation: %d\n%s", resp.StatusCode, page)
	}
	if k := e.keyByID(rec.ID); !k.RevokedAt.IsZero() {
		t.Fatal("revoked by the first step")
	}
	if resp, page := c.get("/portal/keys/revoke?key_id=" + bob.ID); resp.StatusCode != http.StatusNotFound || strings.Contains(page, bob.ID) {
		t.Errorf("bob's key: %d", resp.StatusCode)
	}
	if resp, _ := c.get("/portal/keys/revoke"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("no key id: %d", resp.StatusCode)
	}

	off := local(t, "")
	key2, rec2 := off.user("carol", "basic")
	c2 := off.newClient()
	c2.signIn(key2)
	if resp, _ := c2.get("/portal/keys/revoke?key_id=" + rec2.ID); resp.StatusCode != http.StatusForbidden {
		t.Errorf("key management off: %d", resp.StatusCode)
	}
}
