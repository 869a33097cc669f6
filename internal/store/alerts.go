package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// Delivery states of a usage alert.
const (
	AlertPending   = "PENDING"   // fired, not yet delivered
	AlertDelivered = "DELIVERED" // the webhook answered 2xx
	AlertFailed    = "FAILED"    // given up after the retry schedule ran out
)

// Alert is a usage alert as recorded: one per subscription, billing period
// and threshold. It is written before its webhook is first sent, so a
// restart neither loses nor repeats it.
type Alert struct {
	ID          string    `json:"alertId"`
	UserID      string    `json:"userId"`
	ServiceID   string    `json:"serviceId"`
	ProductID   string    `json:"productId"`
	PeriodStart time.Time `json:"periodStart"`
	// Threshold is the threshold as the Caddyfile writes it ("quota 80%").
	Threshold string        `json:"threshold"`
	Value     billing.Units `json:"value"`
	Limit     billing.Units `json:"limit"`
	// Currency (money) or Unit (credits, the quota's unit) is what Value
	// and Limit count, as the product said when the alert fired
	// (alerts.Measure); both empty for an alert recorded before they
	// were, and for the spending cap of a product without a currency.
	Currency  string    `json:"currency,omitempty"`
	Unit      string    `json:"unit,omitempty"`
	Created   time.Time `json:"createdAt"`
	Status    string    `json:"status"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"lastError,omitempty"`
	// NextAttempt is when a pending alert is sent (again).
	NextAttempt time.Time `json:"nextAttemptAt,omitzero"`
	DeliveredAt time.Time `json:"deliveredAt,omitzero"`
}

// UnmarshalJSON reads an alert as the stores write it (json.Marshal of
// Alert), its value and limit through Amount: a "credits below" alert fired
// for an overdrawn prepaid balance carries a negative value, and a usage
// figure summed from large reports can pass MaxUnits, which billing.Units
// refuses to read. An alert that did not read back would stop the delivery
// of every alert after it and the listing.
func (a *Alert) UnmarshalJSON(b []byte) error {
	type fields Alert // Alert's fields without this method
	var r struct {
		*fields
		Value Amount `json:"value"` // shadows fields.Value: the shallower field is the one decoded
		Limit Amount `json:"limit"`
	}
	r.fields = (*fields)(a)
	r.Value, r.Limit = Amount(a.Value), Amount(a.Limit)
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	a.Value, a.Limit = billing.Units(r.Value), billing.Units(r.Limit)
	return nil
}

// AlertFilter narrows an alert listing; empty fields match every alert.
type AlertFilter struct {
	UserID    string
	ServiceID string
	Status    string
}

// Matches reports whether a passes the filter.
func (f AlertFilter) Matches(a Alert) bool {
	return (f.UserID == "" || a.UserID == f.UserID) &&
		(f.ServiceID == "" || a.ServiceID == f.ServiceID) &&
		(f.Status == "" || a.Status == f.Status)
}

// AlertScanBudget bounds the stored alerts one ListAlerts call examines.
const AlertScanBudget = 10000

// AccountRef names a subscription whose usage or credits changed.
type AccountRef struct {
	UserID    string
	ServiceID string
}

// Alerts records usage alerts and tells the evaluator which subscriptions
// changed.
type Alerts interface {
	// CreateAlert records a fired alert as pending and returns it with its
	// id. An alert of the same user, service, period and threshold,
	// recorded before by anyone, is ErrExists with the stored alert: an
	// alert fires once.
	CreateAlert(ctx context.Context, a Alert) (Alert, error)
	// HasAlert reports whether that alert was recorded (a read only).
	HasAlert(ctx context.Context, userID, serviceID string, periodStart time.Time, threshold string) (bool, error)
	// DueAlerts returns up to limit pending alerts whose next attempt is
	// at or before now, oldest first.
	DueAlerts(ctx context.Context, now time.Time, limit int) ([]Alert, error)
	// UpdateAlert stores a's status, attempts, last error, next attempt
	// and delivery time if the stored alert is still pending with
	// attempts attempts; otherwise (another sender took it meanwhile)
	// ErrStale with the stored alert, and nothing changes.
	UpdateAlert(ctx context.Context, a Alert, attempts int) (Alert, error)
	// ListAlerts returns up to limit alerts matching f, newest first,
	// starting after cursor, and the cursor of the next page ("" at the
	// end). Like ListJobs it examines at most AlertScanBudget alerts per
	// call.
	ListAlerts(ctx context.Context, f AlertFilter, cursor string, limit int) ([]Alert, string, error)
	// ChangedAccounts returns the subscriptions whose counters or credits
	// committed changes since the last call, and a channel that is ready
	// when there are more. Only changes durable before the call are
	// returned, so their state can be read at once.
	ChangedAccounts() ([]AccountRef, <-chan struct{})
	// RequeueChanged puts refs back among the changed subscriptions and
	// makes the channel ready: an evaluation that could not finish them
	// (the loop was stopped by a reload, or a read failed) leaves them to
	// the next round, which may be another config's loop on this store.
	RequeueChanged(refs []AccountRef)
}
