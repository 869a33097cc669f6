package portal

import (
	"context"
	"fmt"
	htmlstd "html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// keyFor gives user (who has a subscription already) another key, with
// roles and an expiry (none when zero).
func (e *env) keyFor(user string, roles []string, expires time.Time) (string, store.KeyRecord) {
	e.t.Helper()
	key, hash, err := servicekey.Generate()
	if err != nil {
		e.t.Fatal(err)
	}
	rec := store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: user, Roles: roles, Created: time.Now().UTC(), ExpiresAt: expires}
	if err := e.store().CreateKey(context.Background(), rec); err != nil {
		e.t.Fatal(err)
	}
	return key, rec
}

// mint creates a key in c's session and returns it and its stored record.
func (c *client) mint(e *env) (string, store.KeyRecord) {
	c.t.Helper()
	_, page := c.get("/portal/")
	resp, body := c.post("/portal/keys", keyForm(c.t, page, "minted"))
	if resp.StatusCode != http.StatusCreated {
		c.t.Fatalf("create: %d\n%s", resp.StatusCode, body)
	}
	m := newKeyField.FindStringSubmatch(body)
	if m == nil {
		c.t.Fatalf("the new key is not shown:\n%s", body)
	}
	rec, err := e.store().KeyByHash(context.Background(), servicekey.Hash(m[1]))
	if err != nil {
		c.t.Fatal(err)
	}
	return m[1], rec
}

// adminRevoke revokes a key through the admin API, over HTTP.
func adminRevoke(t *testing.T, id string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, fmt.Sprintf("http://localhost:%d/platform/keys/%s", adminPort, id), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("admin API revoke %s: %d", id, resp.StatusCode)
	}
}

// TestPortalMintedKeyNeverOutlivesItsParent: a key made in the portal has
// the roles of the key signed in with, expires with it (it was made with
// none before), records it as its parent, and stops working at the
// gateway when that key expires; with minted_keys independent too.
func TestPortalMintedKeyNeverOutlivesItsParent(t *testing.T) {
	for _, opt := range []string{"", "minted_keys independent"} {
		t.Run("options "+opt, func(t *testing.T) {
			e := start(t, "sign_in_limit 1000\nallow_key_management\n"+opt)
			user := "kim" + strings.ReplaceAll(strings.ReplaceAll(opt, " ", ""), "_", "")
			e.user(user, "basic")
			expires := time.Now().UTC().Add(time.Hour).Truncate(time.Second)
			parentKey, parent := e.keyFor(user, []string{"reader", "writer"}, expires)
			c := newClient(t)
			page := c.signIn(parentKey)
			// The form says what the new key will be: it said "does not
			// expire" of a key that expires with the one signed in with.
			help := htmlstd.UnescapeString(labelHelp.FindString(page))
			if strings.Contains(help, "does not expire") || !strings.Contains(help, "expires with it") ||
				strings.Contains(help, "revokes it too") != (opt == "") {
				t.Errorf("create-key help for a key expiring %s (%q): %s", expires, opt, help)
			}
			key, rec := c.mint(e)
			if !rec.ExpiresAt.Equal(expires) || !slices.Equal(rec.Roles, parent.Roles) || rec.ParentKeyID != parent.ID ||
				rec.EndsWithParent != (opt == "") {
				t.Fatalf("minted key %+v; want expiry %s, roles %v, parent %s", rec, expires, parent.Roles, parent.ID)
			}
			if st, _ := invoke(t, key); st != http.StatusOK {
				t.Fatalf("the minted key at the gateway: %d", st)
			}
			// A key made under the minted one cannot outlive the first either.
			c2 := newClient(t)
			c2.signIn(key)
			grandKey, grand := c2.mint(e)
			if !grand.ExpiresAt.Equal(expires) || grand.ParentKeyID != rec.ID {
				t.Fatalf("key made under the minted key: %+v", grand)
			}
			e.setClock(func() time.Time { return time.Now().Add(2 * time.Hour) })
			for name, k := range map[string]string{"parent": parentKey, "minted": key, "minted under minted": grandKey} {
				if st, _ := invoke(t, k); st != http.StatusUnauthorized {
					t.Errorf("%s key after the parent's expiry: %d, want 401", name, st)
				}
			}
		})
	}
}

// labelHelp is the create-key form's help text.
var labelHelp = regexp.MustCompile(`<p id="label-help"[^>]*>[^<]*`)

// TestPortalKeyLabelKeptOnRefusal: a label the server refuses (256 bytes
// is fewer than 256 characters of "é", which the form lets through) comes
// back in the form with the error, to be shortened rather than typed
// again; the help of a key that never expires says so.
func TestPortalKeyLabelKeptOnRefusal(t *testing.T) {
	e := start(t, "sign_in_limit 1000\nallow_key_management")
	key, _ := e.user("nell", "basic")
	c := newClient(t)
	page := c.signIn(key)
	if help := htmlstd.UnescapeString(labelHelp.FindString(page)); !strings.Contains(help, "does not expire") {
		t.Errorf("create-key help for a key that never expires: %s", help)
	}
	label := strings.Repeat("é", 200)
	resp, body := c.post("/portal/keys", keyForm(t, page, label))
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "256 bytes") {
		t.Fatalf("a 400-byte label: %d\n%s", resp.StatusCode, body)
	}
	if !strings.Contains(htmlstd.UnescapeString(body), `value="`+label+`"`) {
		t.Errorf("the refused label is not kept in the form:\n%s", body)
	}
}

