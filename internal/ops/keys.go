package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// KeyView is a service key as operators (and the portal's callers) see
// it: never the key's hash, and the key itself only in the answer that
// created it.
type KeyView struct {
	ID        string    `json:"keyId"`
	Key       string    `json:"key,omitempty"`
	UserID    string    `json:"userId"`
	Roles     []string  `json:"roles"`
	Label     string    `json:"label"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"createdAt"`
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	RevokedAt time.Time `json:"revokedAt,omitzero"`
	// ParentKeyID is the key a caller made this one under in the portal;
	// EndsWithParent says revoking that one revokes this one too.
	ParentKeyID    string `json:"parentKeyId,omitempty"`
	EndsWithParent bool   `json:"endsWithParent,omitempty"`
}

// Key statuses as shown (KeyStatus): servicekey's.
const (
	KeyActive  = string(servicekey.Active)
	KeyExpired = string(servicekey.Expired)
	KeyRevoked = string(servicekey.Revoked)
)

// KeyStatus is how a key is shown: active, expired or revoked at now.
func KeyStatus(k store.KeyRecord, now time.Time) string { return string(k.Status(now)) }

// ViewKey is how operators see a stored key at time now.
func ViewKey(k store.KeyRecord, now time.Time) KeyView {
	v := KeyView{
		ID: k.ID, UserID: k.UserID, Roles: k.Roles, Label: k.Label,
		Status: KeyStatus(k, now), CreatedAt: k.Created, ExpiresAt: k.ExpiresAt, RevokedAt: k.RevokedAt,
		ParentKeyID: k.ParentKeyID, EndsWithParent: k.EndsWithParent,
	}
	if v.Roles == nil {
		v.Roles = []string{}
	}
	return v
}

// CreateKeyRequest asks for a new service key.
type CreateKeyRequest struct {
	UserID string   `json:"userId"`
	Roles  []string `json:"roles"`
	Label  string   `json:"label"`
	// ExpiresAt is an RFC 3339 time, or empty for a key that never expires.
	ExpiresAt string `json:"expiresAt"`
	// ParentKeyID is the key the new one is made under (the portal's
	// signed-in key): the new key is the same user's, expires no later
	// and has no role the parent lacks. Set in process only, never from
	// a request body.
	ParentKeyID string `json:"-"`
	// EndsWithParent: revoking the parent revokes the new key too.
	EndsWithParent bool `json:"-"`
}

// CreateKey makes a service key for a user; the answer holds the key, the
// only time it is ever shown.
func (o *Ops) CreateKey(ctx context.Context, actor string, req CreateKeyRequest) (KeyView, error) {
	if err := CheckUserID("userId", req.UserID); err != nil {
		return KeyView{}, err
	}
	roles, err := checkRoles(req.Roles)
	if err != nil {
		return KeyView{}, err
	}
	if err := checkLabel(req.Label); err != nil {
		return KeyView{}, err
	}
	now := o.rt.Now().UTC()
	var expires time.Time
	if req.ExpiresAt != "" {
		expires, err = time.Parse(time.RFC3339Nano, req.ExpiresAt)
		if err != nil {
			return KeyView{}, apierror.Invalid("expiresAt", "expiresAt must be an RFC 3339 time such as 2027-01-01T00:00:00Z")
		}
		if !expires.After(now) {
			return KeyView{}, apierror.Invalid("expiresAt", "expiresAt is in the past")
		}
		expires = expires.UTC()
	}
	if req.ParentKeyID != "" {
		if expires, err = o.underParent(ctx, req, roles, expires, now); err != nil {
			return KeyView{}, err
		}
	}
	key, hash, err := servicekey.Generate()
	if err != nil {
		return KeyView{}, err
	}
	rec := store.KeyRecord{
		ID: servicekey.NewID(), Hash: hash, UserID: req.UserID, Roles: roles,
		Label: req.Label, Created: now, ExpiresAt: expires,
		ParentKeyID: req.ParentKeyID, EndsWithParent: req.ParentKeyID != "" && req.EndsWithParent,
	}
	fields := []zap.Field{
		zap.String("key_id", rec.ID),
		zap.String("user_id", rec.UserID),
		zap.Strings("roles", roles),
		zap.String("actor", actor),
	}
	// A key that never expires has no expires_at, rather than year 1.
	detail := "never expires"
	if !expires.IsZero() {
		fields = append(fields, zap.Time("expires_at", expires))
		detail = "expires " + expires.Format(time.RFC3339)
	}
	if rec.ParentKeyID != "" {
		fields = append(fields, zap.String("parent_key_id", rec.ParentKeyID), zap.Bool("ends_with_parent", rec.EndsWithParent))
		detail += ", made under key " + rec.ParentKeyID
		if rec.EndsWithParent {
			detail += " (revoked with it)"
		}
	}
	// The key and its audit entry are stored in one transaction: a key
	// whose entry cannot be written is not made.
	entry := store.AuditEntry{Time: now, Actor: actor, Action: AuditKeyCreate, UserID: rec.UserID, KeyID: rec.ID, Detail: detail}
	if err := o.rt.Store().CreateKey(ctx, rec, entry); err != nil {
		return KeyView{}, fmt.Errorf("create key for user %s: %w", rec.UserID, err)
	}
	o.rt.Logger.Info("service key created", fields...)
	v := ViewKey(rec, now)
	v.Key = key
	return v, nil
}

// RevokeKey revokes a key, and with it every key made under it that ends
// with it (keychain.go); revoking again answers the same record with the
// first revocation time (and is audited again, as an operator's act), and
// finishes a cascade a failure cut short.
func (o *Ops) RevokeKey(ctx context.Context, actor, keyID string) (KeyView, error) {
	now := o.rt.Now().UTC()
	k, err := o.rt.Store().KeyByID(ctx, keyID)
	if errors.Is(err, store.ErrNotFound) {
		return KeyView{}, KeyNotFound(keyID)
	}
	if err != nil {
		return KeyView{}, fmt.Errorf("revoke key %s: %w", keyID, err)
	}
	// The keys made under it go first, so that at no time is it revoked
	// while one that ends with it still works; a second pass after it
	// takes any made in the meantime (the portal checks its session key
	// again after making one, see internal/portal). Each revocation is
	// stored with its audit entry, in one transaction.
	if err := o.revokeMinted(ctx, actor, k, now); err != nil {
		return KeyView{}, err
	}
	k, err = o.rt.Store().RevokeKey(ctx, k.ID, now,
		store.AuditEntry{Time: now, Actor: actor, Action: AuditKeyRevoke, UserID: k.UserID, KeyID: k.ID})
	if err != nil {
		return KeyView{}, fmt.Errorf("revoke key %s: %w", keyID, err)
	}
	o.rt.Logger.Info("service key revoked",
		zap.String("key_id", k.ID),
		zap.String("user_id", k.UserID),
		zap.Time("revoked_at", k.RevokedAt),
		zap.String("actor", actor))
	if err := o.revokeMinted(ctx, actor, k, now); err != nil {
		return KeyView{}, err
	}
	return ViewKey(k, now), nil
}
