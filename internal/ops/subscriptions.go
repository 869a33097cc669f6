package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// SubscriptionStatuses are the statuses a subscription may be set to.
func SubscriptionStatuses() []string { return subscription.StatusNames() }

// SubscriptionChange is the answer to a subscription change (PUT
// /platform/subscriptions/{userId}/{serviceId}): the subscription, and its
// current billing period under the product it now has, so the operator
// sees at once what a change of product did to the period's usage (the
// units used so far count against the new quota).
type SubscriptionChange struct {
	SubscriptionRecord
	// PreviousProductID is the product before this change, when it was
	// another one.
	PreviousProductID string         `json:"previousProductId,omitempty"`
	CurrentPeriod     *PeriodSummary `json:"currentPeriod,omitempty"`
}

// PutSubscription creates or replaces the subscription of userID to
// serviceID with productID and status (ACTIVE when empty); the start (the
// anchor of its billing periods) and the credit balance are kept. The
// subscription has no end afterwards: an operator who sets a status
// decides it, so a trial's or a cancellation's end is cleared.
func (o *Ops) PutSubscription(ctx context.Context, actor, userID, serviceID, productID, status string) (SubscriptionChange, error) {
	return o.PutSubscriptionUntil(ctx, actor, userID, serviceID, productID, status, End{})
}

// End is when a subscription stops granting access and the status it
// reads as from then (CANCELLED, EXPIRED, or SUSPENDED past a failed
// payment's grace); the zero End is none.
type End struct {
	At     time.Time
	Status string
}

// EndOf is sub's end.
func EndOf(sub store.Subscription) End { return End{At: sub.EndsAt, Status: sub.EndStatus} }

// PutSubscriptionUntil is PutSubscription with an end: the self-service
// trial (EXPIRED when its days are over) and cancellation (CANCELLED at
// the period's end). Access ends at end.At at the call
// (subscription.Resolve), not when the sweep tidies the status.
func (o *Ops) PutSubscriptionUntil(ctx context.Context, actor, userID, serviceID, productID, status string, end End) (SubscriptionChange, error) {
	if !end.At.IsZero() && !subscription.EndStatusValid(end.Status) {
		return SubscriptionChange{}, apierror.Invalid("endStatus", "endStatus must be CANCELLED, EXPIRED or SUSPENDED")
	}
	if end.At.IsZero() {
		end.Status = ""
	}
	end.Status = strings.ToUpper(end.Status)
	userID, serviceID, err := SubscriptionIDs([]string{userID, serviceID})
	if err != nil {
		return SubscriptionChange{}, err
	}
	svc, ok := o.rt.Catalog.Service(serviceID)
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
	if prev, err := o.rt.Store().GetSubscription(ctx, userID, serviceID); err == nil {
		prevProduct = prev.ProductID
	}
	now := o.rt.Now().UTC()
	put := store.Subscription{
		UserID: userID, ServiceID: serviceID, ProductID: productID,
		Status: status, UpdatedAt: now, EndsAt: end.At.UTC(), EndStatus: end.Status,
	}
	// The subscription and its audit entry are stored in one
	// transaction: a change whose entry cannot be written is not made.
	sub, err := o.rt.Store().PutSubscription(ctx, put, store.AuditEntry{Time: now, Actor: actor, Action: AuditSubscriptionPut,
		UserID: userID, ServiceID: serviceID, Detail: putDetail(put, prevProduct)})
	if err != nil {
		return SubscriptionChange{}, fmt.Errorf("put subscription of %s to %s: %w", userID, serviceID, err)
	}
	o.rt.Logger.Info("subscription set",
		zap.String("user_id", userID),
		zap.String("service_id", serviceID),
		zap.String("product_id", sub.ProductID),
		zap.String("status", sub.Status),
		zap.String("actor", actor))
	return o.describeChange(ctx, prevProduct, sub), nil
}

// putDetail is the audit detail of a put of sub over a subscription on
// product prev ("" when there was none).
func putDetail(sub store.Subscription, prev string) string {
	detail := "product " + sub.ProductID + ", status " + sub.Status
	if prev != "" && prev != sub.ProductID {
		detail += " (was product " + prev + ")"
	}
	if !sub.EndsAt.IsZero() {
		detail += ", " + sub.EndStatus + " from " + sub.EndsAt.Format(time.RFC3339)
	}
	return detail
}

// describeChange builds the answer to a subscription change. A failure to
// read the period leaves it out: the change itself is done.
func (o *Ops) describeChange(ctx context.Context, prev string, sub store.Subscription) SubscriptionChange {
	out := SubscriptionChange{SubscriptionRecord: ViewSubscription(sub)}
	if prev != "" && prev != sub.ProductID {
		out.PreviousProductID = prev
	}
	ps, err := o.Summarize(ctx, sub, o.rt.Now().UTC())
	if err != nil {
		o.rt.Logger.Error("read the period of a changed subscription", zap.String("user_id", sub.UserID), zap.String("service_id", sub.ServiceID), zap.Error(err))
		return out
	}
	out.CurrentPeriod = &ps
	return out
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

// parseSignedUnits reads a JSON number (or a string holding one) that may
// be negative, exactly, without going through float64.
func parseSignedUnits(raw json.RawMessage) (billing.Units, error) {
	s := string(raw)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	if s == "" || s[0] == '+' || s[0] == '-' {
		return 0, billing.ErrInvalidUnits
	}
	u, err := billing.ParseUnits(s)
	if err != nil {
		return 0, err
	}
	if neg {
		u = -u
	}
	return u, nil
}

// AddCredits adds (or, negative, removes) prepaid credits; the balance
// may go below zero, which records what the user owes. A change whose
// audit entry cannot be written is not made.
func (o *Ops) AddCredits(ctx context.Context, actor, userID, serviceID string, amount billing.Units) (store.Subscription, error) {
	userID, serviceID, err := SubscriptionIDs([]string{userID, serviceID})
	if err != nil {
		return store.Subscription{}, err
	}
	if amount == 0 {
		return store.Subscription{}, apierror.Invalid("amount", "amount must not be zero")
	}
	// The balance and the audit entry are stored in one transaction; the
	// store completes the detail with the balance the change left.
	now := o.rt.Now().UTC()
	sub, err := o.rt.Store().AddCredits(ctx, userID, serviceID, amount, now, store.AuditEntry{Time: now, Actor: actor,
		Action: AuditCreditsAdd, UserID: userID, ServiceID: serviceID, Detail: "amount " + amount.String()})
	if errors.Is(err, store.ErrNoAccount) || errors.Is(err, store.ErrNotFound) {
		return store.Subscription{}, SubscriptionNotFound(userID, serviceID)
	}
	if errors.Is(err, store.ErrBalanceRange) {
		return store.Subscription{}, apierror.Invalid("amount", "the balance cannot change by "+amount.String()+
			": it would pass what a balance can hold (±9223372036854.775807); nothing was changed")
	}
	if err != nil {
		return store.Subscription{}, fmt.Errorf("add credits to %s on %s: %w", userID, serviceID, err)
	}
	o.rt.Logger.Info("credits added",
		zap.String("user_id", userID),
		zap.String("service_id", serviceID),
		zap.Stringer("amount", amount),
		zap.Stringer("balance", sub.Credits),
		zap.String("actor", actor))
	return sub, nil
}
