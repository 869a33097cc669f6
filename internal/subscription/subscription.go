// Package subscription is the one home of the rule "may this user call
// this service, and under which product?": the subscription statuses,
// which of them grant access, and Resolve, which the invoke path, the
// pre-flight routes and usage reports all ask. It imports no Caddy; the
// handlers only translate its typed Error into their JSON error.
package subscription

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

// Status is a subscription's status, upper case on the wire and in the
// store.
type Status string

// The statuses a subscription may have; the first four grant access.
const (
	Active            Status = "ACTIVE"
	Trial             Status = "TRIAL"
	Cancelling        Status = "CANCELLING"
	CancellingPending Status = "CANCELLING_PENDING"
	Expired           Status = "EXPIRED"
	Cancelled         Status = "CANCELLED"
	Suspended         Status = "SUSPENDED"
)

// statuses is every valid status, in the order operators are told them.
var statuses = [...]Status{Active, Trial, Cancelling, CancellingPending, Expired, Cancelled, Suspended}

// Statuses returns every valid status, those that grant access first.
func Statuses() []Status { return append([]Status(nil), statuses[:]...) }

// StatusNames returns every valid status as a string, in Statuses' order.
func StatusNames() []string {
	names := make([]string, len(statuses))
	for i, s := range statuses {
		names[i] = string(s)
	}
	return names
}

// ParseStatus upper-cases s and reports whether it is a valid status.
func ParseStatus(s string) (Status, bool) {
	st := Status(strings.ToUpper(s))
	return st, st.Valid()
}

// Valid reports whether s is one of the statuses (exactly, upper case).
func (s Status) Valid() bool {
	for _, v := range statuses {
		if s == v {
			return true
		}
	}
	return false
}

// GrantsAccess reports whether a subscription in status s may call its
// service. Only ACTIVE, TRIAL, CANCELLING and CANCELLING_PENDING do; any
// other value, valid or not, does not.
func (s Status) GrantsAccess() bool {
	switch s {
	case Active, Trial, Cancelling, CancellingPending:
		return true
	}
	return false
}

// GrantsAccess reports whether a status, in any letter case, grants
// access.
func GrantsAccess(status string) bool { return Status(strings.ToUpper(status)).GrantsAccess() }

// EffectiveStatus is sub's status at now: its EndStatus from its EndsAt
// on (a trial expired, a cancellation taken effect), else its Status,
// upper case. Access ends exactly at EndsAt, at the call, whether or not
// the sweep that tidies the stored status has run yet.
func EffectiveStatus(sub store.Subscription, now time.Time) Status {
	if Ended(sub, now) {
		return Status(strings.ToUpper(sub.EndStatus))
	}
	return Status(strings.ToUpper(sub.Status))
}

// Ended reports whether sub has an end and now is at or after it.
func Ended(sub store.Subscription, now time.Time) bool {
	return !sub.EndsAt.IsZero() && !now.Before(sub.EndsAt)
}

// EndStatusValid reports whether s may be a subscription's EndStatus:
// only CANCELLED, EXPIRED and SUSPENDED (a paid subscription past the
// grace of a failed payment, internal/payments), statuses that grant no
// access.
func EndStatusValid(s string) bool {
	st := Status(strings.ToUpper(s))
	return st == Cancelled || st == Expired || st == Suspended
}

// Reason says why a user may not call a service.
type Reason int

// The reasons for a refusal.
const (
	// NoSubscription: the user is not an owner and has no subscription.
	NoSubscription Reason = iota + 1
	// Inactive: the subscription's status grants no access.
	Inactive
	// ProductGone: the service no longer offers the subscription's
	// product.
	ProductGone
)

// Error is a refusal: the user may not call the service. Its message is
// the one the caller is told, whichever route asked.
type Error struct {
	Reason    Reason
	ServiceID string
	Status    Status // the subscription's status, upper case (Inactive)
	ProductID string // the subscription's product (ProductGone)
}

func (e *Error) Error() string {
	switch e.Reason {
	case NoSubscription:
		return "no subscription to service " + e.ServiceID
	case Inactive:
		return "the subscription is " + string(e.Status)
	case ProductGone:
		return "the subscription's product " + apierror.QuoteID(e.ProductID) + " is no longer offered"
	}
	return "no access to service " + e.ServiceID
}

// Lookup reads the subscription of a user to a service; it fails with
// store.ErrNoAccount (or store.ErrNotFound) when there is none, as
// store.Subscriptions.GetSubscription does.
type Lookup func(ctx context.Context, userID, serviceID string) (store.Subscription, error)

