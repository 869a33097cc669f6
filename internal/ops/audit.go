package ops

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/store"
)

// Audit actions: the operator's changes, the removal of billing data,
// the settings of a config that say where alerts go and how long billing
// data is kept, and callers' sign-ins to the portal.
const (
	AuditKeyCreate       = "key.create"
	AuditKeyRevoke       = "key.revoke"
	AuditSubscriptionPut = "subscription.put"
	AuditCreditsAdd      = "credits.add"
	// AuditUsagePrune is raw ledger rows removed: by POST
	// /platform/usage/prune (the admin API's caller) or by
	// ledger_retention (actor "ledger_retention").
	AuditUsagePrune = "usage.prune"
	// AuditRollupPrune is hourly rollups removed by rollup_retention.
	AuditRollupPrune = "rollups.prune"
	// AuditConfigChange is a loaded config whose audited setting differs
	// from what the audit log last recorded for it; its detail is
	// "<setting>: <new value>".
	AuditConfigChange = "config.change"
	// AuditPortalSignIn is a caller signed in to the portal, with a
	// service key or with the identity provider (actor "portal:<user>").
	AuditPortalSignIn = "portal.sign_in"
	// AuditChangeScheduled is a caller's change to a cheaper plan, taken
	// at the end of the current period (selfservice.go); its detail is
	// "product <id> from <RFC 3339 time> (was <id>)", the product it
	// was scheduled from last (entries written before that part have
	// none).
	AuditChangeScheduled = "subscription.change_scheduled"
	// AuditSubscriptionStripe is a subscription set from a Stripe event
	// (internal/payments, actor "stripe"): a change of subscription like
	// AuditSubscriptionPut, so it supersedes a scheduled change and a
	// pending access request.
	AuditSubscriptionStripe = "subscription.stripe"
	// AuditAccessRequest is a caller asking for a product that costs
	// money while no payments are configured; its detail is
	// "product <id>". AuditAccessDecline is the operator's no.
	AuditAccessRequest = "access.request"
	AuditAccessDecline = "access.decline"
)

// ErrAuditNotRecorded is the error of a change that was made but whose
// audit entry could not be written (errors.Is): the change stands, and
// making it again would make it twice. Only RecordAudit answers it: a key,
// a subscription, credits and a ledger prune hand their entry to the store
// with the change (store.Keys, store.LedgerPruner), so one of them whose
// entry cannot be written is not made and is a plain store error.
var ErrAuditNotRecorded = errors.New("the change was made but its audit entry was not recorded")

// RecordAudit appends an entry, stamped now: for what is only an entry (a
// sign-in, a scheduled change, an access request or its decline, a
// config's changed setting, a prune that removed nothing) or a change
// written apart from it (a rollup prune, Stripe's invoice records). A
// failure to record it is logged and answered as an error, so the
// operator knows the log misses it.
func (o *Ops) RecordAudit(ctx context.Context, e store.AuditEntry) error {
	e.Time = o.rt.Now().UTC()
	if _, err := o.rt.Store().AppendAudit(ctx, e); err != nil {
		o.rt.Logger.Error("audit entry not recorded", zap.String("action", e.Action),
			zap.String("actor", e.Actor), zap.String("user_id", e.UserID), zap.Error(err))
		return fmt.Errorf("%w: %w", ErrAuditNotRecorded, err)
	}
	return nil
}

// AuditLog reads a page of the audit log, newest first; limit is 1 to
// 1000 (the admin API's page sizes).
func (o *Ops) AuditLog(ctx context.Context, cursor string, limit int) ([]store.AuditEntry, string, error) {
	limit = min(max(limit, 1), MaxPageLimit)
	entries, next, err := o.rt.Store().ListAudit(ctx, cursor, limit)
	if e := BadCursor(err); e != nil {
		return nil, "", e
	}
	if err != nil {
		return nil, "", fmt.Errorf("list audit log: %w", err)
	}
	if entries == nil {
		entries = []store.AuditEntry{}
	}
	return entries, next, nil
}
