package pgstore

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The ledger at a year's scale on PostgreSQL (docs/fleet.md, "Rollups and
// retention"): the hourly rollups are the table ledger_rollups, written in
// the same statement as the ledger rows they sum (so in the same
// transaction as the settlement batch), and retention drops whole monthly
// partitions of the ledger.

// pruneLock is the pg_advisory_xact_lock key a node holds while it prunes
// the ledger or the rollups: in a fleet every node runs ledger_retention,
// and one prunes at a time (the others wait, then find nothing left).
const pruneLock = 0x706c6174_70727565 // "platprue"

// rollupCols are the rollup fields of ledger rows as unnest arrays, one
// element per row, alongside ledgerRows.
type rollupCols struct {
	hours     []time.Time
	endpoints []string
	products  []string
	units     []int64
	overage   []int64
	cost      []int64
	capped    []int64
}

func (r *rollupCols) add(e store.LedgerEntry) {
	r.hours = append(r.hours, e.Time.UTC().Truncate(time.Hour))
	r.endpoints = append(r.endpoints, e.EndpointID)
	r.products = append(r.products, e.ProductID)
	r.units = append(r.units, int64(e.Units))
	r.overage = append(r.overage, int64(e.Overage))
	r.cost = append(r.cost, int64(e.Cost))
	c := int64(0)
	if e.UnitsClaimed != 0 {
		c = 1
	}
	r.capped = append(r.capped, c)
}

// rollupUpsert adds the rows of the CTE named src that are also in the
// CTE named ins (joined on call id and time) to their rollups. Keys go in
// primary key order, so that batches of several nodes lock the rollup rows
// they share in one order.
var rollupUpsert = `
	INSERT INTO ledger_rollups AS r (hour, user_id, service_id, endpoint_id, product_id, calls, units, overage, cost, capped)
	SELECT src.hour, src.user_id, src.service_id, src.endpoint_id, src.product_id,
		count(*), ` + clamp("sum(src.units)") + `, ` + clamp("sum(src.overage)") + `, ` + clamp("sum(src.cost)") + `, sum(src.capped)::bigint
	FROM src JOIN ins ON ins.call_id = src.call_id AND ins.time = src.time
	GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5
	ON CONFLICT (hour, user_id, service_id, endpoint_id, product_id) DO UPDATE SET ` + addRollupSums

// addRollupSums adds a rollup's sums (EXCLUDED) to the row r there is: its
// units, overage and cost saturate, as a period's spend and the bbolt
// store's rollups do. A cost past what a quantity holds is a ledger row's
// own (billing.Mul saturates), and added in bigint it failed the write:
// the report refused, the settlement batch with every call in it.
var addRollupSums = `calls = r.calls + EXCLUDED.calls,
	units = ` + satAddSQL("r.units", "EXCLUDED.units") + `, overage = ` + satAddSQL("r.overage", "EXCLUDED.overage") + `,
	cost = ` + satAddSQL("r.cost", "EXCLUDED.cost") + `, capped = r.capped + EXCLUDED.capped`

// satAddSQL is a + b in bigint, saturated (clamp).
func satAddSQL(a, b string) string { return clamp(a + "::numeric + " + b) }

// insertLedgerSQL inserts a settlement batch's ledger rows, each with the
// seq a node's settlement log gave it, or a new one where it gave none. A
// row already there (from an attempt whose commit went unanswered) is
// skipped; commitOnce then rolls the whole batch back, so the rollups it
// adds in the same transaction (addRollupsSQL) are only ever those of rows
// inserted. It answers call_id, seq of the rows inserted.
const insertLedgerSQL = `INSERT INTO ledger (seq, time, call_id, user_id, service_id, entry)
	SELECT CASE WHEN q > 0 THEN q ELSE nextval(` + ledgerSeq + `) END,
		time, call_id, user_id, service_id, entry
	FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::bigint[])
		AS s(time, call_id, user_id, service_id, entry, q)
	ON CONFLICT DO NOTHING RETURNING call_id, seq`

// copyLedgerSQL takes a batch whose rows all carry their seq (a settlement
// log's shipment), in COPY's binary format (copyData), which PostgreSQL
// writes with fewer calls and less WAL than an INSERT of unnest arrays
// (a page's rows in one WAL record; docs/fleet.md has the figures). COPY
// has no ON CONFLICT: a row already there fails the whole statement with a
// unique violation, which commitOnce takes as it takes insertLedgerSQL's
// short row count.
const copyLedgerSQL = `COPY ledger (seq, time, call_id, user_id, service_id, entry) FROM STDIN (FORMAT binary)`