// Access is a user's standing with a service: the account its units are
// charged to and the product they are priced with (nil for a service
// owner, who calls free).
type Access struct {
	Account      store.Account
	Product      *billing.Product
	Subscription store.Subscription // zero for a service owner
}

// Owner reports whether the user owns the service (and calls it free).
func (a Access) Owner() bool { return a.Product == nil }

// Status is the status the backend is told: ACTIVE for a service owner,
// the subscription's effective one (upper case) at the time resolved for
// anyone else.
func (a Access) Status() Status {
	if a.Owner() {
		return Active
	}
	return Status(strings.ToUpper(a.Subscription.Status))
}

// TrialTerms is product p as a subscription in TRIAL is served under it:
// a free trial (docs/payments.md, "Trials are free"). No unit costs
// anything, money or credits, so nothing of a trial is in the ledger's
// cost, on a Stripe meter or on an invoice (Stripe does not invoice a
// trial's metered usage either); and a quota is the trial's allowance:
// its overage, which would be billed, is refused (quota_exceeded)
// rather than given away. The quota, its period and the rate limit stay
// the plan's.
func TrialTerms(p billing.Product) billing.Product {
	p.Price, p.SpendingCap = 0, nil
	if p.Quota != nil {
		p.Overage = "block"
	}
	return p
}

// QuotaRetry is when a call refused quota_exceeded at now (a quota used
// up, a spending cap reached: both reset with the billing period) may be
// retried, and reason with that instant added, for the caller's message:
// the end of the billing period under product p, anchored at the
// subscription's start. Retry-After is never earlier than that reset (a
// retry before it is refused again). When the subscription ends
// (endsAt: a cancellation, a trial's end, an end the operator set) at or
// before the reset, the message says so too: a retry from then on is
// refused as the subscription's end status, unless it is renewed.
func QuotaRetry(reason string, p billing.Product, startedAt, endsAt, now time.Time) (message string, at time.Time) {
	_, end := billing.PeriodBounds(p.Period, p.CalendarPeriods, startedAt, now)
	message = billing.WithReset(reason, end)
	if !endsAt.IsZero() && !endsAt.After(end) {
		message += "; the subscription ends before then, at " + endsAt.UTC().Format(time.RFC3339)
	}
	return message, end
}

// Resolve decides whether userID may call svc at now and under which
// product, on its trial's terms (TrialTerms) while it is in TRIAL: a service owner calls free; anyone else needs a subscription
// whose effective status at now (EffectiveStatus: a subscription past its
// EndsAt reads as its EndStatus) grants access to a product svc still
// offers. A refusal is an *Error; a failed lookup is returned wrapped,
// for the caller to answer as its own internal error.
func Resolve(ctx context.Context, svc *catalog.Service, userID string, now time.Time, lookup Lookup) (Access, error) {
	return resolve(ctx, svc, userID, now, lookup, true)
}

// ResolveRecorded is Resolve for usage that has already happened (a
// usage report), occurredAt being when: the status is not checked, since
// the report is the record of it (usage before the subscription's end is
// billed like any other, and so is usage reported after it, as for any
// inactive subscription), but the user must still have a subscription to
// a product svc offers, to price the units with.
func ResolveRecorded(ctx context.Context, svc *catalog.Service, userID string, occurredAt time.Time, lookup Lookup) (Access, error) {
	return resolve(ctx, svc, userID, occurredAt, lookup, false)
}

func resolve(ctx context.Context, svc *catalog.Service, userID string, at time.Time, lookup Lookup, checkStatus bool) (Access, error) {
	if svc.IsOwner(userID) {
		return Access{Account: store.Account{UserID: userID, ServiceID: svc.ID, Free: true}}, nil
	}
	sub, err := lookup(ctx, userID, svc.ID)
	if errors.Is(err, store.ErrNoAccount) || errors.Is(err, store.ErrNotFound) {
		return Access{}, &Error{Reason: NoSubscription, ServiceID: svc.ID}
	}
	if err != nil {
		return Access{}, fmt.Errorf("subscription lookup for service %s: %w", svc.ID, err)
	}
	st := EffectiveStatus(sub, at)
	if checkStatus && !st.GrantsAccess() {
		return Access{}, &Error{Reason: Inactive, ServiceID: svc.ID, Status: st}
	}
	sub.Status = string(st)
	p, ok := svc.Product(sub.ProductID)
	if !ok {
		return Access{}, &Error{Reason: ProductGone, ServiceID: svc.ID, ProductID: sub.ProductID}
	}
	if st == Trial {
		terms := TrialTerms(*p)
		p = &terms
	}
	return Access{
		Account:      store.Account{UserID: sub.UserID, ServiceID: svc.ID, Product: *p},
		Product:      p,
		Subscription: sub,
	}, nil
}
