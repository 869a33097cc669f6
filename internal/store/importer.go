package store

import (
	"context"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// Counter is one subscription's settled usage in one billing period, as a
// store moving to another engine hands it over. What calls in flight hold
// is not part of it: a store is moved while no gateway serves it, and the
// holds of open jobs travel with their jobs (JobHold).
type Counter struct {
	UserID    string
	ServiceID string
	// PeriodKey is the start of the billing period, Unix seconds (as in
	// Reservation).
	PeriodKey int64
	Used      billing.Units
	// Spend is the spend in SpendUnit, or, when UnitKnown is false (a
	// counter from before spend was kept per cost unit), in the unit of
	// the first product that charges it; SpendOther the spend in each
	// other cost unit (billing.Product.CostUnit).
	Spend      billing.Units
	SpendUnit  string
	UnitKnown  bool
	SpendOther map[string]billing.Units
}

// SpendTotal is the counter's spend in every cost unit together: what
// its ledger rows' costs sum to.
func (c Counter) SpendTotal() billing.Units {
	t := c.Spend
	for _, v := range c.SpendOther {
		t += v
	}
	return t
}

// JobHold is the hold of an open async job (CreateJobReserved), moved
// with the job so that its completion settles against it on the new store
// and its expiry gives it back.
type JobHold struct {
	JobID     string
	UserID    string
	ServiceID string
	Product   billing.Product
	Decision  billing.Decision
	PeriodKey int64
}

// IdempotencyClaim is a claimed Idempotency-Key of a usage report with the
// response its first call got.
type IdempotencyClaim struct {
	ServiceID string
	Key       string
	Created   time.Time
	Response  []byte
}

// Totals sums a store's contents, to check a move lost nothing: the same
// figures read from the source and from the target must be equal.
type Totals struct {
	Keys          int
	Subscriptions int
	Credits       billing.Units // sum of the subscriptions' balances
	Counters      int
	Used          billing.Units // sum of the counters' settled units
	Spend         billing.Units
	Ledger        int
	LedgerUnits   billing.Units
	LedgerCost    billing.Units
	// RollupCalls and RollupUnits sum the hourly rollups, which outlive
	// pruned rows.
	RollupCalls int64
	RollupUnits billing.Units
	Jobs        int
	JobHolds    int
	Idempotency int
	Alerts      int
	Audit       int
	// The payments data (PaymentsImporter).
	PaymentRecords  int
	CreditGrants    int
	CreditReversals int
	Leases          int
}

// Importer is a store that can take another store's contents whole
// (`caddy platform store migrate`). Every record is stored as given: ids,
// sequence numbers, times, balances and the hashes of keys are kept. The
// methods are called with batches, in the order they are listed, into a
// store that was Empty, with no gateway serving it.
type Importer interface {
	// Empty reports whether the store holds nothing at all yet.
	Empty(ctx context.Context) (bool, error)
	// BeginImport notes, before anything is copied, that an import of
	// from begins, and FinishImport, once both sides agree, that it is
	// whole: until then the store refuses to be opened by a gateway.
	BeginImport(ctx context.Context, from string) error
	FinishImport(ctx context.Context) error
	ImportKeys(ctx context.Context, ks []KeyRecord) error
	// ImportSubscriptions stores subscriptions with their StartedAt and
	// Credits as given (CreditsHeld follows from the job holds).
	ImportSubscriptions(ctx context.Context, subs []Subscription) error
	ImportCounters(ctx context.Context, cs []Counter) error
	// ImportLedger appends entries keeping their ID, Seq and Time; later
	// entries of the store number after the highest Seq imported.
	ImportLedger(ctx context.Context, es []LedgerEntry) error
	// ImportLedgerHistory takes what a pruned ledger keeps beyond its
	// rows: the hourly rollups of rows no longer there (added to the
	// rollups the store made of the rows ImportLedger took), and the
	// highest sequence number ever handed out, after which the store
	// numbers its next entries (ledger ids are never given twice). Called
	// after ImportLedger, in batches of rollups, each with lastSeq.
	ImportLedgerHistory(ctx context.Context, pruned []Rollup, lastSeq uint64) error
	// ImportJobs stores jobs as given and takes the holds of the open
	// ones (each hold names its job).
	ImportJobs(ctx context.Context, js []Job, holds []JobHold) error
	ImportIdempotency(ctx context.Context, cs []IdempotencyClaim) error
	// ImportAlerts keeps the alerts' ids; later alerts get fresh ones.
	ImportAlerts(ctx context.Context, as []Alert) error
	// ImportAudit keeps the entries' Seq; later entries number after.
	ImportAudit(ctx context.Context, es []AuditEntry) error
	// Totals sums what the store holds.
	Totals(ctx context.Context) (Totals, error)
}

// PaymentsImporter is an Importer that takes the payments data
// (store.Payments) too, after the audit log. An export of a store that
// holds any is refused by a target without it.
type PaymentsImporter interface {
	ImportPaymentRecords(ctx context.Context, rs []PaymentRecord) error
	// ImportCreditGrants stores grants as given (Reversed, Expired,
	// ExpiredLater and ExpiredAt included); the balances came with the
	// subscriptions. A deferred expiry's link to the holds it waits for
	// does not come along: what is still Deferred counts as spent.
	ImportCreditGrants(ctx context.Context, gs []CreditGrant) error
	// ImportCreditReversals keeps the reversals' ids, so a refund
	// delivered again after the move is still a replay; Credits is what
	// each took.
	ImportCreditReversals(ctx context.Context, rs []CreditReversal) error
	// ImportLeases keeps each lease's holder, epoch, expiry and cursor.
	ImportLeases(ctx context.Context, ls []Lease) error
}

// Exporter is a store that can hand its whole contents to an Importer,
// batch by batch, and sum what it handed over.
type Exporter interface {
	Export(ctx context.Context, to Importer, batch int) (Totals, error)
}