// pgEpoch is PostgreSQL's timestamp epoch in Unix microseconds.
const pgEpoch = 946_684_800_000_000

// copyData is the rows in COPY's binary format, as copyLedgerSQL's columns
// take them: bigint and timestamptz as 8 bytes (microseconds since
// PostgreSQL's epoch), text as its bytes, jsonb as its version (1) and the
// text; an entry that could not be encoded is NULL (refused by the
// column, as the INSERT refused it).
func (l *ledgerRows) copyData() []byte {
	be := binary.BigEndian
	n := 19 + 2 // header, trailer
	for i := range l.index {
		n += 2 + 6*4 + 8 + 8 + len(l.calls[i]) + len(l.users[i]) + len(l.services[i]) + 1 + len(l.entries[i])
	}
	buf := make([]byte, 0, n)
	buf = append(buf, "PGCOPY\n\xff\r\n\x00"...)
	buf = be.AppendUint32(buf, 0) // flags
	buf = be.AppendUint32(buf, 0) // header extension
	text := func(buf []byte, s string) []byte {
		return append(be.AppendUint32(buf, uint32(len(s))), s...)
	}
	for i := range l.index {
		buf = be.AppendUint16(buf, 6)
		buf = be.AppendUint64(be.AppendUint32(buf, 8), uint64(l.seqs[i]))
		buf = be.AppendUint64(be.AppendUint32(buf, 8), uint64(l.times[i].UnixMicro()-pgEpoch))
		buf = text(buf, l.calls[i])
		buf = text(buf, l.users[i])
		buf = text(buf, l.services[i])
		if e := l.entries[i]; e == nil {
			buf = be.AppendUint32(buf, 0xffffffff)
		} else {
			buf = append(be.AppendUint32(buf, uint32(len(e)+1)), 1)
			buf = append(buf, e...)
		}
	}
	return be.AppendUint16(buf, 0xffff) // the end
}

// insertArgs are the arguments of insertLedgerSQL.
func (l *ledgerRows) insertArgs() []any {
	return []any{l.times, l.calls, l.users, l.services, l.entries, l.seqs}
}

// addRollupsSQL adds a batch's rollups, summed by the node (rollupSums),
// one row per key in primary key order, so that batches of several nodes
// lock the rollup rows they share in one order.
var addRollupsSQL = `INSERT INTO ledger_rollups AS r (hour, user_id, service_id, endpoint_id, product_id, calls, units, overage, cost, capped)
	SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[],
		$6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[])
	ON CONFLICT (hour, user_id, service_id, endpoint_id, product_id) DO UPDATE SET ` + addRollupSums

// rollupKey is a row of ledger_rollups: a subscription's endpoint and
// product in one UTC hour.
type rollupKey struct {
	hour                             int64 // Unix seconds
	user, service, endpoint, product string
}

// rollupSum is what a rollup row adds up.
type rollupSum struct{ calls, units, overage, cost, capped int64 }

// rollupSums sums ledger rows by rollup row, as addRollupsSQL adds them.
type rollupSums struct {
	keys []rollupKey
	sums []rollupSum
	at   map[rollupKey]int
	last int // the key of the row added last: a batch's rows mostly share one
}

func (r *rollupSums) add(e *store.LedgerEntry) {
	k := rollupKey{e.Time.UTC().Truncate(time.Hour).Unix(), e.UserID, e.ServiceID, e.EndpointID, e.ProductID}
	i := r.last
	if i >= len(r.keys) || r.keys[i] != k {
		var ok bool
		if i, ok = r.at[k]; !ok {
			if r.at == nil {
				r.at = map[rollupKey]int{}
			}
			i = len(r.keys)
			r.at[k] = i
			r.keys = append(r.keys, k)
			r.sums = append(r.sums, rollupSum{})
		}
		r.last = i
	}
	s := &r.sums[i]
	s.calls++
	s.units = int64(billing.SatAdd(billing.Units(s.units), e.Units))
	s.overage = int64(billing.SatAdd(billing.Units(s.overage), e.Overage))
	s.cost = int64(billing.SatAdd(billing.Units(s.cost), e.Cost))
	if e.UnitsClaimed != 0 {
		s.capped++
	}
}

