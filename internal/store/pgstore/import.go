package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The import path of `caddy platform store migrate`: a whole store (a
// bbolt file's contents) written into an empty database, every record as
// it was (ids, sequence numbers, times, balances, key hashes), in batches
// of one transaction and one round trip each.

var _ store.Importer = (*Store)(nil)

// Empty reports whether the database holds nothing a gateway wrote.
func (s *Store) Empty(ctx context.Context) (bool, error) {
	var found bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM keys) OR EXISTS (SELECT 1 FROM subscriptions)
		OR EXISTS (SELECT 1 FROM allowances) OR EXISTS (SELECT 1 FROM ledger) OR EXISTS (SELECT 1 FROM jobs)
		OR EXISTS (SELECT 1 FROM idempotency) OR EXISTS (SELECT 1 FROM alerts) OR EXISTS (SELECT 1 FROM audit)
		OR EXISTS (SELECT 1 FROM payment_records) OR EXISTS (SELECT 1 FROM credit_grants)
		OR EXISTS (SELECT 1 FROM credit_reversals) OR EXISTS (SELECT 1 FROM payment_leases)`).Scan(&found)
	return !found, s.fail(err)
}

// importMarker is the table whose presence says that a `store migrate`
// into the database began and has not finished: the database holds part
// of a store, and no node may serve it (unfinishedImport). BeginImport
// makes it before the first record is copied, FinishImport drops it once
// both sides' totals agree.
const importMarker = "platform_import_unfinished"

// BeginImport notes that an import begins (store.Importer).
func (s *Store) BeginImport(ctx context.Context, from string) error {
	return s.fail(s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE TABLE "+importMarker+" (started_at timestamptz NOT NULL DEFAULT now(), source text NOT NULL)"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+importMarker+" (source) VALUES ($1)", from)
		return err
	}))
}

// FinishImport notes that the import is whole (store.Importer).
func (s *Store) FinishImport(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, "DROP TABLE IF EXISTS "+importMarker)
	return s.fail(err)
}

// unfinishedImport is the refusal of a database holding an import that
// did not finish; nil when there is none.
func unfinishedImport(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", importMarker).Scan(&exists); err != nil {
		return fmt.Errorf("pgstore: look for an unfinished store migration: %w", err)
	}
	if !exists {
		return nil
	}
	var at time.Time
	var from string
	if err := q.QueryRow(ctx, "SELECT started_at, source FROM "+importMarker+" ORDER BY started_at LIMIT 1").Scan(&at, &from); err != nil {
		at, from = time.Time{}, "a bbolt file"
	}
	return fmt.Errorf("pgstore: the store migration into this database (caddy platform store migrate of %s, begun %s) did not finish: "+
		"the database holds part of that store, and serving it would lose what was not copied; drop and create the database "+
		"and run the migration again (docs/fleet.md, Migrating a bbolt store)", from, at.UTC().Format(time.RFC3339))
}

// importBatch sends the queued statements in one transaction.
func (s *Store) importBatch(ctx context.Context, b *pgx.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	return s.tx(ctx, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
}

// ImportKeys stores keys under their hashes, as given.
func (s *Store) ImportKeys(ctx context.Context, ks []store.KeyRecord) error {
	b := &pgx.Batch{}
	for _, k := range ks {
		rec, err := json.Marshal(toKeyRecord(k))
		if err != nil {
			return err
		}
		b.Queue("INSERT INTO keys (hash, id, user_id, rec) VALUES ($1, $2, $3, $4)", k.Hash[:], k.ID, k.UserID, rec)
	}
	return s.importBatch(ctx, b)
}

// ImportSubscriptions stores subscriptions with their start and balance;
// the credits held by open jobs are added by ImportJobs.
func (s *Store) ImportSubscriptions(ctx context.Context, subs []store.Subscription) error {
	b := &pgx.Batch{}
	for _, sub := range subs {
		rec, err := subRec(sub)
		if err != nil {
			return err
		}
		b.Queue("INSERT INTO subscriptions (user_id, service_id, rec, credits) VALUES ($1, $2, $3, $4)",
			sub.UserID, sub.ServiceID, rec, int64(sub.Credits))
	}
	return s.importBatch(ctx, b)
}

// ImportCounters stores each period's settled usage.
func (s *Store) ImportCounters(ctx context.Context, cs []store.Counter) error {
	b := &pgx.Batch{}
	for _, c := range cs {
		r := row{spend: c.Spend, unit: c.SpendUnit, unitSet: c.UnitKnown, other: otherText(c.SpendOther)}
		// An export has one counter a period, and store migrate needs an
		// empty database, so a conflict is not expected; should one come,
		// used and spend are added and the row keeps its own unit.
		b.Queue(`INSERT INTO allowances (user_id, service_id, period, used, spend, spend_unit, spend_other) VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)
			ON CONFLICT (user_id, service_id, period) DO UPDATE SET used = allowances.used + EXCLUDED.used,
				spend = allowances.spend + EXCLUDED.spend`,
			c.UserID, c.ServiceID, c.PeriodKey, int64(c.Used), int64(c.Spend), r.unitArg(), r.otherArg())
	}
	return s.importBatch(ctx, b)
}

// ImportLedger appends entries with their sequence numbers (and so their
// ids) and times; the sequence then continues after the highest.
func (s *Store) ImportLedger(ctx context.Context, es []store.LedgerEntry) error {
	b := &pgx.Batch{}
	for _, e := range es {
		if err := s.ensurePartition(ctx, e.Time); err != nil {
			return err
		}
		e.Time = e.Time.UTC().Truncate(time.Microsecond)
		// A row an older version kept with an occurredAt before year 0
		// (a report's body timestamp, now refused) moves with it clamped,
		// as every usage export shows it: RFC 3339 cannot write it, and
		// the whole migration failed on that one row.
		e.OccurredAt = store.ClampRFC3339(e.OccurredAt)
		raw, err := store.AppendLedgerEntryDetailJSON(nil, &e) // the rest in columns: rowEntry
		if err != nil {
			return err
		}
		b.Queue("INSERT INTO ledger (seq, time, user_id, service_id, entry) VALUES ($1, $2, $3, $4, $5)",
			int64(e.Seq), e.Time, e.UserID, e.ServiceID, raw)
	}
	importRollups(b, es)
	b.Queue("SELECT setval(pg_get_serial_sequence('ledger', 'seq'), greatest((SELECT max(seq) FROM ledger), 1))")
	return s.importBatch(ctx, b)
}

// ImportLedgerHistory adds the rollups of pruned rows to those of the
// imported rows, and moves the ledger's sequence past lastSeq.
//
// A bbolt ledger is pruned in segments, at any time of a month, where
// PostgreSQL's retention drops whole monthly partitions: the ledger's
// first partition then holds only the rows of its month that came after
// the pruned ones. The hour after the last pruned rollup is noted on the
// ledger (ledgerHeldFrom), so that `store check --dsn` takes the rows as
// all held from there on, and the rollups before it, not from the
// partition's start.
func (s *Store) ImportLedgerHistory(ctx context.Context, pruned []store.Rollup, lastSeq uint64) error {
	b := &pgx.Batch{}
	var after time.Time
	for _, r := range pruned {
		queueRollupAdd(b, r)
		if h := r.Hour.UTC().Truncate(time.Hour).Add(time.Hour); h.After(after) {
			after = h
		}
	}
	if !after.IsZero() {
		held, err := ledgerHeldFrom(ctx, s.pool)
		if err != nil {
			return s.fail(err)
		}
		if after.After(held) {
			// COMMENT takes no parameters; the text is a fixed format.
			b.Queue("COMMENT ON TABLE ledger IS '" + ledgerHeldPrefix + after.Format(time.RFC3339) + ledgerHeldSuffix + "'")
		}
	}
	if lastSeq > 0 {
		b.Queue("SELECT setval(pg_get_serial_sequence('ledger', 'seq'), greatest((SELECT max(seq) FROM ledger), $1::bigint, 1))", int64(lastSeq))
	}
	return s.importBatch(ctx, b)
}

// ImportJobs stores jobs and, for the open ones that held units, takes
// their holds again as CreateJobReserved does: a lease row held by the
// job, counted in the allowance and the subscription's held credits.
func (s *Store) ImportJobs(ctx context.Context, js []store.Job, holds []store.JobHold) error {
	byJob := make(map[string]store.JobHold, len(holds))
	for _, h := range holds {
		byJob[h.JobID] = h
	}
	b := &pgx.Batch{}
	for _, j := range js {
		var key *AllowanceKey
		j.ReservationID = ""
		if h, ok := byJob[j.ID]; ok && !j.Terminal() {
			key = &AllowanceKey{h.UserID, h.ServiceID, h.PeriodKey}
			j.ReservationID = jobHolder(j.ID)
			if lim := limitsOf(h.Product); lim.Hard() {
				// In every dimension the decision holds, as
				// CreateJobReserved's row: the completion reads the
				// job's floor from the row's units (store.ChargeFloor).
				// Bounded dimensions only, the hold of a PREPAID or
				// spending-capped job held no units, and a completion
				// after credits were taken back was charged 0.
				need := Vec{Units: h.Decision.Units, Spend: h.Decision.Cost}
				if h.Product.BillingModel == billing.Prepaid {
					need.Credits = h.Decision.Cost
				}
				b.Queue(`INSERT INTO leases (holder, user_id, service_id, period, units, spend, credits, expires_at)
					VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
					jobHolder(j.ID), h.UserID, h.ServiceID, h.PeriodKey, int64(need.Units), int64(need.Spend), int64(need.Credits),
					time.Now().Add(jobHoldTTL))
				b.Queue(`INSERT INTO allowances (user_id, service_id, period, leased_units, leased_spend) VALUES ($1, $2, $3, $4, $5)
					ON CONFLICT (user_id, service_id, period) DO UPDATE SET leased_units = allowances.leased_units + EXCLUDED.leased_units,
						leased_spend = allowances.leased_spend + EXCLUDED.leased_spend`,
					h.UserID, h.ServiceID, h.PeriodKey, int64(need.Units), int64(need.Spend))
				if need.Credits != 0 {
					b.Queue("UPDATE subscriptions SET credits_held = credits_held + $3 WHERE user_id = $1 AND service_id = $2",
						h.UserID, h.ServiceID, int64(need.Credits))
				}
			}
		}
		raw, err := json.Marshal(toJobRecord(j, key))
		if err != nil {
			return err
		}
		b.Queue("INSERT INTO jobs (id, open, expires_at, rec) VALUES ($1, $2, $3, $4)", j.ID, !j.Terminal(), j.ExpiresAt, raw)
	}
	return s.importBatch(ctx, b)
}

