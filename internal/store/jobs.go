package store

import (
	"context"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// Job states: PENDING → RUNNING (first progress) → COMPLETED | FAILED.
// Terminal states never change again.
const (
	JobPending   = "PENDING"
	JobRunning   = "RUNNING"
	JobCompleted = "COMPLETED"
	JobFailed    = "FAILED"
)

// Job is an async invocation.
type Job struct {
	ID         string `json:"requestId"`
	UserID     string `json:"userId"`
	KeyID      string `json:"keyId,omitempty"`
	ServiceID  string `json:"serviceId"`
	EndpointID string `json:"endpointId"`
	ProductID  string `json:"productId,omitempty"`
	// Free marks a service owner's job: units are recorded, never charged.
	Free bool `json:"free,omitempty"`

	Status             string    `json:"status"`
	Stage              string    `json:"currentStage,omitempty"`
	PercentageComplete float64   `json:"percentageComplete"`
	ErrorMessage       string    `json:"errorMessage,omitempty"`
	CreatedAt          time.Time `json:"startTime"`
	UpdatedAt          time.Time `json:"updatedAt"`
	ExpiresAt          time.Time `json:"expiresAt"`
	CompletedAt        time.Time `json:"completedAt,omitzero"`

	Result          string        `json:"result,omitempty"`
	ResultSize      int           `json:"size,omitempty"` // bytes of the result as sent, before truncation
	ResultTruncated bool          `json:"resultTruncated,omitempty"`
	ResultURL       string        `json:"resultUrl,omitempty"`
	ContentType     string        `json:"contentType,omitempty"`
	Units           billing.Units `json:"units,omitempty"`
	Cost            billing.Units `json:"cost,omitempty"`
	// CompletionDigest identifies the accepted completion so that the same
	// completion sent again is recognised (200) and a different one is
	// refused (409).
	CompletionDigest string `json:"-"`
	// ReservationID names the hold CreateJobReserved took for the job. The
	// hold lives as long as the job is open and is settled or released by
	// the store when the job ends; empty for a job that holds nothing.
	ReservationID string `json:"-"`
	// Terms are the terms the job was accepted under, which its completion
	// is charged with whatever the catalog says by then (Charge). Nil for
	// a job stored without them: one stored by a version before they were
	// kept, or created by CreateJob without them.
	Terms *JobTerms `json:"-"`
}

// JobTerms are what a job's completion is charged with, taken when the job
// is accepted, so that a job is charged as a sync call admitted at the same
// instant is, whatever a reload (a product or endpoint renamed, removed or
// repriced) or a plan change does before it completes.
type JobTerms struct {
	// Product is the product the job was admitted (and its hold taken)
	// under, as the catalog offered it then: billing model, measurement,
	// price, quota, overage and cap. Nil for a free job (a service
	// owner's). CreateJobReserved sets it from the account it holds for.
	Product *billing.Product
	// EndpointCost is the endpoint's per-call cost then
	// (catalog.Endpoint.UnitCost): what a PER_REQUEST (or free) job
	// completed without stated units is charged.
	EndpointCost billing.Units
}

// WithTerms returns j with its terms recording the product of a (none for
// a free account), as CreateJobReserved stores them: the product the terms
// name is always the one the job's hold was taken under. A job without
// terms is returned as is.
func (j Job) WithTerms(a Account) Job {
	if j.Terms == nil {
		return j
	}
	t := *j.Terms
	t.Product = nil
	if !a.Free {
		p := a.Product
		t.Product = &p
	}
	j.Terms = &t
	return j
}

// Charge is the account and ledger entry a completion of j is charged
// with, given those the caller passed (CompleteJob). A job with terms is
// charged under them, whatever a says: to the job's user and service,
// under Terms.Product (recorded free when it has none, or the job is
// free). A job stored without terms, by a version before they were kept,
// is charged with a and e as given, as that version did: under the
// product the catalog offers at completion. An a with no user (UpdateJob,
// ExpireJobs: nothing charged) is returned as is.
func (j Job) Charge(a Account, e LedgerEntry) (Account, LedgerEntry) {
	if j.Terms == nil || a.UserID == "" {
		return a, e
	}
	out := Account{UserID: j.UserID, ServiceID: j.ServiceID}
	if j.Free || j.Terms.Product == nil {
		out.Free = true
		e.ProductID = ""
		return out, e
	}
	out.Product = *j.Terms.Product
	e.ProductID = out.Product.ID
	return out, e
}

// Terminal reports whether the job's state can no longer change.
func (j Job) Terminal() bool { return j.Status == JobCompleted || j.Status == JobFailed }

// Expired reports whether the job's deadline has come at now: ExpiresAt is
// the first instant the job is out of time (now >= ExpiresAt), as a
// context's deadline is, so a completion or progress report dated exactly
// at the deadline is refused and the sweep fails the job then. This is the
// one rule: the usage handler and both stores' ExpireJobs decide with it
// (pgstore's query selects with the same comparison and checks each row
// here). It says nothing of the state: a terminal job is never expired.
func (j Job) Expired(now time.Time) bool { return !now.Before(j.ExpiresAt) }

// Jobs stores async jobs.
//
// A job started by a caller holds quota like a sync call does: the units
// are reserved in the transaction that creates the job (CreateJobReserved)
// and the hold belongs to the job, not to the process, so it survives a
// restart. Whatever makes the job terminal (CompleteJob, UpdateJob,
// ExpireJobs) settles or releases the hold in the same transaction, exactly
// once.
type Jobs interface {
	// CreateJob stores a new job that holds nothing (a job imported or made
	// by an operator). A job a caller starts is created with
	// CreateJobReserved.
	CreateJob(ctx context.Context, j Job) error
	// CreateJobReserved holds units for a and stores the new job in one
	// transaction, with the hold tied to the job (the returned reservation
	// carries the job's id, the stored job the reservation's). The
	// reservation carries the decision and the state after the hold. When
	// the decision refuses, nothing is written, no job and no hold: the
	// reservation has no ID. A free account (a service owner) holds
	// nothing and its job is always created. The reservation settles with
	// the job and is never passed to Settle. The job's Terms, when given,
	// are stored with the product of a (Job.WithTerms).
	CreateJobReserved(ctx context.Context, j Job, a Account, units billing.Units, now time.Time) (Reservation, error)
	GetJob(ctx context.Context, id string) (Job, error)
	// UpdateJob runs fn on the stored job in a write transaction and stores
	// the result unless fn returns an error, which is returned as is. When
	// fn makes an open job terminal, its hold is released: nothing is
	// charged.
	UpdateJob(ctx context.Context, id string, fn func(*Job) error) (Job, error)
	// CompleteJob runs fn on the stored job and, unless fn returns an error,
	// stores it and meters the completion in the same transaction, so a
	// completion's units are metered exactly once. When fn makes an open
	// job COMPLETED, e.Units are settled against the job's hold as Settle
	// does: charged to a at most up to what the hard limits allow (the
	// stated units kept in e.UnitsClaimed when cut), into the billing
	// period the hold was taken in. A FAILED job, or e.Units zero, only
	// releases the hold. A free account records the units with no product.
	// The job returned carries the units and cost charged. A job with
	// Terms is charged under them, not a (Job.Charge).
	CompleteJob(ctx context.Context, id string, a Account, e LedgerEntry, fn func(*Job) error) (Job, error)
	// ExpireJobs fails every unfinished job that is Expired at now (its
	// ExpiresAt not after now), releasing its hold, and returns how many it
	// failed.
	ExpireJobs(ctx context.Context, now time.Time, message string) (int, error)
}
