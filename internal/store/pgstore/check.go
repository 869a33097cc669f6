package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/platformgw/gateway/internal/billing"
)

// `caddy platform store check --dsn`: the PostgreSQL store's counters
// proved against what its ledger, rollups and lease rows say, the way the
// bbolt check proves a file's (boltstore/crosscheck.go). Every figure
// compared here is written in the same transaction as the rows it is
// derived from (a settlement batch writes its ledger rows, their rollups,
// the allowances and the lease rows together; a lease is taken and given
// back with its allowance in one statement), so one REPEATABLE READ
// snapshot sees them equal even while a fleet serves: a node's leases and
// the settlements waiting in its settlement log are in the database as
// leased units, not as a difference.

// ErrCountersDisagree marks a database whose counters differ from what its
// ledger, rollups and lease rows say they must be.
var ErrCountersDisagree = errors.New("stored counters disagree with the ledger")

// Mismatch is one stored figure that differs from the figure derived from
// the rows that must sum to it.
type Mismatch struct {
	UserID, ServiceID string
	// Period is the start of the allowance's billing period (leased_units,
	// leased_spend, a job's lease), or zero for the sum over every period
	// (used, spend: a ledger row says when it was written, not which
	// period it was charged to; credits_held: a subscription's).
	Period time.Time
	// Hour, EndpointID and ProductID name a rollup row (ledger_rollups),
	// when the figure is one of its sums.
	Hour                  time.Time
	EndpointID, ProductID string
	// Counter names the figure: the column (used, spend, leased_units,
	// leased_spend, credits_held, rollup calls/units/overage/cost/capped)
	// or the lease row of a job that is not open.
	Counter         string
	Stored, Derived billing.Units
}

func (m Mismatch) String() string {
	where := "all periods"
	switch {
	case !m.Hour.IsZero():
		where = fmt.Sprintf("hour %s endpoint %q product %q", m.Hour.UTC().Format(time.RFC3339), m.EndpointID, m.ProductID)
	case !m.Period.IsZero():
		where = "period " + m.Period.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("user %q service %q %s: %s stored %s, derived %s", m.UserID, m.ServiceID, where, m.Counter, m.Stored, m.Derived)
}

// Unchecked is a subscription whose used and spend were not compared: its
// usage reaches back before the first ledger row and hourly rollup the
// database still holds (pruned by ledger_retention and rollup_retention).
type Unchecked struct {
	UserID, ServiceID string
	// Since is the start of its first period with usage.
	Since time.Time
}

// CheckReport is what Check compared and found.
type CheckReport struct {
	// Schema is the database's schema version.
	Schema int
	// LedgerFrom is the start of the ledger's first partition (the rows
	// before it were dropped by retention, or never written); zero when
	// the ledger has no partition. When the bbolt store moved here had
	// pruned rows of that month (LedgerPrunedBeforeMove), it is the hour
	// after the last of them: the rows are all held from there on.
	LedgerFrom             time.Time
	LedgerPrunedBeforeMove bool
	// RollupsFrom is the first hour that has a rollup; zero when none.
	RollupsFrom time.Time
	// Rollups counts the rollup rows compared with the ledger rows they
	// sum: those of the hours from both LedgerFrom and RollupsFrom on.
	Rollups int64
	// Accounts counts the subscriptions whose used and spend (summed over
	// their periods) were compared; Unchecked lists those that were not.
	Accounts  int
	Unchecked []Unchecked
	// Allowances counts the allowance rows whose leased figures were
	// compared with the lease rows; Leases and JobHolds count those rows
	// (a node's leases, and the holds of jobs).
	Allowances, Leases, JobHolds int64
	// Subscriptions counts those whose credits_held was compared.
	Subscriptions int64
	Mismatches    []Mismatch
}

// Check connects to the database at dsn and proves, in one REPEATABLE
// READ, read-only snapshot:
//
//   - every rollup row equals the sums of the ledger rows of its hour,
//     subscription, endpoint and product, for the hours whose rows and
//     rollups are both still held;
//   - used and spend of each subscription, summed over its periods, equal
//     the units and costs of its ledger rows (rows without a product are of
//     free accounts, which keep no counters), with the rollups standing in
//     for the rows of the months whose partitions were dropped; a
//     subscription whose usage reaches back past both is Unchecked;
//   - leased_units and leased_spend of each allowance equal what its lease
//     rows hold (the nodes' leases and the jobs' holds), credits_held of
//     each subscription the credits its lease rows hold;
//   - every job's lease row is of an open job.
//
// Credit balances are not compared: a grant writes no ledger row. The
// settlements a node acknowledged from its settlement log and has not
// shipped yet are in neither the ledger nor the counters (their units are
// still leased): they are not seen, and make no difference.
//
// A prune waits while the check runs (and the check for a prune running):
// a partition dropped between two of its queries would read as missing
// rows. It returns the report and, when any figure differs, an error
// wrapping ErrCountersDisagree that names them.
func Check(ctx context.Context, dsn string) (CheckReport, error) {
	var rep CheckReport
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return rep, fmt.Errorf("pgstore: the DSN does not parse (%v); see docs/configuration.md", redact(err))
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 3 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return rep, fmt.Errorf("pgstore: connect: %v", redact(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if rep.Schema, err = schemaVersion(ctx, conn); err != nil {
		return rep, err
	}
	if err := unfinishedImport(ctx, conn); err != nil {
		return rep, err
	}
	// Shared: checks run side by side; a prune (pg_advisory_lock of the
	// same key) waits for them, and they for it.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock_shared($1)", int64(pruneLock)); err != nil {
		return rep, fmt.Errorf("pgstore: wait for a prune to finish: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock_shared($1)", int64(pruneLock))
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return checkIn(ctx, tx, &rep)
	})
	if err != nil {
		return rep, fmt.Errorf("pgstore: check: %w", err)
	}
	slices.SortFunc(rep.Mismatches, func(a, b Mismatch) int { return strings.Compare(a.String(), b.String()) })
	if len(rep.Mismatches) > 0 {
		return rep, disagree(rep.Mismatches)
	}
	return rep, nil
}

// schemaVersion reads the schema's version: a database no gateway has
// started on, one from before the rollups (version 2) and one of a newer
// build are refused.
func schemaVersion(ctx context.Context, conn *pgx.Conn) (int, error) {
	var v int
	err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM pgstore_migrations").Scan(&v)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
		return 0, errors.New("pgstore: not a platform store: the database has no pgstore_migrations table (a gateway makes the schema at its first start)")
	}
	if err != nil {
		return 0, fmt.Errorf("pgstore: read the schema version: %w", err)
	}
	switch {
	case v > SchemaVersion:
		return v, fmt.Errorf("pgstore: the database's schema is version %d, newer than this build's %d: check it with the build the fleet runs", v, SchemaVersion)
	case v < 2:
		return v, fmt.Errorf("pgstore: the database's schema is version %d, from before the hourly rollups: start a gateway of this build on it (it migrates the schema), then check", v)
	}
	return v, nil
}

