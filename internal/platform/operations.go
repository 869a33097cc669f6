package platform

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// The operator's changes, shared by the admin API and the console so both
// validate alike, answer the same errors and write the same audit entry.
// Each returns an *apierror.Error for a request the operator must correct,
// any other error for a failure of the store.

// Audit actions.
const (
	AuditKeyCreate       = "key.create"
	AuditKeyRevoke       = "key.revoke"
	AuditSubscriptionPut = "subscription.put"
	AuditCreditsAdd      = "credits.add"
)

// KeyView is a service key as operators see it: never the key's hash, and
// the key itself only in the answer that created it.
type KeyView = keyView

// ViewKey is how operators see a stored key at time now.
func ViewKey(k store.KeyRecord, now time.Time) KeyView { return viewKey(k, now) }

// PeriodSummary is one subscription's billing period (see summarize).
type PeriodSummary = periodSummary

// SubscriptionChange is the answer to a subscription change.
type SubscriptionChange = subscriptionChange

// SubscriptionStatuses are the statuses a subscription may be set to.
func SubscriptionStatuses() []string { return subscription.StatusNames() }

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

// audit appends an entry for a change that is done. A failure to record
// it is logged (the change stands and cannot be taken back) and answered
// as an error, so the operator knows the log misses it.
func (a *App) audit(ctx context.Context, e store.AuditEntry) error {
	e.Time = a.Now().UTC()
	if _, err := a.DataStore().AppendAudit(ctx, e); err != nil {
		a.logger.Error("audit entry not recorded", zap.String("action", e.Action),
			zap.String("actor", e.Actor), zap.String("user_id", e.UserID), zap.Error(err))
		return fmt.Errorf("the change was made but its audit entry was not recorded: %w", err)
	}
	return nil
}

// RecordAudit appends an entry for a change made elsewhere than in these
// functions (a caller's own key in the portal, an alert setting), stamped
// now; same failure handling as the changes here.
func (a *App) RecordAudit(ctx context.Context, e store.AuditEntry) error { return a.audit(ctx, e) }

