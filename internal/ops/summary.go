package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// PeriodSummary is one subscription's billing period as an operator (and
// the portal's caller) reads it: what was used and held, what is left of
// the quota, the credits, and the spend against the cap. Fields that do
// not apply to the product are left out.
type PeriodSummary struct {
	ServiceID       string    `json:"serviceId"`
	ProductID       string    `json:"productId"`
	Status          string    `json:"status"`
	BillingModel    string    `json:"billingModel,omitempty"`
	MeasurementType string    `json:"measurementType,omitempty"`
	UnitLabel       string    `json:"unitLabel,omitempty"`
	PeriodStart     time.Time `json:"periodStart,omitzero"`
	PeriodEnd       time.Time `json:"periodEnd,omitzero"`
	// EndsAt is when the subscription stops granting access (a trial's or
	// a cancellation's end); Status is already the EndStatus from then.
	EndsAt time.Time `json:"endsAt,omitzero"`
	// ProductMissing: the product is no longer in the catalog, so the
	// period and its figures cannot be told (calls are refused).
	ProductMissing bool           `json:"productMissing,omitempty"`
	UnitsUsed      billing.Units  `json:"unitsUsed"`
	UnitsHeld      billing.Units  `json:"unitsHeld"`
	Quota          *billing.Units `json:"quota,omitempty"`
	UnitsRemaining *billing.Units `json:"unitsRemaining,omitempty"`
	OverageUnits   *billing.Units `json:"overageUnits,omitempty"`
	Credits        billing.Units  `json:"credits"`
	CreditsHeld    billing.Units  `json:"creditsHeld"`
	Spend          billing.Units  `json:"spend"`
	SpendHeld      billing.Units  `json:"spendHeld"`
	SpendingCap    *billing.Units `json:"spendingCap,omitempty"`
	SpendRemaining *billing.Units `json:"spendingCapRemaining,omitempty"`
	// CostUnit is what Spend, SpendHeld, SpendingCap and SpendRemaining
	// are counted in: "credits" for a PREPAID product, else the ISO 4217
	// code of the product's listing; empty when the listing names none.
	CostUnit string `json:"costUnit,omitempty"`
	// CallsCutAtLimit counts the period's calls, reports and completions
	// whose backend stated more units than a hard limit let the gateway
	// charge (their rows carry unitsClaimed and unitsUncharged).
	CallsCutAtLimit int64 `json:"callsCutAtLimit,omitempty"`
}

// CreditsFree is the prepaid balance neither spent nor held by calls in
// flight (billing.State.CreditsFree: it never wraps round).
func (ps PeriodSummary) CreditsFree() billing.Units {
	return billing.State{Credits: ps.Credits, CreditsHeld: ps.CreditsHeld}.CreditsFree()
}

// Summarize reads the billing period of sub that contains at, under the
// product of the running catalog.
func (o *Ops) Summarize(ctx context.Context, sub store.Subscription, at time.Time) (PeriodSummary, error) {
	ps, err := o.PeriodState(ctx, sub, at)
	if err != nil || ps.ProductMissing {
		return ps, err
	}
	svc, _ := o.rt.Catalog.Service(sub.ServiceID)
	p, _ := svc.Product(sub.ProductID)
	if hasHardLimit(*p) {
		// From the hourly rollups: a handful of reads for a month. The
		// whole period, as its counter counts it: up to `at` alone, a
		// summary of a time before a cut call showed its units used
		// and not the call (TestSummaryCountsCutCallsOfTheWholePeriod).
		f := store.LedgerFilter{UserID: sub.UserID, ServiceID: sub.ServiceID, From: ps.PeriodStart, To: ps.PeriodEnd}
		err := store.ScanUsage(ctx, o.rt.Store(), f, func(r store.Rollup) error {
			ps.CallsCutAtLimit += r.Capped
			return nil
		})
		if err != nil {
			return ps, fmt.Errorf("count the calls cut at a limit: %w", err)
		}
	}
	return ps, nil
}

// hasHardLimit tells whether a product can cut a claim short: a blocked
// quota, a prepaid balance or a spending cap.
func hasHardLimit(p billing.Product) bool {
	return p.Quota != nil && !p.OverageAllowed() || p.BillingModel == billing.Prepaid || p.SpendingCap != nil
}

// UserSummary is a user's billing periods (GET /platform/users/{userId}/summary).
type UserSummary struct {
	UserID        string          `json:"userId"`
	At            time.Time       `json:"at"`
	Subscriptions []PeriodSummary `json:"subscriptions"`
}

// maxSummarySubscriptions bounds the subscriptions of one summary; a user
// has one per service, so this is the size of a very large catalog.
const maxSummarySubscriptions = 10000

// Summary is the billing period containing at of each of the user's
// subscriptions (of serviceID's only, when it is set).
func (o *Ops) Summary(ctx context.Context, userID, serviceID string, at time.Time) (UserSummary, error) {
	if err := CheckUserID("userId", userID); err != nil {
		return UserSummary{}, err
	}
	var subs []store.Subscription
	if serviceID != "" {
		sub, err := o.rt.Store().GetSubscription(ctx, userID, serviceID)
		if errors.Is(err, store.ErrNoAccount) || errors.Is(err, store.ErrNotFound) {
			return UserSummary{}, SubscriptionNotFound(userID, serviceID)
		}
		if err != nil {
			return UserSummary{}, fmt.Errorf("read subscription of %s to %s: %w", userID, serviceID, err)
		}
		subs = append(subs, sub)
	} else {
		cursor := ""
		for {
			page, next, err := o.rt.Store().ListSubscriptions(ctx, userID, cursor, MaxPageLimit)
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
		ps, err := o.Summarize(ctx, sub, at)
		if err != nil {
			return UserSummary{}, fmt.Errorf("summarize %s on %s: %w", userID, sub.ServiceID, err)
		}
		out.Subscriptions = append(out.Subscriptions, ps)
	}
	return out, nil
}