// args are addRollupsSQL's arguments, the rows in primary key order
// (text compared bytewise, as the table's COLLATE "C").
func (r *rollupSums) args() []any {
	order := make([]int, len(r.keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		x, y := &r.keys[a], &r.keys[b]
		return cmp.Or(cmp.Compare(x.hour, y.hour), strings.Compare(x.user, y.user), strings.Compare(x.service, y.service),
			strings.Compare(x.endpoint, y.endpoint), strings.Compare(x.product, y.product))
	})
	n := len(order)
	hours := make([]time.Time, n)
	users, services, endpoints, products := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	calls, units, overage, cost, capped := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for j, i := range order {
		k, s := &r.keys[i], &r.sums[i]
		hours[j], users[j], services[j], endpoints[j], products[j] = time.Unix(k.hour, 0).UTC(), k.user, k.service, k.endpoint, k.product
		calls[j], units[j], overage[j], cost[j], capped[j] = s.calls, s.units, s.overage, s.cost, s.capped
	}
	return []any{hours, users, services, endpoints, products, calls, units, overage, cost, capped}
}

// insertOneLedgerSQL appends one row (Record, a job's completion) and adds
// it to its rollup, answering its seq. A duplicate call id fails the whole
// statement, rollup included.
var insertOneLedgerSQL = `WITH src AS (
	SELECT $1::timestamptz AS time, $2::text AS call_id, $3::text AS user_id, $4::text AS service_id, $5::jsonb AS entry,
		$6::timestamptz AS hour, $7::text AS endpoint_id, $8::text AS product_id, $9::bigint AS units,
		$10::bigint AS overage, $11::bigint AS cost, $12::bigint AS capped
), ins AS (
	INSERT INTO ledger (time, call_id, user_id, service_id, entry)
	SELECT time, call_id, user_id, service_id, entry FROM src RETURNING call_id, seq, time
), roll AS (` + strings.Replace(rollupUpsert, "ins.call_id = src.call_id AND ", "ins.call_id IS NOT DISTINCT FROM src.call_id AND ", 1) + `
)
SELECT seq FROM ins`

func insertOneArgs(callID any, e *store.LedgerEntry, raw []byte) []any {
	var r rollupCols
	r.add(*e)
	return []any{e.Time, callID, e.UserID, e.ServiceID, raw,
		r.hours[0], r.endpoints[0], r.products[0], r.units[0], r.overage[0], r.cost[0], r.capped[0]}
}

// importRollups adds imported ledger rows to their rollups, in b.
func importRollups(b *pgx.Batch, es []store.LedgerEntry) {
	type key struct {
		hour                             time.Time
		user, service, endpoint, product string
	}
	sums := map[key]*store.Rollup{}
	var keys []key
	for _, e := range es {
		k := key{e.Time.UTC().Truncate(time.Hour), e.UserID, e.ServiceID, e.EndpointID, e.ProductID}
		r := sums[k]
		if r == nil {
			r = &store.Rollup{}
			sums[k] = r
			keys = append(keys, k)
		}
		r.Calls++
		r.Units = billing.SatAdd(r.Units, e.Units)
		r.Overage = billing.SatAdd(r.Overage, e.Overage)
		r.Cost = billing.SatAdd(r.Cost, e.Cost)
		if e.UnitsClaimed != 0 {
			r.Capped++
		}
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := a.hour.Compare(b.hour); c != 0 {
			return c
		}
		return strings.Compare(a.user+"\x00"+a.service+"\x00"+a.endpoint+"\x00"+a.product,
			b.user+"\x00"+b.service+"\x00"+b.endpoint+"\x00"+b.product)
	})
	for _, k := range keys {
		r := sums[k]
		r.Hour, r.UserID, r.ServiceID, r.EndpointID, r.ProductID = k.hour, k.user, k.service, k.endpoint, k.product
		queueRollupAdd(b, *r)
	}
}

