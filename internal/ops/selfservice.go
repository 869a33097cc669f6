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
// Was is the product it was scheduled from ("" in entries older than
// that field): the change applies only while the subscription is still
// on it.
type ScheduledChange struct {
	UserID, ServiceID, ProductID string
	Was                          string
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
// from product was to productID at from, as actor.
func (o *Ops) ScheduleChange(ctx context.Context, actor, userID, serviceID, was, productID string, from time.Time) error {
	return o.RecordAudit(ctx, store.AuditEntry{Actor: actor, Action: AuditChangeScheduled, UserID: userID, ServiceID: serviceID,
		Detail: "product " + productID + " from " + from.UTC().Format(time.RFC3339) + " (was " + was + ")"})
}

// settlesSubscription reports whether an audit action is a change of
// subscription, which supersedes what was pending before it: the
// operator's (or the portal's) put, and a subscription set from Stripe.
func settlesSubscription(action string) bool {
	return action == AuditSubscriptionPut || action == AuditSubscriptionStripe
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
		switch {
		case settlesSubscription(e.Action):
			return false
		case e.Action == AuditChangeScheduled:
			if ch, ok := parseScheduled(e.Detail); ok {
				ch.UserID, ch.ServiceID = userID, serviceID
				out, found = ch, true
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
		switch {
		case settlesSubscription(e.Action):
			settled[k] = true
		case e.Action == AuditChangeScheduled:
			settled[k] = true
			if ch, ok := parseScheduled(e.Detail); ok {
				ch.UserID, ch.ServiceID = e.UserID, e.ServiceID
				out = append(out, ch)
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
		switch {
		case settlesSubscription(e.Action), e.Action == AuditAccessDecline:
			settled[k] = true
		case e.Action == AuditAccessRequest:
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

// parseScheduled reads the detail of a scheduled change: "product <id>
// from <time>", then " (was <id>)" in entries that record it.
func parseScheduled(detail string) (ScheduledChange, bool) {
	rest, ok := strings.CutPrefix(detail, "product ")
	if !ok {
		return ScheduledChange{}, false
	}
	product, at, ok := strings.Cut(rest, " from ")
	if !ok {
		return ScheduledChange{}, false
	}
	was := ""
	if i := strings.Index(at, " (was "); i >= 0 && strings.HasSuffix(at, ")") {
		at, was = at[:i], at[i+len(" (was "):len(at)-1]
	}
	from, err := time.Parse(time.RFC3339, at)
	return ScheduledChange{ProductID: product, Was: was, From: from}, err == nil
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
// finds nothing due, and a node that read it before finds the
// subscription no longer on ch.Was and leaves it (two nodes that read the
// subscription at the same moment set the same product, the store keeping
// the start and balance, only auditing twice).
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
	if ch.Was != "" && sub.ProductID != ch.Was {
		// The subscription moved to another product since the change was
		// scheduled, by a change whose audit entry is not in the log (a
		// failed audit write, or one past auditScan): the caller's newer
		// choice stands, and a downgrade never replaces a plan Stripe
		// bills.
		return ScheduledChange{}, errNoScheduled
	}
	_, err = o.PutSubscriptionUntil(ctx, "portal:"+userID+" (scheduled)", userID, serviceID, ch.ProductID, sub.Status, EndOf(sub))
	return ch, err
}

// IsNoScheduledChange reports whether ApplyDueChange found nothing due.
func IsNoScheduledChange(err error) bool { return errors.Is(err, errNoScheduled) }
