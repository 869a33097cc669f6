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
// segments, and answers what went. Rollups stay. The store writes the
// audit entry with the removal (store.LedgerPruner): no rows go without
// it, and an entry that cannot be written removes nothing. A prune that
// removes nothing is audited too, as only an entry.
func (o *Ops) PruneLedger(ctx context.Context, actor string, before time.Time) (store.PruneResult, error) {
	if before.After(o.rt.Now()) {
		return store.PruneResult{}, apierror.Invalid("before", "before is in the future: pruning would remove rows still being written")
	}
	p, ok := o.rt.Store().(store.LedgerPruner)
	if !ok {
		return store.PruneResult{}, ErrNotSupported
	}
	res, err := p.PruneLedger(ctx, before, pruneAuditEntry(o.rt.Now(), actor, before))
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
	if res.Segments == 0 {
		// Nothing went, so the store wrote no entry: the operator's
		// prune is in the log all the same.
		if err := o.RecordAudit(ctx, store.WithPruned([]store.AuditEntry{pruneAuditEntry(o.rt.Now(), actor, before)}, res)[0]); err != nil {
			return res, err
		}
	}
	return res, nil
}

// pruneAuditEntry is the audit entry of a ledger prune, which the store
// completes with what it removes (store.WithPruned).
func pruneAuditEntry(now time.Time, actor string, before time.Time) store.AuditEntry {
	return store.AuditEntry{Time: now.UTC(), Actor: actor, Action: AuditUsagePrune,
		Detail: "raw ledger rows before " + before.UTC().Format(time.RFC3339)}
}

// ApplyRetention prunes the raw ledger rows older than ledger before t and
// the hourly rollups older than rollups (either 0: kept), where the store
// can; what goes is logged and audited, a failure logged.
func (o *Ops) ApplyRetention(ctx context.Context, t time.Time, ledger, rollups time.Duration) {
	logger := o.rt.Logger
	if ledger > 0 {
		if p, ok := o.rt.Store().(store.LedgerPruner); ok {
			// The store writes the entry with the removal.
			if res, err := p.PruneLedger(ctx, t.Add(-ledger), pruneAuditEntry(o.rt.Now(), "ledger_retention", t.Add(-ledger))); err != nil {
				logger.Error("pruning the ledger (ledger_retention)", zap.Error(err))
			} else if res.Segments > 0 {
				logger.Info("ledger pruned (ledger_retention)", zap.Int("segments", res.Segments),
					zap.Int64("rows", res.Rows), zap.Int64("bytes", res.Bytes))
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
