package store

import (
	"context"
	"errors"
)

// Views pages through what an operator looks at: a user's subscriptions
// and the async jobs by user, service and state. Each call reads a bounded
// part of the store, so a listing of any size is fetched page by page,
// following the returned cursor, without a long read transaction.
type Views interface {
	// ListSubscriptions returns up to limit subscriptions of userID (of
	// every user when it is empty) in (user, service) order, starting
	// after cursor ("" for the first page), and the cursor of the next
	// page, "" when there is none. A cursor that this method did not
	// return for the same userID is ErrBadCursor.
	ListSubscriptions(ctx context.Context, userID, cursor string, limit int) ([]Subscription, string, error)
	// ListJobs returns up to limit jobs matching f in job id order,
	// starting after cursor, and the cursor of the next page ("" at the
	// end). It examines at most JobScanBudget stored jobs per call, so a
	// page may hold fewer than limit jobs, even none, and still have a
	// next cursor: the listing goes on from there.
	ListJobs(ctx context.Context, f JobFilter, cursor string, limit int) ([]Job, string, error)
}

// JobFilter narrows a job listing; empty fields match every job.
type JobFilter struct {
	UserID    string
	ServiceID string
	Status    string // PENDING, RUNNING, COMPLETED or FAILED
}

// Matches reports whether j passes the filter.
func (f JobFilter) Matches(j Job) bool {
	return (f.UserID == "" || j.UserID == f.UserID) &&
		(f.ServiceID == "" || j.ServiceID == f.ServiceID) &&
		(f.Status == "" || j.Status == f.Status)
}

// JobScanBudget bounds the stored jobs one ListJobs call examines.
const JobScanBudget = 10000

// ErrBadCursor is returned for a paging cursor that is malformed or
// belongs to another listing.
var ErrBadCursor = errors.New("bad cursor")