// ImportIdempotency stores claimed report keys with their responses.
func (s *Store) ImportIdempotency(ctx context.Context, cs []store.IdempotencyClaim) error {
	b := &pgx.Batch{}
	for _, c := range cs {
		resp := c.Response
		if resp == nil {
			resp = []byte{}
		}
		b.Queue("INSERT INTO idempotency (service_id, key, created, response) VALUES ($1, $2, $3, $4)",
			c.ServiceID, c.Key, c.Created, resp)
	}
	return s.importBatch(ctx, b)
}

// ImportAlerts stores alerts under their ids; the numbering continues
// after the highest.
func (s *Store) ImportAlerts(ctx context.Context, as []store.Alert) error {
	b := &pgx.Batch{}
	for _, a := range as {
		seq, ok := alertSeq(a.ID)
		if !ok {
			return fmt.Errorf("alert id %q is not alt_<n>", a.ID)
		}
		raw, err := json.Marshal(a)
		if err != nil {
			return err
		}
		next := a.NextAttempt
		if a.Status != store.AlertPending {
			next = time.Time{}
		} else if next.IsZero() {
			next = a.Created
		}
		b.Queue(`INSERT INTO alerts (seq, user_id, service_id, period_start, threshold, status, next_attempt, rec)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			seq, a.UserID, a.ServiceID, a.PeriodStart.Unix(), a.Threshold, a.Status, nullTime(next), raw)
	}
	b.Queue("SELECT setval(pg_get_serial_sequence('alerts', 'seq'), greatest((SELECT max(seq) FROM alerts), 1))")
	return s.importBatch(ctx, b)
}

// ImportAudit stores audit entries under their sequence numbers; the
// numbering continues after the highest.
func (s *Store) ImportAudit(ctx context.Context, es []store.AuditEntry) error {
	b := &pgx.Batch{}
	for _, e := range es {
		rec, err := json.Marshal(e)
		if err != nil {
			return err
		}
		b.Queue("INSERT INTO audit (seq, rec) VALUES ($1, $2)", int64(e.Seq), rec)
	}
	b.Queue("SELECT setval(pg_get_serial_sequence('audit', 'seq'), greatest((SELECT max(seq) FROM audit), 1))")
	return s.importBatch(ctx, b)
}

// Totals sums what the database holds, as the source's Export sums what
// it handed over.
func (s *Store) Totals(ctx context.Context) (store.Totals, error) {
	var t store.Totals
	var credits, used, spend int64
	err := s.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM keys),
		(SELECT count(*) FROM subscriptions), (SELECT coalesce(sum(credits), 0) FROM subscriptions),
		(SELECT count(*) FROM allowances WHERE used <> 0 OR spend <> 0 OR spend_other IS NOT NULL),
		(SELECT coalesce(sum(used), 0) FROM allowances), (SELECT coalesce(sum(`+spendTotalSQL+`), 0) FROM allowances),
		(SELECT count(*) FROM jobs),
		(SELECT count(*) FROM jobs WHERE open AND rec->'holdKey' IS NOT NULL),
		(SELECT count(*) FROM idempotency),
		(SELECT count(*) FROM alerts),
		(SELECT count(*) FROM audit),
		(SELECT count(*) FROM payment_records), (SELECT count(*) FROM credit_grants),
		(SELECT count(*) FROM credit_reversals), (SELECT count(*) FROM payment_leases)`).Scan(&t.Keys, &t.Subscriptions, &credits, &t.Counters, &used, &spend,
		&t.Jobs, &t.JobHolds, &t.Idempotency, &t.Alerts, &t.Audit,
		&t.PaymentRecords, &t.CreditGrants, &t.CreditReversals, &t.Leases)
	if err != nil {
		return t, s.fail(err)
	}
	t.Credits, t.Used, t.Spend = billing.Units(credits), billing.Units(used), billing.Units(spend)
	// The ledger's sums are read as every reader reads it.
	err = s.ScanLedger(ctx, store.LedgerFilter{}, func(e store.LedgerEntry) error {
		t.Ledger++
		t.LedgerUnits += e.Units
		t.LedgerCost += e.Cost
		return nil
	})
	if err != nil {
		return t, err
	}
	var rollupUnits int64
	if err := s.pool.QueryRow(ctx, "SELECT coalesce(sum(calls), 0), coalesce(sum(units), 0) FROM ledger_rollups").Scan(&t.RollupCalls, &rollupUnits); err != nil {
		return t, s.fail(err)
	}
	t.RollupUnits = billing.Units(rollupUnits)
	return t, nil
}

var _ store.PaymentsImporter = (*Store)(nil)

// ImportPaymentRecords stores records as given.
func (s *Store) ImportPaymentRecords(ctx context.Context, rs []store.PaymentRecord) error {
	b := &pgx.Batch{}
	for _, r := range rs {
		b.Queue("INSERT INTO payment_records (kind, id, body, updated_at) VALUES ($1, $2, $3, $4)", r.Kind, r.ID, nonNil(r.Body), r.UpdatedAt.UTC())
	}
	return s.importBatch(ctx, b)
}

// ImportCreditGrants stores grants as given.
func (s *Store) ImportCreditGrants(ctx context.Context, gs []store.CreditGrant) error {
	b := &pgx.Batch{}
	for _, g := range gs {
		// A deferred expiry's link to the holds it waits for is not
		// exported: what is still deferred comes in as spent, as it
		// counted before deferred expiries (docs/operations.md).
		b.Queue("INSERT INTO credit_grants ("+grantColumns+") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 0)",
			g.ID, g.UserID, g.ServiceID, int64(g.Credits), g.GrantedAt.UTC(), nullTime(g.ExpiresAt.UTC()), g.Source, g.Reference,
			int64(g.Reversed), int64(g.Expired), nullTime(g.ExpiredAt.UTC()), int64(g.ExpiredLater))
	}
	return s.importBatch(ctx, b)
}

// ImportCreditReversals stores reversals; Credits is what each took.
func (s *Store) ImportCreditReversals(ctx context.Context, rs []store.CreditReversal) error {
	b := &pgx.Batch{}
	for _, r := range rs {
		b.Queue("INSERT INTO credit_reversals (id, grant_id, credits, took, at, reason) VALUES ($1, $2, $3, $3, $4, $5)",
			r.ID, r.GrantID, int64(r.Credits), r.At.UTC(), r.Reason)
	}
	return s.importBatch(ctx, b)
}

// ImportLeases stores leases with their holder, epoch, expiry and cursor.
func (s *Store) ImportLeases(ctx context.Context, ls []store.Lease) error {
	b := &pgx.Batch{}
	for _, l := range ls {
		b.Queue("INSERT INTO payment_leases (name, holder, epoch, expires_at, lease_cursor) VALUES ($1, $2, $3, $4, $5)",
			l.Name, l.Holder, int64(l.Epoch), nullTime(l.Expires.UTC()), l.Cursor)
	}
	return s.importBatch(ctx, b)
}

// ledgerHeldPrefix and ledgerHeldSuffix frame the time, noted in the
// ledger table's comment by an import of a pruned bbolt ledger, from which
// every ledger row is held (ImportLedgerHistory).
const (
	ledgerHeldPrefix = "platform: ledger rows held from "
	ledgerHeldSuffix = " on; the rows before were pruned in the bbolt store moved here (store migrate), their hourly rollups stand in for them"
)

// ledgerHeldFrom reads the time noted by ImportLedgerHistory; zero when
// there is none (the ledger's rows are all held from its first partition).
func ledgerHeldFrom(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (time.Time, error) {
	var c string
	if err := q.QueryRow(ctx, "SELECT coalesce(obj_description('ledger'::regclass, 'pg_class'), '')").Scan(&c); err != nil {
		return time.Time{}, err
	}
	rest, ok := strings.CutPrefix(c, ledgerHeldPrefix)
	if !ok {
		return time.Time{}, nil
	}
	at, _, _ := strings.Cut(rest, " ")
	t, err := time.Parse(time.RFC3339, at)
	if err != nil {
		return time.Time{}, fmt.Errorf("the ledger's comment %q names no time", c)
	}
	return t.UTC(), nil
}
