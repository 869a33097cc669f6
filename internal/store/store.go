// Package store defines what the gateway keeps durably: service keys (as
// hashes), subscriptions with their credits, per-period usage counters, the
// append-only usage ledger, idempotency claims and async jobs. boltstore is
// the embedded implementation (one file, one process); pgstore keeps a
// fleet of gateways on one PostgreSQL database. internal/store/storetest is the
// contract both keep, as one test suite.
//
// Every metering method takes the billing decision and records what it
// implies as one unit: a charge is acknowledged once it is durable (in
// boltstore, appended to the settlement log; in pgstore, committed), a
// counter always equals the ledger it is derived from, and a hard limit is
// never crossed under any concurrency.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/servicekey"
)

// Errors the store returns; callers map them to the JSON error codes.
var (
	// ErrNotFound says the record asked for (a key, a job, a hold) does
	// not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists says a record with the same identity is stored already,
	// so nothing was written: a key with the same id or hash (CreateKey),
	// a job with the same id (CreateJob, CreateJobReserved), an alert of
	// the same user, service, period and threshold (CreateAlert, which
	// returns the stored alert with it).
	ErrExists = errors.New("already exists")
	// ErrReplayed says the idempotency key of a Record was claimed before:
	// nothing was charged again, and the first call's stored response is
	// returned with it.
	ErrReplayed = errors.New("idempotency key already used")
	// ErrStale says the record changed since the caller read it (another
	// sender claimed the alert, or it is no longer pending): UpdateAlert
	// wrote nothing and returns the stored alert with it. A payment
	// record whose body is not the one read (SwapPaymentRecord) is
	// ErrStale too, and nothing was written; so is a subscription put
	// since the revision read (PutSubscriptionIf), returned with it.
	ErrStale = errors.New("changed since it was read")
	// ErrJobHold says Settle was given a job's hold (JobID set): it
	// settles with its job (CompleteJob, UpdateJob, ExpireJobs), so
	// nothing was written.
	ErrJobHold = errors.New("a job's hold settles with its job")
	// ErrNoAccount says the user has no subscription to the service: the
	// lookup and every metering method that needs one.
	ErrNoAccount = errors.New("no subscription")
	// ErrUnavailable says the store cannot record writes now (a full
	// disk, an I/O error): a call whose charge cannot be recorded is
	// refused before it is forwarded. It clears by itself once a write
	// commits again.
	ErrUnavailable = errors.New("store unavailable")
	// ErrSettlementPending (also ErrUnavailable) says a Settle could not
	// be confirmed in time but the store keeps the settlement and writes
	// it once it can, each call once by its id (a fleet node whose
	// database did not answer: docs/fleet.md): the call will be charged,
	// so its answer is delivered, not withheld.
	ErrSettlementPending = pendingError{}
	// ErrBalanceRange says AddCredits (or a grant, or a reversal of one:
	// Payments) would take a prepaid balance past what a balance holds
	// (about ±9.2 trillion credits): nothing was changed. An embedded
	// store wrapped round to a balance of the other sign.
	ErrBalanceRange = errors.New("the balance would pass what a balance can hold")
)

// Store is the gateway's durable state.
type Store interface {
	Keys
	Subscriptions
	Meter
	Jobs
	Views
	Alerts
	Audit
	// PruneIdempotency forgets idempotency keys claimed before cutoff.
	PruneIdempotency(ctx context.Context, cutoff time.Time) (int, error)
	// Close releases the store; in-flight commits finish first.
	Close() error
}

// KeyRecord is a service key as stored: never the key, only its SHA-256.
type KeyRecord struct {
	ID        string    `json:"keyId"`
	Hash      [32]byte  `json:"-"`
	UserID    string    `json:"userId"`
	Roles     []string  `json:"roles,omitempty"`
	Label     string    `json:"label,omitempty"`
	Created   time.Time `json:"createdAt"`
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	RevokedAt time.Time `json:"revokedAt,omitzero"`
	// ParentKeyID is the key a caller was signed in to the portal with
	// when they made this one; empty for a key an operator made. Records
	// written before it existed read back without it.
	ParentKeyID string `json:"parentKeyId,omitempty"`
	// EndsWithParent: revoking the parent key revokes this one too (the
	// portal's minted_keys follow_parent, chosen when the key was made).
	EndsWithParent bool `json:"endsWithParent,omitempty"`
}

