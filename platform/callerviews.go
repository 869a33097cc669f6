package platform

import (
	"context"
	"fmt"
	"time"

	"github.com/platformgw/gateway/servicekey"
	"github.com/platformgw/gateway/store"
)

// What the admin API computes and other handlers show too (the caller
// portal): the same figures and the same key creation, from one place.

// PeriodSummary is one subscription's billing period: units used and held,
// quota left, credits, spend against the cap (the admin API's
// /platform/users/{userId}/summary entries).
type PeriodSummary = periodSummary

// Summarize reads the billing period of sub that contains at, under the
// product of the running catalog.
func (a *App) Summarize(ctx context.Context, sub store.Subscription, at time.Time) (PeriodSummary, error) {
	return summarize(ctx, a, sub, at)
}

// KeyStatus is how a key is shown: active, expired or revoked at now.
func KeyStatus(k store.KeyRecord, now time.Time) string {
	switch {
	case !k.RevokedAt.IsZero():
		return keyRevoked
	case !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt):
		return keyExpired
	}
	return keyActive
}

// CreateKey validates and stores a new service key of userID. It returns
// the key, to be shown once and never again, and its stored record. A
// validation failure is an *apierror.Error naming the field; expires, when
// not zero, must be after now.
func (a *App) CreateKey(ctx context.Context, userID string, roles []string, label string, expires time.Time) (string, store.KeyRecord, error) {
	if err := checkUserID("userId", userID); err != nil {
		return "", store.KeyRecord{}, err
	}
	roles, err := checkRoles(roles)
	if err != nil {
		return "", store.KeyRecord{}, err
	}
	if err := checkLabel(label); err != nil {
		return "", store.KeyRecord{}, err
	}
	now := a.Now().UTC()
	key, hash, err := servicekey.Generate()
	if err != nil {
		return "", store.KeyRecord{}, err
	}
	rec := store.KeyRecord{
		ID: servicekey.NewID(), Hash: hash, UserID: userID, Roles: roles,
		Label: label, Created: now, ExpiresAt: expires,
	}
	if err := a.DataStore().CreateKey(ctx, rec); err != nil {
		return "", store.KeyRecord{}, fmt.Errorf("create key for user %s: %w", rec.UserID, err)
	}
	return key, rec, nil
}
