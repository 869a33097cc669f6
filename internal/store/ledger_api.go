package store

import (
	"context"
	"errors"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// The interfaces below are optional: a store implements them when it keeps
// the ledger in a form that can answer them cheaply (the segmented ledger of
// internal/store/ledger does). Callers find them with a type assertion and answer
// "not supported by this store" otherwise, so a store without them (the
// PostgreSQL store, until it has them) still serves everything else.

// Rollup sums the ledger rows of one subscription (user, service), endpoint
// and product in one UTC hour. Rollups are kept by the ledger as rows are
// appended, so they equal the sum of the raw rows they cover, and they
// outlive the raw rows when those are pruned.
type Rollup struct {
	UserID     string    `json:"userId"`
	ServiceID  string    `json:"serviceId"`
	EndpointID string    `json:"endpointId,omitempty"`
	ProductID  string    `json:"productId,omitempty"`
	Hour       time.Time `json:"hour"`
	// Calls is the number of ledger rows (calls, reports, job completions).
	Calls int64 `json:"calls"`
	// Units, Overage and Cost are the sums of the rows' fields.
	Units   billing.Units `json:"units"`
	Overage billing.Units `json:"overage,omitempty"`
	Cost    billing.Units `json:"cost,omitempty"`
	// Capped counts the rows a hard limit cut short: the backend claimed
	// more units (UnitsClaimed) than the row charges. A failed call that
	// was charged nothing writes no row at all, so the ledger cannot count
	// failures; Capped is the error a ledger row can show.
	Capped int64 `json:"capped,omitempty"`
}

// RollupFilter narrows a rollup scan: empty fields match every rollup;
// From <= Hour < To, zero bounds open.
type RollupFilter struct {
	UserID    string
	ServiceID string
	From, To  time.Time
}

// RollupReader reads the hourly rollups of the ledger.
type RollupReader interface {
	// ScanRollups calls fn for each matching rollup in (hour, user,
	// service, endpoint, product) order, stopping at fn's first error.
	ScanRollups(ctx context.Context, f RollupFilter, fn func(Rollup) error) error
}

// ErrBadCutoff refuses a prune cutoff that is zero or in the future (a
// prune would remove rows still being written). Nothing is removed.
var ErrBadCutoff = errors.New("bad prune cutoff: it must be a time in the past")

// PruneResult says what a prune of the ledger removed.
type PruneResult struct {
	Before   time.Time `json:"before"`
	Segments int       `json:"segments"`
	Rows     int64     `json:"rows"`
	Bytes    int64     `json:"bytes"`
}

// LedgerPruner removes old raw ledger rows. Rows go in whole segments:
// only a segment whose newest row is older than before is removed, so a
// few rows older than before may stay until their segment's turn (the
// PostgreSQL store drops whole monthly partitions: see docs/fleet.md). The
// hourly rollups stay (see RollupReader). A zero or future before is
// ErrBadCutoff.
//
// The audit entries, when given, are the prune's (store.Audit): the store
// completes each one's Detail with what it removes (WithPruned) and
// writes it with the removal, so that no rows go without an entry. In
// PostgreSQL each monthly partition is dropped in a transaction of its
// own, which writes the entries for that partition: the drop and its
// entries commit together or not at all. In boltstore the segment files
// are not in the bbolt file: the entries (for every segment that goes) are
// committed to it after the rollups are saved and before the first file
// goes, so a crash between the two leaves entries for rows still there,
// which the next prune removes (with entries of its own), never rows gone
// without one. An entry that cannot be written removes nothing (in
// PostgreSQL, nothing more) and is the error. A prune that removes
// nothing writes no entry.
type LedgerPruner interface {
	PruneLedger(ctx context.Context, before time.Time, audit ...AuditEntry) (PruneResult, error)
}

// RollupPruner forgets hourly rollups of hours before before (the
// rollup_retention option); by default rollups are kept for ever. A zero or
// future before is ErrBadCutoff.
type RollupPruner interface {
	PruneRollups(ctx context.Context, before time.Time) (int, error)
}
