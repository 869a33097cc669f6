package ops

import (
	"encoding/json"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The admin API's own views of stored records. The store's types are how
// records are kept; these are what operators read, field by field, so a
// change to how the store keeps a record never changes the admin API's
// JSON (docs/operations.md documents it). Service keys have theirs in
// keys.go (KeyView).

// SubscriptionRecord is a subscription and its credit balance.
type SubscriptionRecord struct {
	UserID      string        `json:"userId"`
	ServiceID   string        `json:"serviceId"`
	ProductID   string        `json:"productId"`
	Status      string        `json:"status"`
	StartedAt   time.Time     `json:"startedAt"`
	UpdatedAt   time.Time     `json:"updatedAt"`
	Credits     billing.Units `json:"credits"`
	CreditsHeld billing.Units `json:"creditsHeld"`
	// EndsAt and EndStatus: from EndsAt the subscription grants no access
	// and reads as EndStatus (a trial's or a cancellation's end).
	EndsAt    time.Time `json:"endsAt,omitzero"`
	EndStatus string    `json:"endStatus,omitempty"`
}

// ViewSubscription is how operators see a stored subscription.
func ViewSubscription(s store.Subscription) SubscriptionRecord {
	return SubscriptionRecord{
		UserID: s.UserID, ServiceID: s.ServiceID, ProductID: s.ProductID, Status: s.Status,
		StartedAt: s.StartedAt, UpdatedAt: s.UpdatedAt, Credits: s.Credits, CreditsHeld: s.CreditsHeld,
		EndsAt: s.EndsAt, EndStatus: s.EndStatus,
	}
}

// GrantRecord is a credit grant as operators read it: what it gave,
// what refunds and disputes took back, what expired (of it, what expired
// after the expiry, as holds from before it gave credits back unspent),
// what is still deferred to those holds, and what it has left (given
// less taken back less expired less deferred, spent or not).
type GrantRecord struct {
	ID        string        `json:"id"`
	UserID    string        `json:"userId"`
	ServiceID string        `json:"serviceId"`
	Credits   billing.Units `json:"credits"`
	GrantedAt time.Time     `json:"grantedAt"`
	ExpiresAt time.Time     `json:"expiresAt,omitzero"`
	Source    string        `json:"source,omitempty"`
	Reference string        `json:"reference,omitempty"`
	Reversed  billing.Units `json:"reversed"`
	Expired   billing.Units `json:"expired"`
	ExpiredAt time.Time     `json:"expiredAt,omitzero"`
	// ExpiredLater and Deferred: store.CreditGrant's (docs/operations.md,
	// "Credit grants"); absent when 0.
	ExpiredLater billing.Units `json:"expiredLater,omitempty"`
	Deferred     billing.Units `json:"deferred,omitempty"`
	Left         billing.Units `json:"left"`
}

// ViewGrant is how operators see a stored credit grant.
func ViewGrant(g store.CreditGrant) GrantRecord {
	return GrantRecord{ID: g.ID, UserID: g.UserID, ServiceID: g.ServiceID, Credits: g.Credits, GrantedAt: g.GrantedAt,
		ExpiresAt: g.ExpiresAt, Source: g.Source, Reference: g.Reference, Reversed: g.Reversed, Expired: g.Expired,
		ExpiredAt: g.ExpiredAt, ExpiredLater: g.ExpiredLater, Deferred: g.Deferred, Left: g.Left()}
}

// JobRecord is an async job as operators list it: everything but the
// store's bookkeeping (the completion digest, the hold).
type JobRecord struct {
	ID                 string        `json:"requestId"`
	UserID             string        `json:"userId"`
	KeyID              string        `json:"keyId,omitempty"`
	ServiceID          string        `json:"serviceId"`
	EndpointID         string        `json:"endpointId"`
	ProductID          string        `json:"productId,omitempty"`
	Free               bool          `json:"free,omitempty"`
	Status             string        `json:"status"`
	Stage              string        `json:"currentStage,omitempty"`
	PercentageComplete float64       `json:"percentageComplete"`
	ErrorMessage       string        `json:"errorMessage,omitempty"`
	CreatedAt          time.Time     `json:"startTime"`
	UpdatedAt          time.Time     `json:"updatedAt"`
	ExpiresAt          time.Time     `json:"expiresAt"`
	CompletedAt        time.Time     `json:"completedAt,omitzero"`
	Result             string        `json:"result,omitempty"`
	ResultSize         int           `json:"size,omitempty"`
	ResultTruncated    bool          `json:"resultTruncated,omitempty"`
	ResultURL          string        `json:"resultUrl,omitempty"`
	ContentType        string        `json:"contentType,omitempty"`
	Units              billing.Units `json:"units,omitempty"`
	Cost               billing.Units `json:"cost,omitempty"`
	// CostUnit is what Cost is counted in (CostUnit), set by the caller
	// that has the running catalog; empty when it cannot say.
	CostUnit string `json:"costUnit,omitempty"`
}

// ViewJob is how operators see a stored job.
func ViewJob(j store.Job) JobRecord {
	return JobRecord{
		ID: j.ID, UserID: j.UserID, KeyID: j.KeyID, ServiceID: j.ServiceID, EndpointID: j.EndpointID,
		ProductID: j.ProductID, Free: j.Free, Status: j.Status, Stage: j.Stage,
		PercentageComplete: j.PercentageComplete, ErrorMessage: j.ErrorMessage,
		CreatedAt: j.CreatedAt, UpdatedAt: j.UpdatedAt, ExpiresAt: j.ExpiresAt, CompletedAt: j.CompletedAt,
		Result: j.Result, ResultSize: j.ResultSize, ResultTruncated: j.ResultTruncated,
		ResultURL: j.ResultURL, ContentType: j.ContentType, Units: j.Units, Cost: j.Cost,
	}
}

// LedgerRecord is one ledger entry of a usage export (JSON and NDJSON;
// the CSV export has its columns in UsageCSVRow).
type LedgerRecord struct {
	Seq            uint64        `json:"seq"`
	ID             string        `json:"id"`
	Time           time.Time     `json:"time"`
	UserID         string        `json:"userId"`
	ServiceID      string        `json:"serviceId"`
	EndpointID     string        `json:"endpointId,omitempty"`
	ProductID      string        `json:"productId,omitempty"`
	RequestID      string        `json:"requestId,omitempty"`
	OccurredAt     time.Time     `json:"occurredAt,omitzero"`
	Units          billing.Units `json:"units"`
	Overage        billing.Units `json:"overage,omitempty"`
	Cost           billing.Units `json:"cost,omitempty"`
	Source         string        `json:"source"`
	IdempotencyKey string        `json:"idempotencyKey,omitempty"`
	// UnitsClaimed is what the backend stated for a call a hard limit
	// cut short; UnitsUncharged is the part of it not charged (claimed
	// minus units), so a reader needs no arithmetic to see what the
	// limit gave away.
	UnitsClaimed   billing.Units `json:"unitsClaimed,omitempty"`
	UnitsUncharged billing.Units `json:"unitsUncharged,omitempty"`
	// CostUnit is what Cost is counted in (CostUnit): "credits", an ISO
	// 4217 code, or empty when the running catalog cannot say.
	CostUnit string `json:"costUnit,omitempty"`
}

// UsageJSON is a ledger entry as the usage exports write it in JSON (the
// admin API's and the console's).
// costUnit is what its cost is counted in (CostUnit).
func UsageJSON(e store.LedgerEntry, costUnit string) ([]byte, error) {
	r := ViewLedgerEntry(e)
	r.CostUnit = costUnit
	return json.Marshal(r)
}

// ViewLedgerEntry is how a usage export shows a ledger entry.
func ViewLedgerEntry(e store.LedgerEntry) LedgerRecord {
	return LedgerRecord{
		Seq: e.Seq, ID: e.ID, Time: e.Time, UserID: e.UserID, ServiceID: e.ServiceID,
		EndpointID: e.EndpointID, ProductID: e.ProductID, RequestID: e.RequestID, OccurredAt: occurredAt(e),
		Units: e.Units, Overage: e.Overage, Cost: e.Cost, Source: e.Source,
		IdempotencyKey: e.IdempotencyKey, UnitsClaimed: e.UnitsClaimed, UnitsUncharged: e.Uncharged(),
	}
}

// occurredAt is e's OccurredAt as the usage exports show it: within the
// years RFC 3339 writes (store.ClampRFC3339; the zero time, no
// OccurredAt, stays zero).
func occurredAt(e store.LedgerEntry) time.Time { return store.ClampRFC3339(e.OccurredAt) }

// AuditRecord is one entry of the audit log.
type AuditRecord struct {
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Actor     string    `json:"actor"`
	Action    string    `json:"action"`
	UserID    string    `json:"userId,omitempty"`
	ServiceID string    `json:"serviceId,omitempty"`
	KeyID     string    `json:"keyId,omitempty"`
	Detail    string    `json:"detail,omitempty"`
}

// ViewAuditEntry is how operators see an audit entry.
func ViewAuditEntry(e store.AuditEntry) AuditRecord {
	return AuditRecord{Seq: e.Seq, Time: e.Time, Actor: e.Actor, Action: e.Action,
		UserID: e.UserID, ServiceID: e.ServiceID, KeyID: e.KeyID, Detail: e.Detail}
}

// AlertRecord is a usage alert as the admin API lists it.
type AlertRecord struct {
	ID          string        `json:"alertId"`
	UserID      string        `json:"userId"`
	ServiceID   string        `json:"serviceId"`
	ProductID   string        `json:"productId"`
	PeriodStart time.Time     `json:"periodStart"`
	Threshold   string        `json:"threshold"`
	Value       billing.Units `json:"value"`
	Limit       billing.Units `json:"limit"`
	// Currency or Unit is what Value and Limit count, as the webhook says
	// it (docs/alerts.md).
	Currency    string    `json:"currency,omitempty"`
	Unit        string    `json:"unit,omitempty"`
	Created     time.Time `json:"createdAt"`
	Status      string    `json:"status"`
	Attempts    int       `json:"attempts"`
	LastError   string    `json:"lastError,omitempty"`
	NextAttempt time.Time `json:"nextAttemptAt,omitzero"`
	DeliveredAt time.Time `json:"deliveredAt,omitzero"`
}

// ViewAlert is how operators see a stored alert.
func ViewAlert(a store.Alert) AlertRecord {
	return AlertRecord{
		ID: a.ID, UserID: a.UserID, ServiceID: a.ServiceID, ProductID: a.ProductID, PeriodStart: a.PeriodStart,
		Threshold: a.Threshold, Value: a.Value, Limit: a.Limit, Currency: a.Currency, Unit: a.Unit, Created: a.Created, Status: a.Status,
		Attempts: a.Attempts, LastError: a.LastError, NextAttempt: a.NextAttempt, DeliveredAt: a.DeliveredAt,
	}
}
