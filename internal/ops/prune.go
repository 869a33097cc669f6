package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/store"
)

// Removing billing data: raw ledger rows older than a time (an operator's
// prune, or ledger_retention) and hourly rollups (rollup_retention), each
// audited like every other change of it. Pruning is an optional store
// interface (internal/store/ledger_api.go), kept by both stores.

// ErrNotSupported is a store that cannot do what was asked (prune its
// ledger); the admin API answers it 501 not_supported.
var ErrNotSupported = errors.New("not supported by this store")

// PruneLedger removes the raw ledger rows older than before, in whole
// segments, and answers what went. Rollups stay. The rows are gone even
// when the audit entry fails, which is then the error.
func (o *Ops) PruneLedger(ctx context.Context, actor string, before time.Time) (store.PruneResult, error) {
	if before.After(o.rt.Now()) {
		return store.PruneResult{}, apierror.Invalid("before", "before is in the future: pruning would remove rows still being written")
	}
	p, ok := o.rt.Store().(store.LedgerPruner)
	if !ok {
		return store.PruneResult{}, ErrNotSupported
	}
	res, err := p.PruneLedger(ctx, before)
	switch {
	case errors.Is(err, store.ErrBadCutoff):
		return store.PruneResult{}, apierror.Invalid("before", "before must be a time in the past")
	case errors.Is(err, store.ErrUnavailable):
		return store.PruneResult{}, apierror.New(apierror.StoreUnavailable, "the ledger could not be pruned right now (nothing was removed); try again")
	case err != nil:
		return store.PruneResult{}, fmt.Errorf("prune ledger: %w", err)
	}
	o.rt.Logger.Info("ledger pruned", zap.Time("before", before), zap.Int("segments", res.Segments),
		zap.Int64("rows", res.Rows), zap.Int64("bytes", res.Bytes))
	// Billing data went: audited like every other change of it. The rows
	// are gone either way; a failed entry is answered as an error.
	if err := o.RecordAudit(ctx, pruneAuditEntry(actor, before, res)); err != nil {
		return res, err
	}
	return res, nil
}

// pruneAuditEntry is the audit entry of a ledger prune.
func pruneAuditEntry(actor string, before time.Time, res store.PruneResult) store.AuditEntry {
	return store.AuditEntry{Actor: actor, Action: AuditUsagePrune,
		Detail: fmt.Sprintf("raw ledger rows before %s: %d segments, %d rows, %d bytes removed",
			before.UTC().Format(time.RFC3339), res.Segments, res.Rows, res.Bytes)}
}

// ApplyRetention prunes the raw ledger rows older than ledger before t and
// the hourly rollups older than rollups (either 0: kept), where the store
// can; what goes is logged and audited, a failure logged.
func (o *Ops) ApplyRetention(ctx context.Context, t time.Time, ledger, rollups time.Duration) {
	logger := o.rt.Logger
	if ledger > 0 {
		if p, ok := o.rt.Store().(store.LedgerPruner); ok {
			if res, err := p.PruneLedger(ctx, t.Add(-ledger)); err != nil {
				logger.Error("pruning the ledger (ledger_retention)", zap.Error(err))
			} else if res.Segments > 0 {
				logger.Info("ledger pruned (ledger_retention)", zap.Int("segments", res.Segments),
					zap.Int64("rows", res.Rows), zap.Int64("bytes", res.Bytes))
				_ = o.RecordAudit(ctx, pruneAuditEntry("ledger_retention", t.Add(-ledger), res)) // a failure is logged there
			}
		}
	}
	if rollups > 0 {
		if p, ok := o.rt.Store().(store.RollupPruner); ok {
			if n, err := p.PruneRollups(ctx, t.Add(-rollups)); err != nil {
				logger.Error("pruning hourly rollups (rollup_retention)", zap.Error(err))
			} else if n > 0 {
				logger.Info("hourly rollups pruned (rollup_retention)", zap.Int("rollups", n))
				_ = o.RecordAudit(ctx, store.AuditEntry{Actor: "rollup_retention", Action: AuditRollupPrune,
					Detail: fmt.Sprintf("hourly rollups before %s: %d removed", t.Add(-rollups).UTC().Format(time.RFC3339), n)})
			}
		}
		// The call outcomes are hourly sums too, kept as long as rollups.
		if p, ok := o.rt.Store().(store.Outcomes); ok {
			if n, err := p.PruneOutcomes(ctx, t.Add(-rollups)); err != nil {
				logger.Error("pruning hourly call outcomes (rollup_retention)", zap.Error(err))
			} else if n > 0 {
				logger.Info("hourly call outcomes pruned (rollup_retention)", zap.Int("rows", n))
				_ = o.RecordAudit(ctx, store.AuditEntry{Actor: "rollup_retention", Action: AuditRollupPrune,
					Detail: fmt.Sprintf("hourly call outcomes before %s: %d rows removed", t.Add(-rollups).UTC().Format(time.RFC3339), n)})
			}
		}
	}
}