// clamp casts a numeric sum to bigint, saturated: a cost past
// billing.MaxUnits (stored as such in a ledger row) must not fail the
// check, and a saturated figure still differs from a small one.
func clamp(expr string) string {
	return "least(greatest(" + expr + ", -9223372036854775808), 9223372036854775807)::bigint"
}

// rowSums are the rollup sums of ledger rows, as the rollups (and the
// schema's backfill of them) read a row's entry.
const rowSums = `count(*) AS calls,
	coalesce(sum(round((entry->>'units')::numeric * 1000000)), 0) AS units,
	coalesce(sum(round((entry->>'overage')::numeric * 1000000)), 0) AS overage,
	coalesce(sum(round((entry->>'cost')::numeric * 1000000)), 0) AS cost,
	count(*) FILTER (WHERE coalesce((entry->>'unitsClaimed')::numeric, 0) <> 0) AS capped`

// farFuture stands for "no ledger partition": no row before it is held.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

func checkIn(ctx context.Context, tx pgx.Tx, rep *CheckReport) error {
	parts, err := ledgerPartitions(ctx, tx)
	if err != nil {
		return fmt.Errorf("list the ledger's partitions: %w", err)
	}
	// Retention drops the oldest partitions, whole months: the rows from
	// the first partition left on are all there.
	ledgerFrom := farFuture
	if len(parts) > 0 {
		ledgerFrom = parts[0].month
		// A bbolt ledger moved here after a prune in the middle of that
		// month: its rows are held from the hour the import noted on.
		held, err := ledgerHeldFrom(ctx, tx)
		if err != nil {
			return fmt.Errorf("read where the ledger's rows start: %w", err)
		}
		if held.After(ledgerFrom) {
			ledgerFrom, rep.LedgerPrunedBeforeMove = held, true
		}
		rep.LedgerFrom = ledgerFrom
	}
	// And deletes the rollups of the hours before a cutoff: those from the
	// first hour left on are all there.
	var first *time.Time
	if err := tx.QueryRow(ctx, "SELECT min(hour) FROM ledger_rollups").Scan(&first); err != nil {
		return fmt.Errorf("read the first rollup: %w", err)
	}
	if first != nil {
		rep.RollupsFrom = first.UTC()
	}
	if err := checkRollups(ctx, tx, rep); err != nil {
		return err
	}
	if err := checkUsage(ctx, tx, rep, ledgerFrom); err != nil {
		return err
	}
	return checkLeases(ctx, tx, rep)
}

