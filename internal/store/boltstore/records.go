package boltstore

import (
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// amount is a quantity as the store writes it (store.Amount): the decimal
// text of billing.Units, read back over the whole signed int64 range, since
// stored figures legitimately go past what the wire accepts.
type amount = store.Amount

// The store's own record types: what the file holds, field by field, with
// the store's JSON names. They do not embed the store package's types, so
// the names on disk do not depend on the tags the admin API writes those
// types out with; a field added to a store type is stored only once it is
// added here. The names are those the file has always had (the crash tests
// read the file with their own decoder, e2e/reliability_helpers_test.go).

// keyRecord is a service key as stored, under the SHA-256 of the key (the
// bucket's key; never the key itself).
type keyRecord struct {
	ID        string    `json:"keyId"`
	UserID    string    `json:"userId"`
	Roles     []string  `json:"roles,omitempty"`
	Label     string    `json:"label,omitempty"`
	Created   time.Time `json:"createdAt"`
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	RevokedAt time.Time `json:"revokedAt,omitzero"`
	// Added later: absent from older records, which read back as keys an
	// operator made.
	ParentKeyID    string `json:"parentKeyId,omitempty"`
	EndsWithParent bool   `json:"endsWithParent,omitempty"`
}

func toKeyRecord(k store.KeyRecord) keyRecord {
	return keyRecord{ID: k.ID, UserID: k.UserID, Roles: k.Roles, Label: k.Label, Created: k.Created,
		ExpiresAt: k.ExpiresAt, RevokedAt: k.RevokedAt, ParentKeyID: k.ParentKeyID, EndsWithParent: k.EndsWithParent}
}

// key is the record without its hash, which the caller sets from the
// bucket's key.
func (r keyRecord) key() store.KeyRecord {
	return store.KeyRecord{ID: r.ID, UserID: r.UserID, Roles: r.Roles, Label: r.Label, Created: r.Created,
		ExpiresAt: r.ExpiresAt, RevokedAt: r.RevokedAt, ParentKeyID: r.ParentKeyID, EndsWithParent: r.EndsWithParent}
}

// subRecord is a subscription as stored.
type subRecord struct {
	UserID      string    `json:"userId"`
	ServiceID   string    `json:"serviceId"`
	ProductID   string    `json:"productId"`
	Status      string    `json:"status"`
	StartedAt   time.Time `json:"startedAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
	Credits     amount    `json:"credits"`
	CreditsHeld amount    `json:"creditsHeld"`
	EndsAt      time.Time `json:"endsAt,omitzero"`
	EndStatus   string    `json:"endStatus,omitempty"`
	// Rev is the subscription's Revision; absent (0) in a record
	// written before it was kept, which its next put makes 1.
	Rev uint64 `json:"rev,omitempty"`
}

func toSubRecord(s store.Subscription) subRecord {
	return subRecord{UserID: s.UserID, ServiceID: s.ServiceID, ProductID: s.ProductID, Status: s.Status,
		StartedAt: s.StartedAt, UpdatedAt: s.UpdatedAt, Credits: amount(s.Credits), CreditsHeld: amount(s.CreditsHeld),
		EndsAt: s.EndsAt, EndStatus: s.EndStatus, Rev: s.Revision}
}

func (r subRecord) subscription() store.Subscription {
	return store.Subscription{UserID: r.UserID, ServiceID: r.ServiceID, ProductID: r.ProductID, Status: r.Status,
		StartedAt: r.StartedAt, UpdatedAt: r.UpdatedAt, Credits: billing.Units(r.Credits),
		CreditsHeld: billing.Units(r.CreditsHeld), EndsAt: r.EndsAt, EndStatus: r.EndStatus, Revision: r.Rev}
}

// jobRecord is a job as stored, CompletionDigest and ReservationID
// included (the API never shows them; without them a repeated completion
// could not be recognised, nor a job's hold found to settle).
type jobRecord struct {
	ID                 string    `json:"requestId"`
	UserID             string    `json:"userId"`
	KeyID              string    `json:"keyId,omitempty"`
	ServiceID          string    `json:"serviceId"`
	EndpointID         string    `json:"endpointId"`
	ProductID          string    `json:"productId,omitempty"`
	Free               bool      `json:"free,omitempty"`
	Status             string    `json:"status"`
	Stage              string    `json:"currentStage,omitempty"`
	PercentageComplete float64   `json:"percentageComplete"`
	ErrorMessage       string    `json:"errorMessage,omitempty"`
	CreatedAt          time.Time `json:"startTime"`
	UpdatedAt          time.Time `json:"updatedAt"`
	ExpiresAt          time.Time `json:"expiresAt"`
	CompletedAt        time.Time `json:"completedAt,omitzero"`
	Result             string    `json:"result,omitempty"`
	ResultSize         int       `json:"size,omitempty"`
	ResultTruncated    bool      `json:"resultTruncated,omitempty"`
	ResultURL          string    `json:"resultUrl,omitempty"`
	ContentType        string    `json:"contentType,omitempty"`
	Units              amount    `json:"units,omitempty"`
	Cost               amount    `json:"cost,omitempty"`
	CompletionDigest   string    `json:"completionDigest,omitempty"`
	ReservationID      string    `json:"reservationId,omitempty"`
	// Terms are the job's store.JobTerms; absent from the records of
	// jobs stored before they were kept, which are charged as they were
	// then (store.Job.Charge).
	Terms *jobTermsRecord `json:"terms,omitempty"`
}

// jobTermsRecord is a job's store.JobTerms as stored.
type jobTermsRecord struct {
	Product      *billing.Product `json:"product,omitempty"`
	EndpointCost amount           `json:"endpointCost"`
	// Currency is Product's, which its JSON leaves out: the cost unit
	// the completion's spend is counted in.
	Currency string `json:"currency,omitempty"`
}

func toTermsRecord(t *store.JobTerms) *jobTermsRecord {
	if t == nil {
		return nil
	}
	r := &jobTermsRecord{Product: t.Product, EndpointCost: amount(t.EndpointCost)}
	if t.Product != nil {
		r.Currency = t.Product.Currency
	}
	return r
}

func (r *jobTermsRecord) terms() *store.JobTerms {
	if r == nil {
		return nil
	}
	t := &store.JobTerms{Product: r.Product, EndpointCost: billing.Units(r.EndpointCost)}
	if r.Product != nil && r.Currency != "" {
		p := *r.Product
		p.Currency = r.Currency
		t.Product = &p
	}
	return t
}

func toJobRecord(j store.Job) jobRecord {
	return jobRecord{ID: j.ID, UserID: j.UserID, KeyID: j.KeyID, ServiceID: j.ServiceID, EndpointID: j.EndpointID,
		ProductID: j.ProductID, Free: j.Free, Status: j.Status, Stage: j.Stage,
		PercentageComplete: j.PercentageComplete, ErrorMessage: j.ErrorMessage, CreatedAt: j.CreatedAt,
		UpdatedAt: j.UpdatedAt, ExpiresAt: j.ExpiresAt, CompletedAt: j.CompletedAt, Result: j.Result,
		ResultSize: j.ResultSize, ResultTruncated: j.ResultTruncated, ResultURL: j.ResultURL,
		ContentType: j.ContentType, Units: amount(j.Units), Cost: amount(j.Cost),
		CompletionDigest: j.CompletionDigest, ReservationID: j.ReservationID, Terms: toTermsRecord(j.Terms)}
}

func (r jobRecord) job() store.Job {
	return store.Job{ID: r.ID, UserID: r.UserID, KeyID: r.KeyID, ServiceID: r.ServiceID, EndpointID: r.EndpointID,
		ProductID: r.ProductID, Free: r.Free, Status: r.Status, Stage: r.Stage,
		PercentageComplete: r.PercentageComplete, ErrorMessage: r.ErrorMessage, CreatedAt: r.CreatedAt,
		UpdatedAt: r.UpdatedAt, ExpiresAt: r.ExpiresAt, CompletedAt: r.CompletedAt, Result: r.Result,
		ResultSize: r.ResultSize, ResultTruncated: r.ResultTruncated, ResultURL: r.ResultURL,
		ContentType: r.ContentType, Units: billing.Units(r.Units), Cost: billing.Units(r.Cost),
		CompletionDigest: r.CompletionDigest, ReservationID: r.ReservationID, Terms: r.Terms.terms()}
}

// decisionRecord is the decision of a stored reservation.
type decisionRecord struct {
	billing.Decision
	Units   amount
	Overage amount
	Cost    amount
}

func toDecisionRecord(d billing.Decision) decisionRecord {
	return decisionRecord{Decision: d, Units: amount(d.Units), Overage: amount(d.Overage), Cost: amount(d.Cost)}
}

func (r decisionRecord) decision() billing.Decision {
	d := r.Decision
	d.Units, d.Overage, d.Cost = billing.Units(r.Units), billing.Units(r.Overage), billing.Units(r.Cost)
	return d
}
