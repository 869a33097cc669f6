package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/store"
)

// Keys made under another (the portal makes a caller's new key under the
// key they signed in with): such a key never outlives its parent nor has a
// role it lacks, and if it ends with its parent (the portal's minted_keys
// follow_parent) revoking the parent revokes it, whoever revokes (the
// admin API, the console, the portal) and however deep the chain.

// underParent checks a key to be made under req.ParentKeyID and returns
// its expiry: the one asked for, but no later than the parent's.
func (o *Ops) underParent(ctx context.Context, req CreateKeyRequest, roles []string, expires, now time.Time) (time.Time, error) {
	parent, err := o.rt.Store().KeyByID(ctx, req.ParentKeyID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return time.Time{}, fmt.Errorf("read parent key %s: %w", req.ParentKeyID, err)
	}
	// Another user's key is answered like a missing one.
	if err != nil || parent.UserID != req.UserID {
		return time.Time{}, KeyNotFound(req.ParentKeyID)
	}
	if KeyStatus(parent, now) != KeyActive {
		return time.Time{}, apierror.Invalid("parentKeyId", "the key to make the new one under is "+KeyStatus(parent, now))
	}
	for _, r := range roles {
		if !slices.Contains(parent.Roles, r) {
			return time.Time{}, apierror.Invalid("roles", fmt.Sprintf("role %q: a key made under another has no role that one lacks", r))
		}
	}
	if !parent.ExpiresAt.IsZero() && (expires.IsZero() || expires.After(parent.ExpiresAt)) {
		expires = parent.ExpiresAt.UTC()
	}
	return expires, nil
}

// revokeMinted revokes every key of parent's user made under parent, or
// under one of those, that ends with its parent and is not revoked yet.
// A key that does not end with its parent (minted_keys independent) stops
// the walk: what was made under it follows it, not its parent. Each key is
// revoked with its audit entry, in one transaction. The error is a store
// failure (the cascade is cut short: revoking the parent again finishes
// it).
func (o *Ops) revokeMinted(ctx context.Context, actor string, parent store.KeyRecord, now time.Time) error {
	keys, err := o.rt.Store().ListKeys(ctx, parent.UserID)
	if err != nil {
		return fmt.Errorf("list the keys made under key %s: %w", parent.ID, err)
	}
	children := map[string][]store.KeyRecord{}
	for _, k := range keys {
		if k.ParentKeyID != "" && k.EndsWithParent {
			children[k.ParentKeyID] = append(children[k.ParentKeyID], k)
		}
	}
	seen := map[string]bool{parent.ID: true}
	for queue := []string{parent.ID}; len(queue) > 0; queue = queue[1:] {
		for _, c := range children[queue[0]] {
			if seen[c.ID] {
				continue
			}
			seen[c.ID] = true
			queue = append(queue, c.ID)
			if !c.RevokedAt.IsZero() {
				continue
			}
			rk, err := o.rt.Store().RevokeKey(ctx, c.ID, now, store.AuditEntry{Time: now, Actor: actor, Action: AuditKeyRevoke,
				UserID: c.UserID, KeyID: c.ID, Detail: "with key " + c.ParentKeyID + ", which it was made under"})
			if err != nil {
				return fmt.Errorf("key %s: revoking key %s made under it: %w; revoke key %s again", parent.ID, c.ID, err, parent.ID)
			}
			o.rt.Logger.Info("service key revoked with the key it was made under",
				zap.String("key_id", rk.ID),
				zap.String("parent_key_id", rk.ParentKeyID),
				zap.String("user_id", rk.UserID),
				zap.Time("revoked_at", rk.RevokedAt),
				zap.String("actor", actor))
		}
	}
	return nil
}
