package portal

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// A key made in the portal is made under the key the caller signed in
// with (ops.CreateKeyRequest.ParentKeyID): it has that key's roles,
// expires no later than it, and with minted_keys follow_parent is revoked
// with it. A user may hold at most max_active_keys active keys and create
// at most key_create_limit a minute, so one session cannot mint keys
// without end.
//
// A caller signed in with the identity provider has no key to make one
// under: their keys have no parent, no roles (roles are the operator's
// grant, which no sign-in gives) and no expiry, under the same limits.
// minted_keys does not apply to them; they revoke such keys themselves.

// minting serializes the count of a user's active keys and the creation
// that follows it, so two forms posted at once cannot both take the last
// place. Creations are rare; one lock for the process is enough.
var minting sync.Mutex

// refusal is a creation the portal refused before changing anything: the
// status and the fixed sentence the page shows.
type refusal struct {
	status     int
	message    string
	retryAfter time.Duration
}

// errParentEnded: the key signed in with was revoked while the new one
// was made, and the new one was revoked with it.
var errParentEnded = errors.New("the session's key ended while a key was made under it")

// mint makes a key under sessionKey (none for a session opened with the
// identity provider), within the limits. before, if set, runs once the
// limits allow the key and before it is made, under the same lock: a
// subscription taken with its key (selfservice.go) is refused with it
// when the key would be, and two forms posted at once are decided one
// after the other. A refusal or error from before makes no key.
func (h *Handler) mint(q *request, sess session, sessionKey store.KeyRecord, label string, before func() (*refusal, error)) (ops.KeyView, *refusal, error) {
	ctx := q.r.Context()
	minting.Lock()
	defer minting.Unlock()
	keys, err := h.rt.Store().ListKeys(ctx, sess.UserID)
	if err != nil {
		return ops.KeyView{}, nil, fmt.Errorf("list keys: %w", err)
	}
	active := 0
	for _, k := range keys {
		if k.ActiveAt(q.now) {
			active++
		}
	}
	if active >= h.MaxActiveKeys {
		return ops.KeyView{}, &refusal{status: http.StatusConflict, message: fmt.Sprintf(
			"You have %d active keys, the most this portal allows. Revoke a key you no longer use, then create the new one. Nothing was changed.", active)}, nil
	}
	// Counted only once the creation is otherwise allowed: a refusal for
	// the number of keys does not use up the rate.
	limit := &billing.RateLimit{Requests: h.KeyCreateLimit, WindowSeconds: 60}
	if ok, wait, _ := h.rt.Allow("portal-key-create:"+sess.UserID, "", limit, q.now); !ok {
		return ops.KeyView{}, &refusal{status: http.StatusTooManyRequests, retryAfter: wait,
			message: "You are creating keys too quickly; wait a minute and try again. Nothing was changed."}, nil
	}
	if before != nil {
		if r, err := before(); r != nil || err != nil {
			return ops.KeyView{}, r, err
		}
	}
	if sess.KeyID == "" {
		rec, err := h.ops.CreateKey(ctx, "portal:"+sess.UserID, ops.CreateKeyRequest{UserID: sess.UserID, Label: label})
		return rec, nil, err
	}
	follow := h.MintedKeys != MintedIndependent
	rec, err := h.ops.CreateKey(ctx, "portal:"+sessionKey.UserID, ops.CreateKeyRequest{
		UserID: sessionKey.UserID, Roles: sessionKey.Roles, Label: label,
		ParentKeyID: sessionKey.ID, EndsWithParent: follow,
	})
	if rec.ID == "" || !follow {
		return rec, nil, err
	}
	// A revocation of the session's key that listed its keys before this
	// one was stored has not revoked it: if the session's key is no longer
	// active now, the new key goes too.
	parent, perr := h.rt.Store().KeyByID(ctx, sessionKey.ID)
	if perr == nil && parent.ActiveAt(q.now) {
		return rec, nil, err
	}
	if _, rerr := h.ops.RevokeKey(ctx, "portal:"+sessionKey.UserID, rec.ID); rerr != nil {
		h.logger.Error("portal: a key made under a key revoked meanwhile was not revoked",
			zap.String("key_id", rec.ID), zap.String("parent_key_id", sessionKey.ID), zap.Error(rerr))
		return ops.KeyView{}, nil, fmt.Errorf("revoke key %s made under ended key %s: %w", rec.ID, sessionKey.ID, rerr)
	}
	return ops.KeyView{}, nil, errParentEnded
}
