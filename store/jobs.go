package store

import (
	"context"
	"time"

	"github.com/platformgw/gateway/billing"
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
}

// Terminal reports whether the job's state can no longer change.
func (j Job) Terminal() bool { return j.Status == JobCompleted || j.Status == JobFailed }

// Jobs stores async jobs.
type Jobs interface {
	CreateJob(ctx context.Context, j Job) error
	GetJob(ctx context.Context, id string) (Job, error)
	// UpdateJob runs fn on the stored job in a write transaction and stores
	// the result unless fn returns an error, which is returned as is.
	UpdateJob(ctx context.Context, id string, fn func(*Job) error) (Job, error)
	// CompleteJob runs fn on the stored job and, unless fn returns an error,
	// stores it and charges e (when e.Units > 0) to a in the same
	// transaction, so a completion's units are metered exactly once.
	CompleteJob(ctx context.Context, id string, a Account, e LedgerEntry, fn func(*Job) error) (Job, error)
	// ExpireJobs fails every unfinished job whose ExpiresAt is before now,
	// returning how many it failed.
	ExpireJobs(ctx context.Context, now time.Time, message string) (int, error)
}