// checkRollups compares each rollup row with the ledger rows it sums, for
// the hours both are held (from LedgerFrom and RollupsFrom on).
func checkRollups(ctx context.Context, tx pgx.Tx, rep *CheckReport) error {
	if rep.LedgerFrom.IsZero() || rep.RollupsFrom.IsZero() {
		return nil
	}
	from := rep.LedgerFrom
	if rep.RollupsFrom.After(from) {
		from = rep.RollupsFrom
	}
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM ledger_rollups WHERE hour >= $1", from).Scan(&rep.Rollups); err != nil {
		return fmt.Errorf("count the rollups: %w", err)
	}
	cols := []string{"calls", "units", "overage", "cost", "capped"}
	var stored, derived []string
	for _, c := range cols {
		stored = append(stored, clamp("coalesce(r."+c+", 0)"))
		derived = append(derived, clamp("coalesce(d."+c+", 0)"))
	}
	rows, err := tx.Query(ctx, `WITH d AS (
		SELECT date_trunc('hour', time AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour, user_id, service_id,
			coalesce(entry->>'endpointId', '') AS endpoint_id, coalesce(entry->>'productId', '') AS product_id, `+rowSums+`
		FROM ledger WHERE time >= $1 GROUP BY 1, 2, 3, 4, 5
	), r AS (
		SELECT * FROM ledger_rollups WHERE hour >= $1
	)
	SELECT coalesce(r.hour, d.hour), coalesce(r.user_id, d.user_id), coalesce(r.service_id, d.service_id),
		coalesce(r.endpoint_id, d.endpoint_id), coalesce(r.product_id, d.product_id),
		`+strings.Join(stored, ", ")+`, `+strings.Join(derived, ", ")+`
	FROM r FULL JOIN d ON r.hour = d.hour AND r.user_id = d.user_id AND r.service_id = d.service_id
		AND r.endpoint_id = d.endpoint_id AND r.product_id = d.product_id
	WHERE (coalesce(r.calls, 0), coalesce(r.units, 0), coalesce(r.overage, 0), coalesce(r.cost, 0), coalesce(r.capped, 0))
		IS DISTINCT FROM (coalesce(d.calls, 0), coalesce(d.units, 0), coalesce(d.overage, 0), coalesce(d.cost, 0), coalesce(d.capped, 0))`, from)
	if err != nil {
		return fmt.Errorf("compare the rollups with the ledger: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var m Mismatch
		var s, d [5]int64
		if err := rows.Scan(&m.Hour, &m.UserID, &m.ServiceID, &m.EndpointID, &m.ProductID,
			&s[0], &s[1], &s[2], &s[3], &s[4], &d[0], &d[1], &d[2], &d[3], &d[4]); err != nil {
			return fmt.Errorf("compare the rollups with the ledger: %w", err)
		}
		m.Hour = m.Hour.UTC()
		for i, c := range cols {
			if s[i] == d[i] {
				continue
			}
			mm := m
			mm.Counter = "rollup " + c
			mm.Stored, mm.Derived = billing.Units(s[i]), billing.Units(d[i])
			if c == "calls" || c == "capped" { // counts, not units
				mm.Stored, mm.Derived = billing.Whole(s[i]), billing.Whole(d[i])
			}
			rep.Mismatches = append(rep.Mismatches, mm)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("compare the rollups with the ledger: %w", err)
	}
	return nil
}

// checkUsage compares used and spend of each subscription, summed over its
// periods, with its ledger rows from ledgerFrom on and its rollups before.
func checkUsage(ctx context.Context, tx pgx.Tx, rep *CheckReport, ledgerFrom time.Time) error {
	rows, err := tx.Query(ctx, `WITH st AS (
		SELECT user_id, service_id, sum(used) AS used, sum(`+spendTotalSQL+`) AS spend,
			min(period) FILTER (WHERE used <> 0 OR spend <> 0 OR spend_other IS NOT NULL) AS since
		FROM allowances GROUP BY 1, 2
	), d AS (
		SELECT user_id, service_id, sum(u) AS used, sum(c) AS spend FROM (
			SELECT user_id, service_id, coalesce(round((entry->>'units')::numeric * 1000000), 0) AS u,
				coalesce(round((entry->>'cost')::numeric * 1000000), 0) AS c
			FROM ledger WHERE time >= $1 AND coalesce(entry->>'productId', '') <> ''
			UNION ALL
			SELECT user_id, service_id, units, cost FROM ledger_rollups WHERE hour < $1 AND product_id <> ''
		) x GROUP BY 1, 2
	)
	SELECT coalesce(st.user_id, d.user_id), coalesce(st.service_id, d.service_id),
		`+clamp("coalesce(st.used, 0)")+`, `+clamp("coalesce(st.spend, 0)")+`,
		`+clamp("coalesce(d.used, 0)")+`, `+clamp("coalesce(d.spend, 0)")+`, st.since
	FROM st FULL JOIN d ON st.user_id = d.user_id AND st.service_id = d.service_id`, ledgerFrom)
	if err != nil {
		return fmt.Errorf("compare used and spend with the ledger: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var user, service string
		var su, ss, du, ds int64
		var since *int64
		if err := rows.Scan(&user, &service, &su, &ss, &du, &ds, &since); err != nil {
			return fmt.Errorf("compare used and spend with the ledger: %w", err)
		}
		if since != nil && !derivable(*since, ledgerFrom, rep.RollupsFrom) {
			rep.Unchecked = append(rep.Unchecked, Unchecked{UserID: user, ServiceID: service, Since: time.Unix(*since, 0).UTC()})
			continue
		}
		rep.Accounts++
		if su != du {
			rep.Mismatches = append(rep.Mismatches, Mismatch{UserID: user, ServiceID: service, Counter: "used",
				Stored: billing.Units(su), Derived: billing.Units(du)})
		}
		if ss != ds {
			rep.Mismatches = append(rep.Mismatches, Mismatch{UserID: user, ServiceID: service, Counter: "spend",
				Stored: billing.Units(ss), Derived: billing.Units(ds)})
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("compare used and spend with the ledger: %w", err)
	}
	slices.SortFunc(rep.Unchecked, func(a, b Unchecked) int {
		return strings.Compare(a.UserID+"\x00"+a.ServiceID, b.UserID+"\x00"+b.ServiceID)
	})
	return nil
}

// derivable says whether the usage of a subscription whose first period
// with usage starts at since (Unix seconds) is all in the rows and rollups
// held: a row is never written before the start of the period it is
// charged to, so every row of it is at since or later, and from
// ledgerFrom on the rows are held, from rollupsFrom on the rollups.
func derivable(since int64, ledgerFrom, rollupsFrom time.Time) bool {
	at := time.Unix(since, 0).UTC()
	if !at.Before(ledgerFrom) {
		return true
	}
	return !rollupsFrom.IsZero() && !at.Truncate(time.Hour).Before(rollupsFrom)
}

// jobLeaseMin tells a job's lease row from a node's: a job's expires
// jobHoldTTL (a century) after it was taken, a node's lease_ttl after its
// last renewal, and a node may be named "job".
const jobLeaseMin = "interval '50 years'"

// checkLeases compares the leased figures of each allowance and the
// credits held of each subscription with the lease rows, and finds the
// lease rows of jobs that are not open.
func checkLeases(ctx context.Context, tx pgx.Tx, rep *CheckReport) error {
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM allowances), (SELECT count(*) FROM subscriptions),
		(SELECT count(*) FROM leases WHERE NOT (holder LIKE 'job/%' AND expires_at > now() + `+jobLeaseMin+`)),
		(SELECT count(*) FROM leases WHERE holder LIKE 'job/%' AND expires_at > now() + `+jobLeaseMin+`)`).
		Scan(&rep.Allowances, &rep.Subscriptions, &rep.Leases, &rep.JobHolds); err != nil {
		return fmt.Errorf("count the allowances and leases: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT coalesce(a.user_id, l.user_id), coalesce(a.service_id, l.service_id), coalesce(a.period, l.period),
		coalesce(a.leased_units, 0), coalesce(a.leased_spend, 0), `+clamp("coalesce(l.units, 0)")+`, `+clamp("coalesce(l.spend, 0)")+`
	FROM allowances a FULL JOIN (SELECT user_id, service_id, period, sum(units) AS units, sum(spend) AS spend FROM leases GROUP BY 1, 2, 3) l
		ON a.user_id = l.user_id AND a.service_id = l.service_id AND a.period = l.period
	WHERE coalesce(a.leased_units, 0) <> coalesce(l.units, 0) OR coalesce(a.leased_spend, 0) <> coalesce(l.spend, 0)`)
	if err != nil {
		return fmt.Errorf("compare the allowances with the leases: %w", err)
	}
	for rows.Next() {
		var user, service string
		var period, su, ss, du, ds int64
		if err := rows.Scan(&user, &service, &period, &su, &ss, &du, &ds); err != nil {
			rows.Close()
			return fmt.Errorf("compare the allowances with the leases: %w", err)
		}
		at := time.Unix(period, 0).UTC()
		if su != du {
			rep.Mismatches = append(rep.Mismatches, Mismatch{UserID: user, ServiceID: service, Period: at, Counter: "leased_units",
				Stored: billing.Units(su), Derived: billing.Units(du)})
		}
		if ss != ds {
			rep.Mismatches = append(rep.Mismatches, Mismatch{UserID: user, ServiceID: service, Period: at, Counter: "leased_spend",
				Stored: billing.Units(ss), Derived: billing.Units(ds)})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("compare the allowances with the leases: %w", err)
	}
	rows, err = tx.Query(ctx, `SELECT coalesce(s.user_id, l.user_id), coalesce(s.service_id, l.service_id),
		coalesce(s.credits_held, 0), `+clamp("coalesce(l.credits, 0)")+`
	FROM subscriptions s FULL JOIN (SELECT user_id, service_id, sum(credits) AS credits FROM leases GROUP BY 1, 2) l
		ON s.user_id = l.user_id AND s.service_id = l.service_id
	WHERE coalesce(s.credits_held, 0) <> coalesce(l.credits, 0)`)
	if err != nil {
		return fmt.Errorf("compare the credits held with the leases: %w", err)
	}
	for rows.Next() {
		var m Mismatch
		var s, d int64
		if err := rows.Scan(&m.UserID, &m.ServiceID, &s, &d); err != nil {
			rows.Close()
			return fmt.Errorf("compare the credits held with the leases: %w", err)
		}
		m.Counter, m.Stored, m.Derived = "credits_held", billing.Units(s), billing.Units(d)
		rep.Mismatches = append(rep.Mismatches, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("compare the credits held with the leases: %w", err)
	}
	// A job's hold ends in the transaction that ends the job (endJob): a
	// lease row of a job that is not open holds its units for good.
	rows, err = tx.Query(ctx, `SELECT l.holder, l.user_id, l.service_id, l.period, l.units FROM leases l
	WHERE l.holder LIKE 'job/%' AND l.expires_at > now() + `+jobLeaseMin+`
		AND NOT EXISTS (SELECT 1 FROM jobs j WHERE 'job/' || j.id = l.holder AND j.open)`)
	if err != nil {
		return fmt.Errorf("read the holds of jobs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var holder string
		var m Mismatch
		var period, u int64
		if err := rows.Scan(&holder, &m.UserID, &m.ServiceID, &period, &u); err != nil {
			return fmt.Errorf("read the holds of jobs: %w", err)
		}
		m.Period = time.Unix(period, 0).UTC()
		m.Counter = fmt.Sprintf("lease of job %q, which is not open,", strings.TrimPrefix(holder, "job/"))
		m.Stored = billing.Units(u)
		rep.Mismatches = append(rep.Mismatches, m)
	}
	return rows.Err()
}

// maxNamed bounds how many differing figures an error names.
const maxNamed = 20

// disagree is the error for figures that differ.
func disagree(ms []Mismatch) error {
	lines := make([]string, 0, min(len(ms), maxNamed))
	for _, m := range ms[:min(len(ms), maxNamed)] {
		lines = append(lines, m.String())
	}
	more := ""
	if len(ms) > len(lines) {
		more = fmt.Sprintf(", the first %d named", len(lines))
	}
	return fmt.Errorf("%d figures differ from the ledger, the rollups and the leases%s:\n  %s\n%w",
		len(ms), more, strings.Join(lines, "\n  "), ErrCountersDisagree)
}
