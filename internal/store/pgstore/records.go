package pgstore

import (
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The rec columns' own types: what a row's jsonb holds, field by field,
// with the names rows have always had. They do not embed the store
// package's types, so a tag changed on a store type (which the bbolt
// store does not read either) changes no row, and the statements that
// read rec (rec->>'status', rec->'holdKey') and operators' own queries
// keep finding their keys. A field added to a store type is stored only
// once it is added here. records_test.go reads rows written by the
// earlier encoding (the store types' own tags) back through these types.

// keyRecord is a service key's rec; its hash, id and user are columns too.
type keyRecord struct {
	ID        string    `json:"keyId"`
	UserID    string    `json:"userId"`
	Roles     []string  `json:"roles,omitempty"`
	Label     string    `json:"label,omitempty"`
	Created   time.Time `json:"createdAt"`
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	RevokedAt time.Time `json:"revokedAt,omitzero"`
	// Added later: absent from older rows, which read back as keys an
	// operator made.
	ParentKeyID    string `json:"parentKeyId,omitempty"`
	EndsWithParent bool   `json:"endsWithParent,omitempty"`
}

func toKeyRecord(k store.KeyRecord) keyRecord {
	return keyRecord{ID: k.ID, UserID: k.UserID, Roles: k.Roles, Label: k.Label, Created: k.Created,
		ExpiresAt: k.ExpiresAt, RevokedAt: k.RevokedAt, ParentKeyID: k.ParentKeyID, EndsWithParent: k.EndsWithParent}
}

// key is the record without its hash, which the caller sets from the
// hash column.
func (r keyRecord) key() store.KeyRecord {
	return store.KeyRecord{ID: r.ID, UserID: r.UserID, Roles: r.Roles, Label: r.Label, Created: r.Created,
		ExpiresAt: r.ExpiresAt, RevokedAt: r.RevokedAt, ParentKeyID: r.ParentKeyID, EndsWithParent: r.EndsWithParent}
}

// subRecord is a subscription's rec. The balance lives in the credits and
// credits_held columns, which the lease and settlement statements update;
// rec has always carried both at 0 and still does, so rows keep one shape.
type subRecord struct {
	UserID      string       `json:"userId"`
	ServiceID   string       `json:"serviceId"`
	ProductID   string       `json:"productId"`
	Status      string       `json:"status"`
	StartedAt   time.Time    `json:"startedAt"`
	UpdatedAt   time.Time    `json:"updatedAt"` // AddCredits sets it in place (jsonb_set)
	Credits     store.Amount `json:"credits"`
	CreditsHeld store.Amount `json:"creditsHeld"`
	// The end lives in rec only: nothing queries it by column, so rows
	// written before it need no migration.
	EndsAt    time.Time `json:"endsAt,omitzero"`
	EndStatus string    `json:"endStatus,omitempty"`
	// Rev is the subscription's Revision; absent (0) in a record
	// written before it was kept, which its next put makes 1.
	Rev uint64 `json:"rev,omitempty"`
}

func toSubRecord(s store.Subscription) subRecord {
	return subRecord{UserID: s.UserID, ServiceID: s.ServiceID, ProductID: s.ProductID, Status: s.Status,
		StartedAt: s.StartedAt, UpdatedAt: s.UpdatedAt, EndsAt: s.EndsAt, EndStatus: s.EndStatus, Rev: s.Revision}
}

// subscription is the record with its balance from the columns.
func (r subRecord) subscription(credits, held billing.Units) store.Subscription {
	return store.Subscription{UserID: r.UserID, ServiceID: r.ServiceID, ProductID: r.ProductID, Status: r.Status,
		StartedAt: r.StartedAt, UpdatedAt: r.UpdatedAt, Credits: credits, CreditsHeld: held,
		EndsAt: r.EndsAt, EndStatus: r.EndStatus, Revision: r.Rev}
}

// jobRecord is a job's rec, with what the API never shows
// (CompletionDigest, ReservationID) and the allowance its hold (a lease
// held by the job) was taken on. ListJobs filters on userId, serviceId
// and status; the open-holds check reads holdKey.
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
	// Units and Cost as stored (store.Amount), so that a cost past
	// billing.MaxUnits (one that saturated) reads back.
	Units       store.Amount  `json:"units,omitempty"`
	Cost        store.Amount  `json:"cost,omitempty"`
	Digest      string        `json:"completionDigest,omitempty"`
	Reservation string        `json:"reservationId,omitempty"`
	HoldKey     *AllowanceKey `json:"holdKey,omitempty"`
	// Terms are the job's store.JobTerms; absent from the records of
	// jobs stored before they were kept, which are charged as they were
	// then (store.Job.Charge).
	Terms *jobTermsRecord `json:"terms,omitempty"`
}

// jobTermsRecord is a job's store.JobTerms as stored.
type jobTermsRecord struct {
	Product      *billing.Product `json:"product,omitempty"`
	EndpointCost store.Amount     `json:"endpointCost"`
	// Currency is Product's, which its JSON leaves out: the cost unit
	// the completion's spend is counted in.
	Currency string `json:"currency,omitempty"`
}

func toTermsRecord(t *store.JobTerms) *jobTermsRecord {
	if t == nil {
		return nil
	}
	r := &jobTermsRecord{Product: t.Product, EndpointCost: store.Amount(t.EndpointCost)}
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

func toJobRecord(j store.Job, hold *AllowanceKey) jobRecord {
	return jobRecord{ID: j.ID, UserID: j.UserID, KeyID: j.KeyID, ServiceID: j.ServiceID, EndpointID: j.EndpointID,
		ProductID: j.ProductID, Free: j.Free, Status: j.Status, Stage: j.Stage,
		PercentageComplete: j.PercentageComplete, ErrorMessage: j.ErrorMessage, CreatedAt: j.CreatedAt,
		UpdatedAt: j.UpdatedAt, ExpiresAt: j.ExpiresAt, CompletedAt: j.CompletedAt, Result: j.Result,
		ResultSize: j.ResultSize, ResultTruncated: j.ResultTruncated, ResultURL: j.ResultURL,
		ContentType: j.ContentType, Units: store.Amount(j.Units), Cost: store.Amount(j.Cost),
		Digest: j.CompletionDigest, Reservation: j.ReservationID, HoldKey: hold, Terms: toTermsRecord(j.Terms)}
}

func (r jobRecord) job() store.Job {
	return store.Job{ID: r.ID, UserID: r.UserID, KeyID: r.KeyID, ServiceID: r.ServiceID, EndpointID: r.EndpointID,
		ProductID: r.ProductID, Free: r.Free, Status: r.Status, Stage: r.Stage,
		PercentageComplete: r.PercentageComplete, ErrorMessage: r.ErrorMessage, CreatedAt: r.CreatedAt,
		UpdatedAt: r.UpdatedAt, ExpiresAt: r.ExpiresAt, CompletedAt: r.CompletedAt, Result: r.Result,
		ResultSize: r.ResultSize, ResultTruncated: r.ResultTruncated, ResultURL: r.ResultURL,
		ContentType: r.ContentType, Units: billing.Units(r.Units), Cost: billing.Units(r.Cost),
		CompletionDigest: r.Digest, ReservationID: r.Reservation, Terms: r.Terms.terms()}
}