// queueRollupAdd adds r's sums to its hour's rollup (made if missing).
func queueRollupAdd(b *pgx.Batch, r store.Rollup) {
	b.Queue(`INSERT INTO ledger_rollups AS r (hour, user_id, service_id, endpoint_id, product_id, calls, units, overage, cost, capped)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (hour, user_id, service_id, endpoint_id, product_id) DO UPDATE SET `+addRollupSums,
		r.Hour.UTC().Truncate(time.Hour), r.UserID, r.ServiceID, r.EndpointID, r.ProductID, r.Calls, int64(r.Units), int64(r.Overage), int64(r.Cost), r.Capped)
}

// rollupChunk is how many rollups one query reads.
const rollupChunk = 2000

// ScanRollups streams the hourly rollups (store.RollupReader) in (hour,
// user, service, endpoint, product) order. Every settlement acknowledged
// before the call is in them: a batch writes its rows and their rollups in
// one transaction.
func (s *Store) ScanRollups(ctx context.Context, f store.RollupFilter, fn func(store.Rollup) error) error {
	if noSuchText(f.UserID, f.ServiceID) {
		return nil
	}
	// The settlements this node acknowledged from its settlement log are
	// shipped first, as for a ledger read, so that the node reads its
	// own writes in the rollups as in the ledger.
	if err := s.flushForRead(ctx); err != nil {
		return err
	}
	from, to := scanBounds(f.From, f.To)
	// Keyset paging: the first chunk from the start, the next ones after
	// the last key read.
	first, after := true, store.Rollup{Hour: from}
	for {
		if err := store.CtxErr(ctx); err != nil {
			return err
		}
		rows, err := s.pool.Query(ctx, `SELECT hour, user_id, service_id, endpoint_id, product_id, calls, units, overage, cost, capped
			FROM ledger_rollups
			WHERE hour >= $1 AND hour < $2
			  AND ($3 OR (hour, user_id, service_id, endpoint_id, product_id) > ($4, $5, $6, $7, $8))
			  AND ($9 = '' OR user_id = $9) AND ($10 = '' OR service_id = $10)
			ORDER BY hour, user_id, service_id, endpoint_id, product_id LIMIT $11`,
			from, to, first, after.Hour, after.UserID, after.ServiceID, after.EndpointID, after.ProductID,
			f.UserID, f.ServiceID, rollupChunk)
		if err != nil {
			return s.fail(err)
		}
		first = false
		var chunk []store.Rollup
		for rows.Next() {
			var r store.Rollup
			var units, overage, cost int64
			if err := rows.Scan(&r.Hour, &r.UserID, &r.ServiceID, &r.EndpointID, &r.ProductID, &r.Calls, &units, &overage, &cost, &r.Capped); err != nil {
				rows.Close()
				return s.fail(err)
			}
			r.Hour = r.Hour.UTC()
			r.Units, r.Overage, r.Cost = billing.Units(units), billing.Units(overage), billing.Units(cost)
			chunk = append(chunk, r)
		}
		if err := rows.Err(); err != nil {
			return s.fail(err)
		}
		for _, r := range chunk {
			if err := fn(r); err != nil {
				return err
			}
		}
		if len(chunk) < rollupChunk {
			return nil
		}
		after = chunk[len(chunk)-1]
	}
}

// checkCutoff refuses a prune cutoff that is zero or in the future (it
// would remove rows still being written).
func checkCutoff(before time.Time) error {
	if before.IsZero() || before.After(time.Now()) {
		return fmt.Errorf("%w: %s", store.ErrBadCutoff, before.Format(time.RFC3339))
	}
	return nil
}

// partition is one monthly partition of the ledger.
type partition struct {
	name  string
	month time.Time
}

// ledgerPartitions lists the ledger's partitions named as ensurePartition
// names them, oldest first.
func ledgerPartitions(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]partition, error) {
	rows, err := q.Query(ctx, `SELECT c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'ledger'::regclass ORDER BY c.relname`)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var out []partition
	for _, n := range names {
		m, err := time.Parse("ledger_2006_01", n)
		if err != nil {
			continue // not one of ours: never dropped
		}
		out = append(out, partition{n, m.UTC()})
	}
	return out, nil
}