// CreateKey makes a service key for a user; the answer holds the key, the
// only time it is ever shown.
func (a *App) CreateKey(ctx context.Context, actor string, req CreateKeyRequest) (KeyView, error) {
	if err := checkUserID("userId", req.UserID); err != nil {
		return KeyView{}, err
	}
	roles, err := checkRoles(req.Roles)
	if err != nil {
		return KeyView{}, err
	}
	if err := checkLabel(req.Label); err != nil {
		return KeyView{}, err
	}
	now := a.Now().UTC()
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
		if expires, err = a.underParent(ctx, req, roles, expires, now); err != nil {
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
	if err := a.DataStore().CreateKey(ctx, rec); err != nil {
		return KeyView{}, fmt.Errorf("create key for user %s: %w", rec.UserID, err)
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
	a.logger.Info("service key created", fields...)
	v := viewKey(rec, now)
	v.Key = key
	err = a.audit(ctx, store.AuditEntry{Actor: actor, Action: AuditKeyCreate, UserID: rec.UserID, KeyID: rec.ID, Detail: detail})
	return v, err
}

// RevokeKey revokes a key, and with it every key made under it that ends
// with it (keychain.go); revoking again answers the same record with the
// first revocation time (and is audited again, as an operator's act), and
// finishes a cascade a failure cut short.
func (a *App) RevokeKey(ctx context.Context, actor, keyID string) (KeyView, error) {
	now := a.Now().UTC()
	k, err := a.DataStore().KeyByID(ctx, keyID)
	if errors.Is(err, store.ErrNotFound) {
		return KeyView{}, keyNotFound(keyID)
	}
	if err != nil {
		return KeyView{}, fmt.Errorf("revoke key %s: %w", keyID, err)
	}
	// The keys made under it go first, so that at no time is it revoked
	// while one that ends with it still works; a second pass after it
	// takes any made in the meantime (the portal checks its session key
	// again after making one, see internal/portal).
	auditErr, err := a.revokeMinted(ctx, actor, k, now)
	if err != nil {
		return KeyView{}, err
	}
	k, err = a.DataStore().RevokeKey(ctx, k.ID, now)
	if err != nil {
		return KeyView{}, fmt.Errorf("revoke key %s: %w", keyID, err)
	}
	a.logger.Info("service key revoked",
		zap.String("key_id", k.ID),
		zap.String("user_id", k.UserID),
		zap.Time("revoked_at", k.RevokedAt),
		zap.String("actor", actor))
	if err := a.audit(ctx, store.AuditEntry{Actor: actor, Action: AuditKeyRevoke, UserID: k.UserID, KeyID: k.ID}); err != nil {
		auditErr = err
	}
	later, err := a.revokeMinted(ctx, actor, k, now)
	if err != nil {
		return KeyView{}, err
	}
	if auditErr == nil {
		auditErr = later
	}
	return viewKey(k, now), auditErr
}

// PutSubscription creates or replaces the subscription of userID to
// serviceID with productID and status (ACTIVE when empty); the start (the
// anchor of its billing periods) and the credit balance are kept.
func (a *App) PutSubscription(ctx context.Context, actor, userID, serviceID, productID, status string) (SubscriptionChange, error) {
	userID, serviceID, err := subscriptionIDs([]string{userID, serviceID})
	if err != nil {
		return SubscriptionChange{}, err
	}
	svc, ok := a.Catalog().Service(serviceID)
	if !ok {
		return SubscriptionChange{}, apierror.Invalid("serviceId", "no service "+serviceID+" in the catalog")
	}
	if productID == "" {
		return SubscriptionChange{}, apierror.Invalid("productId", "productId is required")
	}
	if !catalog.ValidID(productID) {
		return SubscriptionChange{}, apierror.Invalid("productId", "productId is not a valid id")
	}
	if _, ok := svc.Product(productID); !ok {
		return SubscriptionChange{}, apierror.Invalid("productId", "service "+serviceID+" has no product "+productID)
	}
	if status == "" {
		status = string(subscription.Active)
	}
	st, ok := subscription.ParseStatus(status)
	if !ok {
		return SubscriptionChange{}, apierror.Invalid("status", "status must be one of "+strings.Join(subscription.StatusNames(), ", "))
	}
	status = string(st)
	var prevProduct string
	if prev, err := a.DataStore().GetSubscription(ctx, userID, serviceID); err == nil {
		prevProduct = prev.ProductID
	}
	sub, err := a.DataStore().PutSubscription(ctx, store.Subscription{
		UserID: userID, ServiceID: serviceID, ProductID: productID,
		Status: status, UpdatedAt: a.Now().UTC(),
	})
	if err != nil {
		return SubscriptionChange{}, fmt.Errorf("put subscription of %s to %s: %w", userID, serviceID, err)
	}
	a.logger.Info("subscription set",
		zap.String("user_id", userID),
		zap.String("service_id", serviceID),
		zap.String("product_id", sub.ProductID),
		zap.String("status", sub.Status),
		zap.String("actor", actor))
	detail := "product " + sub.ProductID + ", status " + sub.Status
	if prevProduct != "" && prevProduct != sub.ProductID {
		detail += " (was product " + prevProduct + ")"
	}
	err = a.audit(ctx, store.AuditEntry{Actor: actor, Action: AuditSubscriptionPut, UserID: userID, ServiceID: serviceID, Detail: detail})
	return a.describeChange(ctx, prevProduct, sub), err
}

// ParseCreditAmount reads an amount of credits as an operator types it:
// a decimal number with at most 6 decimal places, maybe negative, not zero.
func ParseCreditAmount(s string) (billing.Units, error) {
	if s == "" || s == "null" {
		return 0, apierror.Invalid("amount", "amount is required")
	}
	amount, err := parseSignedUnits([]byte(s))
	if err != nil {
		return 0, apierror.Invalid("amount", "amount must be a decimal number with at most 6 decimal places, such as 10.5 or -2")
	}
	if amount == 0 {
		return 0, apierror.Invalid("amount", "amount must not be zero")
	}
	return amount, nil
}

// AddCredits adds (or, negative, removes) prepaid credits; the balance
// may go below zero, which records what the user owes.
func (a *App) AddCredits(ctx context.Context, actor, userID, serviceID string, amount billing.Units) (store.Subscription, error) {
	userID, serviceID, err := subscriptionIDs([]string{userID, serviceID})
	if err != nil {
		return store.Subscription{}, err
	}
	if amount == 0 {
		return store.Subscription{}, apierror.Invalid("amount", "amount must not be zero")
	}
	sub, err := a.DataStore().AddCredits(ctx, userID, serviceID, amount, a.Now())
	if errors.Is(err, store.ErrNoAccount) || errors.Is(err, store.ErrNotFound) {
		return store.Subscription{}, subscriptionNotFound(userID, serviceID)
	}
	if err != nil {
		return store.Subscription{}, fmt.Errorf("add credits to %s on %s: %w", userID, serviceID, err)
	}
	a.logger.Info("credits added",
		zap.String("user_id", userID),
		zap.String("service_id", serviceID),
		zap.Stringer("amount", amount),
		zap.Stringer("balance", sub.Credits),
		zap.String("actor", actor))
	err = a.audit(ctx, store.AuditEntry{Actor: actor, Action: AuditCreditsAdd, UserID: userID, ServiceID: serviceID,
		Detail: "amount " + amount.String() + ", balance " + sub.Credits.String()})
	return sub, err
}

// Summary is the billing period containing at of each of the user's
// subscriptions (of serviceID's only, when it is set).
func (a *App) Summary(ctx context.Context, userID, serviceID string, at time.Time) (UserSummary, error) {
	if err := checkUserID("userId", userID); err != nil {
		return UserSummary{}, err
	}
	var subs []store.Subscription
	if serviceID != "" {
		sub, err := a.DataStore().GetSubscription(ctx, userID, serviceID)
		if errors.Is(err, store.ErrNoAccount) || errors.Is(err, store.ErrNotFound) {
			return UserSummary{}, subscriptionNotFound(userID, serviceID)
		}
		if err != nil {
			return UserSummary{}, fmt.Errorf("read subscription of %s to %s: %w", userID, serviceID, err)
		}
		subs = append(subs, sub)
	} else {
		cursor := ""
		for {
			page, next, err := a.DataStore().ListSubscriptions(ctx, userID, cursor, maxPageLimit)
			if err != nil {
				return UserSummary{}, fmt.Errorf("list subscriptions of %s: %w", userID, err)
			}
			subs = append(subs, page...)
			if next == "" || len(subs) >= maxSummarySubscriptions {
				break
			}
			cursor = next
		}
	}
	out := UserSummary{UserID: userID, At: at, Subscriptions: make([]PeriodSummary, 0, len(subs))}
	for _, sub := range subs {
		ps, err := summarize(ctx, a, sub, at)
		if err != nil {
			return UserSummary{}, fmt.Errorf("summarize %s on %s: %w", userID, sub.ServiceID, err)
		}
		out.Subscriptions = append(out.Subscriptions, ps)
	}
	return out, nil
}

// UserSummary is a user's billing periods.
type UserSummary = userSummary