// Status is the key's status at now (servicekey.StatusAt): whether it
// may still be used.
func (k KeyRecord) Status(now time.Time) servicekey.Status {
	return servicekey.StatusAt(k.RevokedAt, k.ExpiresAt, now)
}

// ActiveAt reports whether the key authenticates at now: neither revoked
// nor expired.
func (k KeyRecord) ActiveAt(now time.Time) bool {
	return servicekey.ActiveAt(k.RevokedAt, k.ExpiresAt, now)
}

// Keys stores service keys. CreateKey and RevokeKey, like PutSubscription,
// take the audit entries of the change (an operator's, usually one; see
// Audit): they are appended to the audit log in the same transaction as
// the change, so the change and its entries are stored together or not at
// all. A change refused (ErrExists, ErrNotFound) appends none, and an entry
// that cannot be written fails the change.
type Keys interface {
	CreateKey(ctx context.Context, k KeyRecord, audit ...AuditEntry) error
	// KeyByHash finds a key, revoked or expired ones included.
	KeyByHash(ctx context.Context, hash [32]byte) (KeyRecord, error)
	KeyByID(ctx context.Context, id string) (KeyRecord, error)
	// ListKeys lists a user's keys, or every key when userID is empty.
	ListKeys(ctx context.Context, userID string) ([]KeyRecord, error)
	// RevokeKey marks the key revoked at the given time; revoking twice
	// keeps the first time (and appends the entries again: the second
	// revocation is an act of its own).
	RevokeKey(ctx context.Context, id string, at time.Time, audit ...AuditEntry) (KeyRecord, error)
}