// PruneLedger drops the monthly partitions of the ledger that end at or
// before before (store.LedgerPruner): whole partitions, so a year's rows go
// without a DELETE's dead tuples or vacuum. Rows of the partition that
// straddles before (the month before falls in) stay until a later prune
// passes its end; the rollups stay. Segments in the result counts the
// partitions dropped, Rows their rows and Bytes their size on disk. The
// lease_pre_ended rows of lease rows that ended before before go too.
//
// One node of a fleet prunes at a time (a session advisory lock; the
// others wait, then find nothing left). The rows are counted first, under
// no lock that writes wait for; then each partition is dropped in a
// transaction of its own that waits at most dropLockWait for the ledger's
// lock (a DROP queued behind a long export would hold back every
// settlement queued behind it), tried again a few times, and otherwise
// left for the next prune: the answer is then store.ErrUnavailable with
// what was dropped so far.
//
// The audit entries, when given, are written in each partition's DROP
// transaction, completed with what that partition held: a partition goes
// with its entries or not at all.
func (s *Store) PruneLedger(ctx context.Context, before time.Time, audit ...store.AuditEntry) (store.PruneResult, error) {
	res := store.PruneResult{Before: before}
	if err := checkCutoff(before); err != nil {
		return res, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return res, s.fail(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(pruneLock)); err != nil {
		return res, s.fail(err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(pruneLock))
	// What lease rows that ended before the cutoff expired of credits
	// marked at a deferred expiry (lease_pre_ended, heldexpiry.go): kept
	// for calls they served shipped after the row ended, as long as the
	// ledger keeps rows of that time, and no longer (before, nothing
	// pruned them).
	if _, err := conn.Exec(ctx, "DELETE FROM lease_pre_ended WHERE ended_at < $1", before); err != nil {
		return res, s.fail(err)
	}
	parts, err := ledgerPartitions(ctx, conn)
	if err != nil {
		return res, s.fail(err)
	}
	type counted struct {
		name        string
		rows, bytes int64
	}
	var drop []counted
	for _, p := range parts {
		if p.month.AddDate(0, 1, 0).After(before) {
			break // this partition holds rows at or after before
		}
		c := counted{name: p.name}
		if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM %s), pg_total_relation_size('%s')`,
			pgx.Identifier{p.name}.Sanitize(), p.name)).Scan(&c.rows, &c.bytes); err != nil {
			return res, s.fail(err)
		}
		drop = append(drop, c)
	}
	for _, c := range drop {
		var err error
		for attempt := range dropAttempts {
			if attempt > 0 {
				select {
				case <-time.After(time.Duration(attempt) * dropLockWait):
				case <-ctx.Done():
					return res, ctx.Err()
				}
			}
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", dropLockWait.Milliseconds())); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "DROP TABLE "+pgx.Identifier{c.name}.Sanitize()); err != nil {
					return err
				}
				return insertAudits(ctx, tx, store.WithPruned(audit, store.PruneResult{Before: before, Segments: 1, Rows: c.rows, Bytes: c.bytes}))
			})
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "55P03" { // lock_not_available
				break
			}
		}
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "55P03" {
				return res, fmt.Errorf("pgstore: the ledger stayed busy; partition %s was not dropped (the next prune tries again): %w",
					c.name, store.ErrUnavailable)
			}
			return res, s.fail(err)
		}
		res.Segments++
		res.Rows += c.rows
		res.Bytes += c.bytes
	}
	return res, nil
}

// dropLockWait is the longest a partition's DROP waits for the ledger's
// lock, dropAttempts how often it tries.
const (
	dropLockWait = 200 * time.Millisecond
	dropAttempts = 10
)

// PruneRollups forgets the rollups of the hours before the one before
// falls in (store.RollupPruner), under the same lock as PruneLedger.
func (s *Store) PruneRollups(ctx context.Context, before time.Time) (int, error) {
	if err := checkCutoff(before); err != nil {
		return 0, err
	}
	var n int64
	err := s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(pruneLock)); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, "DELETE FROM ledger_rollups WHERE hour < $1", before.UTC().Truncate(time.Hour))
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, s.fail(err)
	}
	return int(n), nil
}

var (
	_ store.RollupReader = (*Store)(nil)
	_ store.LedgerPruner = (*Store)(nil)
	_ store.RollupPruner = (*Store)(nil)
)

// scanBounds are a scan's hour bounds for SQL: an open end (zero) as a
// time no row is before or after.
func scanBounds(from, to time.Time) (time.Time, time.Time) {
	if from.IsZero() {
		from = time.Unix(0, 0).UTC().AddDate(-100, 0, 0)
	}
	if to.IsZero() {
		to = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return from, to
}