// TestPortalMintedKeysRevokedWithParent: with minted_keys follow_parent
// (the default), revoking the key signed in with (in the portal, or
// through the admin API) revokes the keys made under it, and those made
// under them, at the gateway; a key of the same user made by the operator
// is untouched. With minted_keys independent they keep working.
func TestPortalMintedKeysRevokedWithParent(t *testing.T) {
	t.Run("follow_parent, revoked in the portal", func(t *testing.T) {
		e := start(t, "sign_in_limit 1000\nallow_key_management")
		otherKey, _ := e.user("lena", "basic")
		parentKey, parent := e.keyFor("lena", nil, time.Time{})
		c := newClient(t)
		c.signIn(parentKey)
		key, rec := c.mint(e)
		if !rec.ExpiresAt.IsZero() || !rec.EndsWithParent {
			t.Fatalf("minted key %+v", rec)
		}
		if st, _ := invoke(t, key); st != http.StatusOK {
			t.Fatalf("minted key before: %d", st)
		}
		_, page := c.get("/portal/")
		resp, _ := c.post("/portal/keys/revoke", url.Values{"csrf": {csrf(t, page)}, "key_id": {parent.ID}})
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("revoking the session's key: %d", resp.StatusCode)
		}
		if st, _ := invoke(t, key); st != http.StatusUnauthorized {
			t.Errorf("minted key after its parent's revocation: %d, want 401", st)
		}
		if k := e.keyByID(rec.ID); k.RevokedAt.IsZero() {
			t.Error("the minted key is not marked revoked")
		}
		if st, _ := invoke(t, otherKey); st != http.StatusOK {
			t.Errorf("the operator's key of the same user: %d", st)
		}
	})
	t.Run("follow_parent, chain revoked by the admin API", func(t *testing.T) {
		e := start(t, "sign_in_limit 1000\nallow_key_management\nminted_keys follow_parent")
		e.user("mona", "basic")
		parentKey, parent := e.keyFor("mona", nil, time.Time{})
		c := newClient(t)
		c.signIn(parentKey)
		key, rec := c.mint(e)
		c2 := newClient(t)
		c2.signIn(key)
		grandKey, grand := c2.mint(e)
		// A sibling session's key, not under the parent, stays.
		siblingKey, _ := e.keyFor("mona", nil, time.Time{})
		adminRevoke(t, parent.ID)
		for name, k := range map[string]string{"parent": parentKey, "minted": key, "minted under minted": grandKey} {
			if st, _ := invoke(t, k); st != http.StatusUnauthorized {
				t.Errorf("%s key after the parent's revocation: %d, want 401", name, st)
			}
		}
		for _, id := range []string{rec.ID, grand.ID} {
			if k := e.keyByID(id); k.RevokedAt.IsZero() {
				t.Errorf("key %s not revoked", id)
			}
		}
		if st, _ := invoke(t, siblingKey); st != http.StatusOK {
			t.Errorf("another key of the same user: %d", st)
		}
		// The minted key's session ends with it.
		if resp, _ := c2.get("/portal/"); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/portal/?m=ended" {
			t.Errorf("the minted key's session: %d %s", resp.StatusCode, resp.Header.Get("Location"))
		}
	})
	t.Run("independent", func(t *testing.T) {
		e := start(t, "sign_in_limit 1000\nallow_key_management\nminted_keys independent")
		e.user("nora", "basic")
		parentKey, parent := e.keyFor("nora", nil, time.Time{})
		c := newClient(t)
		c.signIn(parentKey)
		key, rec := c.mint(e)
		adminRevoke(t, parent.ID)
		if st, _ := invoke(t, parentKey); st != http.StatusUnauthorized {
			t.Errorf("the revoked parent: %d", st)
		}
		if st, _ := invoke(t, key); st != http.StatusOK {
			t.Errorf("an independent minted key after its parent's revocation: %d, want 200", st)
		}
		if k := e.keyByID(rec.ID); !k.RevokedAt.IsZero() {
			t.Error("an independent minted key was revoked")
		}
	})
}