// Subscription ties a user to a product of a service.
type Subscription struct {
	UserID    string `json:"userId"`
	ServiceID string `json:"serviceId"`
	ProductID string `json:"productId"`
	// Status is ACTIVE, TRIAL, CANCELLING, CANCELLING_PENDING, EXPIRED,
	// CANCELLED or SUSPENDED.
	Status string `json:"status"`
	// StartedAt anchors the billing periods.
	StartedAt time.Time `json:"startedAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// Credits is the prepaid balance after settled charges.
	Credits     billing.Units `json:"credits"`
	CreditsHeld billing.Units `json:"creditsHeld"`
	// EndsAt, when set, is when the subscription stops granting access,
	// whatever its Status says: from EndsAt on it reads as EndStatus
	// (subscription.EffectiveStatus). A trial and a cancellation set it,
	// so they end exactly at the call rather than when a sweep runs.
	// Each PutSubscription replaces EndsAt and EndStatus with its own
	// (zero clears them): an operator who sets a status clears the end.
	EndsAt time.Time `json:"endsAt,omitzero"`
	// EndStatus is the status from EndsAt on: CANCELLED, EXPIRED or
	// SUSPENDED (a Stripe subscription past due beyond its grace).
	EndStatus string `json:"endStatus,omitempty"`
	// RestartPeriodsAt, given to PutSubscription, moves an existing
	// subscription's period anchor (StartedAt) to it: its billing periods
	// start again from then, with nothing used in the new one. Payments
	// sets it when a Stripe subscription's paid period begins off the
	// gateway's grid (a trial converted, a plan bought after another);
	// zero keeps StartedAt, as every other put does. Never stored.
	RestartPeriodsAt time.Time `json:"-"`
	// Revision counts the puts of the subscription: every PutSubscription
	// (and PutSubscriptionIf) that writes it makes it one more, the first
	// 1; a change of the balance (AddCredits, a settlement, a grant)
	// keeps it. A subscription stored before revisions were kept reads
	// as 0 until its next put. It is the store's: a put's own is ignored.
	// PutSubscriptionIf writes only over the revision it is given.
	Revision uint64 `json:"-"`
}

// Subscriptions stores subscriptions and credit balances.
type Subscriptions interface {
	// PutSubscription creates or updates the subscription of a user to a
	// service. StartedAt and the credit balance are kept on update (but
	// for a RestartPeriodsAt, which becomes StartedAt); every other field,
	// EndsAt and EndStatus included, is the put's. The audit entries are
	// appended with the put, in its transaction (as Keys says).
	PutSubscription(ctx context.Context, s Subscription, audit ...AuditEntry) (Subscription, error)
	// PutSubscriptionIf is PutSubscription only while the stored
	// subscription is still at revision (its Revision as the caller read
	// it): a compare-and-swap, in the put's transaction. A subscription
	// put since (its revision moved on) is ErrStale, returned with the
	// subscription as stored now, and nothing is written, the audit
	// entries neither; none stored is ErrNoAccount, nothing written.
	// Payments' put-back of a Stripe state (docs/payments.md) writes
	// with it, so an operator's plan put after its read is never written
	// over.
	PutSubscriptionIf(ctx context.Context, s Subscription, revision uint64, audit ...AuditEntry) (Subscription, error)
	GetSubscription(ctx context.Context, userID, serviceID string) (Subscription, error)
	// AddCredits adds (or, negative, removes) prepaid credits. The audit
	// entries are appended with the change, in its transaction (in
	// boltstore, its settlement-log record), each one's Detail followed by
	// ", balance " and the balance after the change, which only the store
	// knows when it makes it. No subscription (ErrNoAccount) or a balance
	// out of range (ErrBalanceRange) appends none.
	AddCredits(ctx context.Context, userID, serviceID string, amount billing.Units, at time.Time, audit ...AuditEntry) (Subscription, error)
}

// Ledger sources.
const (
	SourceGateway    = "gateway"
	SourceReport     = "report"
	SourceCompletion = "completion"
)

// Account identifies whose usage is metered under which product.
type Account struct {
	UserID    string
	ServiceID string
	Product   billing.Product
	// Free marks a service owner's own call: recorded in the ledger with
	// no product, never counted against anything.
	Free bool
}

// LedgerEntry is one metered event; the ledger is append-only.
type LedgerEntry struct {
	Seq        uint64    `json:"seq"`
	ID         string    `json:"id"`
	Time       time.Time `json:"time"`
	UserID     string    `json:"userId"`
	ServiceID  string    `json:"serviceId"`
	EndpointID string    `json:"endpointId,omitempty"`
	ProductID  string    `json:"productId,omitempty"`
	RequestID  string    `json:"requestId,omitempty"`
	// OccurredAt is when the usage happened as its reporter says (a
	// report's timestamp); Time is when the gateway recorded it.
	OccurredAt     time.Time     `json:"occurredAt,omitzero"`
	Units          billing.Units `json:"units"`
	Overage        billing.Units `json:"overage,omitempty"`
	Cost           billing.Units `json:"cost,omitempty"`
	Source         string        `json:"source"`
	IdempotencyKey string        `json:"idempotencyKey,omitempty"`
	// UnitsClaimed is what the backend stated when more than a hard limit
	// allowed to charge; Units is what was charged. A call is never
	// charged less than it held before it was forwarded (its hold is a
	// promise no other call may take), so a cut row has 0 < Units <
	// UnitsClaimed (docs/wire-contract.md, "Claims past a hard limit").
	UnitsClaimed billing.Units `json:"unitsClaimed,omitempty"`
}

// Uncharged is what a hard limit left uncharged of the units the backend
// stated: 0 for a row charged in full.
func (e LedgerEntry) Uncharged() billing.Units {
	if e.UnitsClaimed > e.Units {
		return e.UnitsClaimed - e.Units
	}
	return 0
}

// Reservation is a hold on units for a call in flight, as Reserve and
// CreateJobReserved return it. It always carries the decision; a refused
// one holds nothing: it has no ID and only Decision and State are set.
type Reservation struct {
	// ID names the hold; empty when nothing is held (a refusal, or a free
	// account, which holds nothing).
	ID        string
	Account   Account
	Decision  billing.Decision
	PeriodKey int64 // start of the billing period, Unix seconds
	// State is the subscription's period state after the hold (before it,
	// when refused); zero for a free account.
	State billing.State
	// JobID is set on the hold of an async job (CreateJobReserved): it
	// outlives the process and ends with the job, never through Settle.
	JobID string
}

// Meter reserves, settles and records usage.
type Meter interface {
	// Reserve holds units for a call before it is forwarded. The
	// reservation carries the decision and the state after the hold. When
	// the decision refuses, nothing is written: the reservation has no ID
	// and holds nothing. The hold belongs to the process and is not a
	// charge: it lives in memory, and if the process dies before Settle it
	// is gone, charging nothing. Only a job's hold (CreateJobReserved) is
	// durable, with its job.
	Reserve(ctx context.Context, a Account, units billing.Units, now time.Time) (Reservation, error)
	// Settle releases the hold and charges units (at most what the hard
	// limits allow), appending the ledger entry. Units zero only releases.
	// A hold that is already gone is ErrNotFound; a job's hold (JobID set)
	// is ErrJobHold, since it settles with its job.
	Settle(ctx context.Context, r Reservation, units billing.Units, e LedgerEntry) (LedgerEntry, error)
	// Record charges usage reported after the fact (reports), even past a
	// limit, returning the entry and the state after it. With a non-empty
	// e.IdempotencyKey the key is claimed in the same transaction; a
	// duplicate returns ErrReplayed with the first call's stored response.
	Record(ctx context.Context, a Account, e LedgerEntry, response func(LedgerEntry, billing.State) ([]byte, error)) (stored []byte, err error)
	// State returns the subscription's current period state.
	State(ctx context.Context, a Account, now time.Time) (billing.State, error)
	// Writable is nil when Reserve would take a hold now, else the error
	// it would refuse with (ErrUnavailable while the store cannot write or
	// cannot be reached). The pre-flight routes ask it before they answer
	// that a call would be allowed.
	Writable(ctx context.Context) error
	// ScanLedger calls fn for each entry with from <= Time < to (zero
	// bounds are open) in time order, stopping at fn's first error.
	ScanLedger(ctx context.Context, f LedgerFilter, fn func(LedgerEntry) error) error
}

// LedgerFilter narrows a ledger scan.
type LedgerFilter struct {
	UserID    string
	ServiceID string
	From, To  time.Time
}

// AuditEntry is one change an operator made (a key created or revoked, a
// subscription set, credits added), as the audit log keeps it: who, what,
// when. It never holds a key or a secret.
type AuditEntry struct {
	// Seq orders the log; the store assigns it.
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Actor is who made the change: "admin-api <remote addr>" for the admin
	// API, "console:<operator>" for the console.
	Actor string `json:"actor"`
	// Action is key.create, key.revoke, subscription.put or credits.add.
	Action    string `json:"action"`
	UserID    string `json:"userId,omitempty"`
	ServiceID string `json:"serviceId,omitempty"`
	KeyID     string `json:"keyId,omitempty"`
	// Detail says what changed, in words (a product and status, an amount).
	Detail string `json:"detail,omitempty"`
}

// Audit is the append-only log of operator changes. A change the store
// makes (a key, a subscription, credits added or granted, a ledger prune)
// takes its entries with it and writes them with the change (CreateKey,
// RevokeKey, PutSubscription, AddCredits, Payments, LedgerPruner);
// AppendAudit is for what is only an entry (a sign-in, a request, a
// config's changed setting) or a change made apart from the store's
// writes (a rollup prune). Sequence numbers are given in the order entries
// commit, whichever way they come; PostgreSQL may skip numbers (a
// transaction rolled back), so they order the log and are not a count.
type Audit interface {
	// AppendAudit stores e with the next sequence number and returns it.
	AppendAudit(ctx context.Context, e AuditEntry) (AuditEntry, error)
	// ListAudit returns up to limit entries, newest first, starting
	// before cursor ("" for the newest), and the cursor of the next (older)
	// page, "" when there is none. A malformed cursor is ErrBadCursor.
	ListAudit(ctx context.Context, cursor string, limit int) ([]AuditEntry, string, error)
}

// pendingError is ErrSettlementPending: errors.Is matches it and
// ErrUnavailable.
type pendingError struct{}

func (pendingError) Error() string {
	return "store unavailable: the settlement is kept and written once the store answers"
}

func (pendingError) Is(target error) bool { return target == ErrUnavailable }

// ChargeFloor charges entry for a call (or a job) whose backend stated
// units that the hard limits (p's, in state st) do not take whole, and
// that held held units: it is cut to what the limits fit, never below
// what it held, as far as it stated (docs/wire-contract.md, "Claims past
// a hard limit", rule 2), with UnitsClaimed the claim when less is
// charged, and it returns the charge's decision. What the limits fit is
// less than the hold only when something that is no call took the room
// the hold was promised: a usage report charged past the limit, or
// credits taken back (a refund, a lost dispute, an operator's
// correction), or on PostgreSQL a lease row given back while the call
// was in flight. The call was served on its hold, so its hold is
// charged, past the limit as the report was, rather than recorded at 0
// units: served free. Every store cuts a charge with it (Settle, a job's
// completion).
func ChargeFloor(p billing.Product, st billing.State, units, held billing.Units, entry *LedgerEntry) billing.Decision {
	entry.Units = max(billing.FitCharge(p, st, units), min(units, held))
	if entry.Units < units {
		entry.UnitsClaimed = units
	}
	return billing.DecideCharge(p, st, entry.Units)
}
