package store

import (
	"cmp"
	"context"
	"errors"
	"time"
)

// Call outcomes: every call that reaches the gateway's invoke routes,
// charged or not, counted per UTC hour, user, service, endpoint, product
// and outcome, with histograms of the time the gateway added and of the
// backend's. The ledger says what was charged; outcomes say what happened,
// refusals and failures included. A process counts in memory and adds its
// counts to the store in batches (internal/engine/outcomes.go); a batch is
// applied once, however often it is sent.

// Outcomes of a call that are not an error code: the class of the status a
// backend answered with, and a call whose answer was cut off (the backend
// ended its body early, or the caller hung up) after its status line. Any
// other outcome is the JSON error code the gateway answered with
// (docs/wire-contract.md), such as "rate_limited" or "service_error".
const (
	Outcome1xx    = "1xx" // a protocol switch (Upgrade)
	Outcome2xx    = "2xx"
	Outcome3xx    = "3xx"
	Outcome4xx    = "4xx" // the backend's own 4xx: charged like a 2xx
	Outcome5xx    = "5xx" // the backend's 5xx: not charged
	OutcomeCutOff = "cut_off"
)

// LatencyBuckets is the number of buckets of a latency histogram:
// len(LatencyBounds) bounded ones and the last, which holds the rest.
const LatencyBuckets = 18

// LatencyBounds are the inclusive upper bounds of a histogram's buckets
// but the last, in microseconds, the same for the gateway's and the
// backend's time so the two can be compared bucket by bucket.
var LatencyBounds = [LatencyBuckets - 1]int64{
	50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000,
	100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
}

// LatencyBucket is the bucket of LatencyBounds a time of us microseconds
// falls in.
func LatencyBucket(us int64) int {
	// A handful of comparisons; most calls end in the first few buckets.
	for i, b := range LatencyBounds {
		if us <= b {
			return i
		}
	}
	return LatencyBuckets - 1
}

// Latency is a histogram of times: how many fell in each bucket of
// LatencyBounds, and their sum in microseconds (for the mean).
type Latency struct {
	Buckets   [LatencyBuckets]int64 `json:"buckets"`
	SumMicros int64                 `json:"sumMicros"`
}

// Add adds o's counts to l.
func (l *Latency) Add(o Latency) {
	for i, n := range o.Buckets {
		l.Buckets[i] += n
	}
	l.SumMicros += o.SumMicros
}

// OutcomeKey names the counts of one hour, call dimension and outcome. A
// dimension the call never got to is empty: the user of a call refused
// for its key, the product of a service owner's call, the service and
// endpoint of a path the catalog does not know.
type OutcomeKey struct {
	Hour       time.Time `json:"hour"`
	UserID     string    `json:"userId"`
	ServiceID  string    `json:"serviceId"`
	EndpointID string    `json:"endpointId"`
	ProductID  string    `json:"productId"`
	Outcome    string    `json:"outcome"`
}

// CompareOutcomeKeys orders keys as ScanOutcomes returns them: by hour,
// user, service, endpoint, product, outcome.
func CompareOutcomeKeys(a, b OutcomeKey) int {
	return cmp.Or(a.Hour.Compare(b.Hour), cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.ServiceID, b.ServiceID),
		cmp.Compare(a.EndpointID, b.EndpointID), cmp.Compare(a.ProductID, b.ProductID), cmp.Compare(a.Outcome, b.Outcome))
}

// OutcomeRow is the calls of one key: how many, the time the gateway
// added to them (everything but the backend) and the backend's time (zero
// for a call that never reached it).
type OutcomeRow struct {
	OutcomeKey
	Calls   int64   `json:"calls"`
	Gateway Latency `json:"gateway"`
	Backend Latency `json:"backend"`
}

// Add adds o's counts to r (the keys are the caller's business).
func (r *OutcomeRow) Add(o OutcomeRow) {
	r.Calls += o.Calls
	r.Gateway.Add(o.Gateway)
	r.Backend.Add(o.Backend)
}

// OutcomeBatch is what one counting process adds to the store at once.
// Writer names the process's counter (random, new at each start) and Seq
// numbers its batches from 1; the store keeps the highest Seq it applied
// per Writer with the rows, in the same transaction, so a batch sent
// again after a lost answer is not counted twice.
type OutcomeBatch struct {
	Writer string
	Seq    uint64
	Rows   []OutcomeRow
}

// OutcomeFilter narrows an outcome scan: empty fields match every row;
// From <= Hour < To, zero bounds open.
type OutcomeFilter struct {
	UserID    string
	ServiceID string
	Outcome   string
	From, To  time.Time
}

// Match says whether f selects k.
func (f OutcomeFilter) Match(k OutcomeKey) bool {
	return (f.UserID == "" || k.UserID == f.UserID) && (f.ServiceID == "" || k.ServiceID == f.ServiceID) &&
		(f.Outcome == "" || k.Outcome == f.Outcome) &&
		(f.From.IsZero() || !k.Hour.Before(f.From)) && (f.To.IsZero() || k.Hour.Before(f.To))
}

// ErrBadOutcomeBatch refuses a batch without a writer or a sequence number,
// or with a row that has no hour or no outcome. Nothing is added.
var ErrBadOutcomeBatch = errors.New("bad outcome batch")

// CheckOutcomeBatch is the one rule of what a store accepts in AddOutcomes.
func CheckOutcomeBatch(b OutcomeBatch) error {
	if b.Writer == "" || b.Seq == 0 {
		return ErrBadOutcomeBatch
	}
	for _, r := range b.Rows {
		if r.Hour.IsZero() || r.Outcome == "" || !r.Hour.Equal(r.Hour.Truncate(time.Hour)) {
			return ErrBadOutcomeBatch
		}
	}
	return nil
}

// Outcomes keeps the hourly call outcomes. Both stores implement it; a
// store without it records no outcomes and its readers answer "not
// supported by this store".
type Outcomes interface {
	// AddOutcomes adds the batch's rows to the hours they name, unless a
	// batch of the same Writer with this Seq or a higher one was applied
	// before (then it answers false and adds nothing). A PostgreSQL store
	// keeps the rows per node and sums the nodes when read.
	AddOutcomes(ctx context.Context, b OutcomeBatch) (applied bool, err error)
	// ScanOutcomes calls fn with the sums of the rows f selects, every
	// node's added up, in CompareOutcomeKeys order, stopping at fn's first
	// error.
	ScanOutcomes(ctx context.Context, f OutcomeFilter, fn func(OutcomeRow) error) error
	// PruneOutcomes forgets the rows of hours before the hour before falls
	// in, as PruneRollups does (rollup_retention), and the writers whose
	// last batch is older than before. A zero or future before is
	// ErrBadCutoff.
	PruneOutcomes(ctx context.Context, before time.Time) (int, error)
}