// TestPortalKeyCreationLimits: past key_create_limit a minute, and at
// max_active_keys active keys, creation is refused with a message on the
// page and changes nothing; time (an injected clock) and a revocation
// make room again.
func TestPortalKeyCreationLimits(t *testing.T) {
	e := local(t, "sign_in_limit 1000\nallow_key_management\nmax_active_keys 4\nkey_create_limit 2")
	key, _ := e.user("olga", "basic")
	c := e.newClient()
	c.signIn(key)
	count := func() int {
		t.Helper()
		keys, err := e.store().ListKeys(context.Background(), "olga")
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}
	create := func() (*http.Response, string) {
		t.Helper()
		_, page := c.get("/portal/")
		return c.post("/portal/keys", keyForm(t, page, "x"))
	}
	_, first := c.mint(e)
	c.mint(e)
	resp, body := create()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(body, "creating keys too quickly") || newKeyField.MatchString(body) {
		t.Fatalf("third creation within the minute: %d %q\n%s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if n := count(); n != 3 {
		t.Fatalf("%d keys after a refused creation, want 3", n)
	}
	now := time.Now()
	e.setClock(func() time.Time { return now.Add(61 * time.Second) })
	c.mint(e) // the fourth active key
	resp, body = create()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "the most this portal allows") || newKeyField.MatchString(body) {
		t.Fatalf("a fifth active key: %d\n%s", resp.StatusCode, body)
	}
	if n := count(); n != 4 {
		t.Fatalf("%d keys after a refused creation, want 4", n)
	}
	// A revoked key no longer counts.
	_, page := c.get("/portal/")
	if resp, _ := c.post("/portal/keys/revoke", url.Values{"csrf": {csrf(t, page)}, "key_id": {first.ID}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	c.mint(e)
	// Another user's limits are their own.
	otherKey, _ := e.user("olga2", "basic")
	c2 := e.newClient()
	c2.signIn(otherKey)
	c2.mint(e)
}

// TestMintUnderParentRules: what ops.Ops.CreateKey does with a
// parent, the function the portal calls: the parent's expiry caps the
// one asked for (an earlier one is kept), a role the parent lacks, a
// revoked or expired parent and another user's key are refused and store
// nothing; revoking a parent is audited for each key revoked with it.
func TestMintUnderParentRules(t *testing.T) {
	e := local(t, "")
	ctx := context.Background()
	app := e.ops
	e.user("pia", "basic")
	e.user("quinn", "basic")
	expires := time.Now().UTC().Add(2 * time.Hour).Truncate(time.Second)
	_, parent := e.keyFor("pia", []string{"reader"}, expires)
	_, revoked := e.keyFor("pia", []string{"reader"}, time.Time{})
	if _, err := e.store().RevokeKey(ctx, revoked.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	_, expired := e.keyFor("pia", nil, time.Now().UTC().Add(-time.Minute))
	_, quinns := e.keyFor("quinn", nil, time.Time{})
	before, _ := e.store().ListKeys(ctx, "pia")

	for name, req := range map[string]ops.CreateKeyRequest{
		"a role the parent lacks": {UserID: "pia", Roles: []string{"reader", "admin"}, ParentKeyID: parent.ID},
		"a revoked parent":        {UserID: "pia", ParentKeyID: revoked.ID},
		"an expired parent":       {UserID: "pia", ParentKeyID: expired.ID},
		"another user's parent":   {UserID: "pia", ParentKeyID: quinns.ID},
		"a missing parent":        {UserID: "pia", ParentKeyID: servicekey.NewID()},
	} {
		if v, err := app.CreateKey(ctx, "test", req); err == nil || v.ID != "" || v.Key != "" {
			t.Errorf("%s: key %q made, %v; want a refusal", name, v.ID, err)
		}
	}
	if after, _ := e.store().ListKeys(ctx, "pia"); len(after) != len(before) {
		t.Fatalf("refused creations stored keys: %d -> %d", len(before), len(after))
	}

	later := expires.Add(time.Hour).Format(time.RFC3339)
	v, err := app.CreateKey(ctx, "test", ops.CreateKeyRequest{UserID: "pia", Roles: []string{"reader"}, ExpiresAt: later,
		ParentKeyID: parent.ID, EndsWithParent: true})
	if err != nil || !v.ExpiresAt.Equal(expires) || v.ParentKeyID != parent.ID || !v.EndsWithParent {
		t.Fatalf("a later expiry than the parent's: %+v, %v; want %s", v, err, expires)
	}
	sooner := expires.Add(-time.Hour)
	v2, err := app.CreateKey(ctx, "test", ops.CreateKeyRequest{UserID: "pia", ExpiresAt: sooner.Format(time.RFC3339),
		ParentKeyID: v.ID, EndsWithParent: true})
	if err != nil || !v2.ExpiresAt.Equal(sooner) || v2.ParentKeyID != v.ID {
		t.Fatalf("an earlier expiry than the parent's: %+v, %v; want %s", v2, err, sooner)
	}

	if _, err := app.RevokeKey(ctx, "test-operator", parent.ID); err != nil {
		t.Fatal(err)
	}
	audit, _, err := e.store().ListAudit(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	revokedIDs := map[string]string{}
	for _, a := range audit {
		if a.Action == ops.AuditKeyRevoke {
			revokedIDs[a.KeyID] = a.Detail
		}
	}
	if len(revokedIDs) != 3 || revokedIDs[parent.ID] != "" || !strings.Contains(revokedIDs[v.ID], parent.ID) ||
		!strings.Contains(revokedIDs[v2.ID], v.ID) {
		t.Errorf("revocation audit entries: %v", revokedIDs)
	}
}
