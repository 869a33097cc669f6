package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// What a caller does to their own subscriptions that is not yet a
// subscription: a change to a cheaper plan waiting for the period's end,
// and a request for a plan that costs money. Both are kept in the audit
// log, which already records every change as its actor and is durable in
// both stores, so no store type changes for them. Decision: the log is
// the record; what is pending is its newest entry for the user and
// service among the entries that settle it (a subscription change
// supersedes both; an operator's decline ends a request). Only the
// newest auditScan entries are read, which bounds a page's cost; an
// older pending entry is not seen (docs/portal.md says so).

// auditScan is how many of the newest audit entries are read to find
// what is pending.
const auditScan = 5000

// ScheduledChange is a change of product that takes effect at From.
type ScheduledChange struct {
	UserID, ServiceID, ProductID string
	From                         time.Time
}

// AccessRequest is a caller's request for a product that costs money,
// waiting for the operator.
type AccessRequest struct {
	UserID, ServiceID, ProductID string
	At                           time.Time
	Actor                        string
}

// ScheduleChange records that userID's subscription to serviceID moves
// to productID at from, as actor.
func (o *Ops) ScheduleChange(ctx context.Context, actor, userID, serviceID, productID string, from time.Time) error {
	return o.RecordAudit(ctx, store.AuditEntry{Actor: actor, Action: AuditChangeScheduled, UserID: userID, ServiceID: serviceID,
		Detail: "product " + productID + " from " + from.UTC().Format(time.RFC3339)})
}

// RequestAccess records a caller's request for productID of serviceID.
func (o *Ops) RequestAccess(ctx context.Context, actor, userID, serviceID, productID string) error {
	return o.RecordAudit(ctx, store.AuditEntry{Actor: actor, Action: AuditAccessRequest, UserID: userID, ServiceID: serviceID,
		Detail: "product " + productID})
}

// DeclineAccess ends a caller's pending request for a product of
// serviceID, as actor (the operator).
func (o *Ops) DeclineAccess(ctx context.Context, actor, userID, serviceID, productID string) error {
	return o.RecordAudit(ctx, store.AuditEntry{Actor: actor, Action: AuditAccessDecline, UserID: userID, ServiceID: serviceID,
		Detail: "product " + productID})
}

// PendingChange is the change of product waiting for userID's
// subscription to serviceID, if any.
func (o *Ops) PendingChange(ctx context.Context, userID, serviceID string) (ScheduledChange, bool, error) {
	var out ScheduledChange
	found := false
	err := o.scanAudit(ctx, func(e store.AuditEntry) bool {
		if e.UserID != userID || e.ServiceID != serviceID {
			return true
		}
		switch e.Action {
		case AuditSubscriptionPut:
			return false
		case AuditChangeScheduled:
			product, from, ok := parseScheduled(e.Detail)
			if ok {
				out, found = ScheduledChange{UserID: userID, ServiceID: serviceID, ProductID: product, From: from}, true
			}
			return false
		}
		return true
	})
	return out, found, err
}

// PendingChanges are the changes of product waiting, of every user and
// service, newest first (what the sweep applies once due).
func (o *Ops) PendingChanges(ctx context.Context) ([]ScheduledChange, error) {
	settled := map[[2]string]bool{}
	var out []ScheduledChange
	err := o.scanAudit(ctx, func(e store.AuditEntry) bool {
		k := [2]string{e.UserID, e.ServiceID}
		if settled[k] {
			return true
		}
		switch e.Action {
		case AuditSubscriptionPut:
			settled[k] = true
		case AuditChangeScheduled:
			settled[k] = true
			if product, from, ok := parseScheduled(e.Detail); ok {
				out = append(out, ScheduledChange{UserID: e.UserID, ServiceID: e.ServiceID, ProductID: product, From: from})
			}
		}
		return true
	})
	return out, err
}

// PendingAccessRequests are the requests no subscription change or
// decline has answered yet, newest first; with userID, only that user's.
func (o *Ops) PendingAccessRequests(ctx context.Context, userID string) ([]AccessRequest, error) {
	settled := map[[2]string]bool{}
	var out []AccessRequest
	err := o.scanAudit(ctx, func(e store.AuditEntry) bool {
		k := [2]string{e.UserID, e.ServiceID}
		if userID != "" && e.UserID != userID || settled[k] {
			return true
		}
		switch e.Action {
		case AuditSubscriptionPut, AuditAccessDecline:
			settled[k] = true
		case AuditAccessRequest:
			settled[k] = true
			out = append(out, AccessRequest{UserID: e.UserID, ServiceID: e.ServiceID,
				ProductID: strings.TrimPrefix(e.Detail, "product "), At: e.Time, Actor: e.Actor})
		}
		return true
	})
	return out, err
}

// scanAudit calls fn on the newest auditScan entries, newest first,
// until fn returns false.
func (o *Ops) scanAudit(ctx context.Context, fn func(store.AuditEntry) bool) error {
	cursor, read := "", 0
	for read < auditScan {
		entries, next, err := o.rt.Store().ListAudit(ctx, cursor, min(MaxPageLimit, auditScan-read))
		if err != nil {
			return fmt.Errorf("read the audit log: %w", err)
		}
		for _, e := range entries {
			if !fn(e) {
				return nil
			}
		}
		read += len(entries)
		if next == "" || len(entries) == 0 {
			return nil
		}
		cursor = next
	}
	return nil
}

// parseScheduled reads the detail of a scheduled change.
func parseScheduled(detail string) (string, time.Time, bool) {
	rest, ok := strings.CutPrefix(detail, "product ")
	if !ok {
		return "", time.Time{}, false
	}
	product, at, ok := strings.Cut(rest, " from ")
	if !ok {
		return "", time.Time{}, false
	}
	from, err := time.Parse(time.RFC3339, at)
	return product, from, err == nil
}

var errNoScheduled = errors.New("no scheduled change")

// ApplyDueChange applies userID's change scheduled on serviceID once its
// time has come (at or after From), as the caller who asked for it,
// keeping the subscription's status and end. The portal calls it
// whenever the caller's plans are read or changed, so the change is in
// place before anything else is decided, and the platform's sweep
// (SweepSubscriptions) within a minute of From whether or not the caller
// returns. Applying is idempotent across a fleet: the put's audit entry
// supersedes the scheduled one, so a node that reads the log after it
// finds nothing due, and two nodes that both read it before set the same
// product (the store keeps the start and balance), only auditing twice.
func (o *Ops) ApplyDueChange(ctx context.Context, userID, serviceID string, now time.Time) (ScheduledChange, error) {
	ch, ok, err := o.PendingChange(ctx, userID, serviceID)
	if err != nil {
		return ScheduledChange{}, err
	}
	if !ok || now.Before(ch.From) {
		return ScheduledChange{}, errNoScheduled
	}
	sub, err := o.rt.Store().GetSubscription(ctx, userID, serviceID)
	if err != nil {
		return ScheduledChange{}, fmt.Errorf("read the subscription of %s to %s: %w", userID, serviceID, err)
	}
	_, err = o.PutSubscriptionUntil(ctx, "portal:"+userID+" (scheduled)", userID, serviceID, ch.ProductID, sub.Status, EndOf(sub))
	return ch, err
}

// IsNoScheduledChange reports whether ApplyDueChange found nothing due.
func IsNoScheduledChange(err error) bool { return errors.Is(err, errNoScheduled) }
