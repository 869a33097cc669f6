package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// migrationLock is the pg_advisory_lock key every node takes while it
// migrates the schema, so nodes starting together make one schema: the
// first migrates, the others wait and then find nothing left to do.
const migrationLock = 0x706c6174666f726d // "platform"

// migrations are applied in order, each in its own transaction, and
// recorded in pgstore_migrations. Never edit one that has shipped: add the
// next. Text columns sort bytewise (COLLATE "C") so that listings page in
// the same order as the bbolt store's keys.
var migrations = []string{
	// 1: the whole schema of the first release.
	`
CREATE TABLE keys (
	hash    bytea PRIMARY KEY,            -- SHA-256 of the key; the key itself is never stored
	id      text COLLATE "C" NOT NULL UNIQUE,
	user_id text COLLATE "C" NOT NULL,
	rec     jsonb NOT NULL
);
CREATE INDEX keys_user ON keys (user_id, id);

CREATE TABLE subscriptions (
	user_id      text COLLATE "C" NOT NULL,
	service_id   text COLLATE "C" NOT NULL,
	rec          jsonb NOT NULL,
	credits      bigint NOT NULL DEFAULT 0, -- prepaid balance after settled charges
	credits_held bigint NOT NULL DEFAULT 0, -- credits leased to nodes and jobs
	PRIMARY KEY (user_id, service_id)
);

-- One row per subscription and billing period: what was settled and
-- what is leased to nodes (and held by open jobs). A lease is taken with
-- one conditional UPDATE of this row.
CREATE TABLE allowances (
	user_id      text COLLATE "C" NOT NULL,
	service_id   text COLLATE "C" NOT NULL,
	period       bigint NOT NULL,           -- period start, Unix seconds
	used         bigint NOT NULL DEFAULT 0,
	spend        bigint NOT NULL DEFAULT 0,
	leased_units bigint NOT NULL DEFAULT 0,
	leased_spend bigint NOT NULL DEFAULT 0,
	PRIMARY KEY (user_id, service_id, period)
);

-- What each holder (a node's incarnation, or an open job) has leased and
-- not yet consumed. A lease past expires_at is returned by any node.
CREATE TABLE leases (
	holder     text COLLATE "C" NOT NULL,
	user_id    text COLLATE "C" NOT NULL,
	service_id text COLLATE "C" NOT NULL,
	period     bigint NOT NULL,
	units      bigint NOT NULL DEFAULT 0,
	spend      bigint NOT NULL DEFAULT 0,
	credits    bigint NOT NULL DEFAULT 0,
	expires_at timestamptz NOT NULL,
	PRIMARY KEY (holder, user_id, service_id, period)
);
CREATE INDEX leases_expiry ON leases (expires_at);

-- The append-only usage ledger, partitioned by month (partitions are made
-- ahead by the nodes). call_id names the call a row charges, so a batch
-- retried after a lost commit acknowledgement never counts twice.
CREATE TABLE ledger (
	seq        bigserial,
	time       timestamptz NOT NULL,
	call_id    text,
	user_id    text COLLATE "C" NOT NULL,
	service_id text COLLATE "C" NOT NULL,
	entry      jsonb NOT NULL,
	UNIQUE (call_id, time)
) PARTITION BY RANGE (time);
CREATE INDEX ledger_time ON ledger (time, seq);

CREATE TABLE idempotency (
	service_id text COLLATE "C" NOT NULL,
	key        text NOT NULL,
	created    timestamptz NOT NULL,
	response   bytea NOT NULL,
	PRIMARY KEY (service_id, key)
);
CREATE INDEX idempotency_created ON idempotency (created);

CREATE TABLE jobs (
	id         text COLLATE "C" PRIMARY KEY,
	open       boolean NOT NULL,
	expires_at timestamptz NOT NULL,
	rec        jsonb NOT NULL
);
CREATE INDEX jobs_open ON jobs (expires_at) WHERE open;

CREATE TABLE alerts (
	seq          bigserial PRIMARY KEY,
	user_id      text COLLATE "C" NOT NULL,
	service_id   text COLLATE "C" NOT NULL,
	period_start bigint NOT NULL,
	threshold    text NOT NULL,
	status       text NOT NULL,
	next_attempt timestamptz,
	rec          jsonb NOT NULL,
	UNIQUE (user_id, service_id, period_start, threshold)
);
CREATE INDEX alerts_due ON alerts (next_attempt, seq) WHERE status = 'PENDING';

CREATE TABLE audit (
	seq bigserial PRIMARY KEY,
	rec jsonb NOT NULL
);
`,
	// 2: the hourly rollups of the ledger (internal/store/pgstore/rollups.go), per
	// subscription, endpoint, product and UTC hour, kept in the same
	// transaction as the rows they sum; made here from the rows already
	// in the ledger. Units are fixed point, billing.Scale to the unit.
	`
CREATE TABLE ledger_rollups (
	hour        timestamptz NOT NULL,
	user_id     text COLLATE "C" NOT NULL,
	service_id  text COLLATE "C" NOT NULL,
	endpoint_id text COLLATE "C" NOT NULL,
	product_id  text COLLATE "C" NOT NULL,
	calls       bigint NOT NULL,
	units       bigint NOT NULL,
	overage     bigint NOT NULL,
	cost        bigint NOT NULL,
	capped      bigint NOT NULL,
	PRIMARY KEY (hour, user_id, service_id, endpoint_id, product_id)
);
CREATE INDEX ledger_rollups_user ON ledger_rollups (user_id, hour);
INSERT INTO ledger_rollups
SELECT date_trunc('hour', time AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', user_id, service_id,
	coalesce(entry->>'endpointId', ''), coalesce(entry->>'productId', ''), count(*),
	coalesce(sum(round((entry->>'units')::numeric * 1000000)), 0)::bigint,
	coalesce(sum(round((entry->>'overage')::numeric * 1000000)), 0)::bigint,
	coalesce(sum(round((entry->>'cost')::numeric * 1000000)), 0)::bigint,
	count(*) FILTER (WHERE coalesce((entry->>'unitsClaimed')::numeric, 0) <> 0)
FROM ledger GROUP BY 1, 2, 3, 4, 5;
`,
	// 3: one index on the ledger instead of two. Rows arrive in time
	// order, so an index led by time takes each insert at its right edge,
	// where the unique index led by the call id (a random request id) put
	// each on a page of its own and the index on (time, seq) came on top:
	// a settlement batch's insert costs the database about a third less.
	// Unique on (time, call_id) as before; the scans that page the ledger
	// in (time, seq) order read it by time and sort the few rows of one
	// instant by seq. Builds the index over every partition once, with
	// the ledger's writes waiting (docs/fleet.md, "Upgrading").
	`
ALTER TABLE ledger ADD CONSTRAINT ledger_time_call_key UNIQUE (time, call_id);
ALTER TABLE ledger DROP CONSTRAINT ledger_call_id_time_key;
DROP INDEX ledger_time;
`,
	// 4: the hourly call outcomes (internal/store/pgstore/outcomes.go), one
	// row per node, hour, call dimension and outcome, so nodes never wait
	// on each other's rows; read summed over the nodes. gateway and
	// backend are store.LatencyBuckets counts then the sum in
	// microseconds. A writer's last applied batch is kept in the same
	// transaction as its rows, so a batch sent again is not counted twice.
	`
CREATE TABLE call_outcomes (
	node        text COLLATE "C" NOT NULL,
	hour        timestamptz NOT NULL,
	user_id     text COLLATE "C" NOT NULL,
	service_id  text COLLATE "C" NOT NULL,
	endpoint_id text COLLATE "C" NOT NULL,
	product_id  text COLLATE "C" NOT NULL,
	outcome     text COLLATE "C" NOT NULL,
	calls       bigint NOT NULL,
	gateway     bigint[] NOT NULL,
	backend     bigint[] NOT NULL,
	PRIMARY KEY (hour, user_id, service_id, endpoint_id, product_id, outcome, node)
);
CREATE TABLE call_outcome_writers (
	writer     text COLLATE "C" PRIMARY KEY,
	node       text COLLATE "C" NOT NULL,
	seq        bigint NOT NULL,
	updated_at timestamptz NOT NULL
);
`,
	// 5: what the payments integration keeps (internal/store/pgstore/payments.go,
	// store.Payments): records by kind and id, credit grants with the
	// reversals that took from them, and named leases with a cursor,
	// fenced by their epoch. Amounts are fixed point, billing.Scale to
	// the unit, as subscriptions.credits.
	`
CREATE TABLE payment_records (
	kind       text COLLATE "C" NOT NULL,
	id         text COLLATE "C" NOT NULL,
	body       bytea NOT NULL,
	updated_at timestamptz NOT NULL,
	PRIMARY KEY (kind, id)
);
CREATE TABLE credit_grants (
	id         text COLLATE "C" PRIMARY KEY,
	user_id    text COLLATE "C" NOT NULL,
	service_id text COLLATE "C" NOT NULL,
	credits    bigint NOT NULL,
	granted_at timestamptz NOT NULL,
	expires_at timestamptz,
	source     text NOT NULL DEFAULT '',
	reference  text NOT NULL DEFAULT '',
	reversed   bigint NOT NULL DEFAULT 0,
	expired    bigint NOT NULL DEFAULT 0,
	expired_at timestamptz
);
CREATE INDEX credit_grants_sub ON credit_grants (user_id, service_id, granted_at, id);
CREATE INDEX credit_grants_due ON credit_grants (expires_at) WHERE expired_at IS NULL AND expires_at IS NOT NULL;
CREATE TABLE credit_reversals (
	id       text COLLATE "C" PRIMARY KEY,
	grant_id text COLLATE "C" NOT NULL,
	credits  bigint NOT NULL,
	took     bigint NOT NULL,
	at       timestamptz NOT NULL,
	reason   text NOT NULL DEFAULT ''
);
CREATE TABLE payment_leases (
	name         text COLLATE "C" PRIMARY KEY,
	holder       text COLLATE "C" NOT NULL,
	epoch        bigint NOT NULL,
	expires_at   timestamptz,
	lease_cursor bytea
);
`,
	// 6: credits held at a grant's expiry expire as the holds give them
	// back (internal/store/pgstore/heldexpiry.go, store.ExpireGrantsHeld):
	// a grant's deferred part and what expired later, a subscription's
	// slack, and the credits of each lease row held at the expiry
	// (pre_credits), indexed while any is left.
	`
ALTER TABLE credit_grants ADD COLUMN expired_later bigint NOT NULL DEFAULT 0,
	ADD COLUMN deferred bigint NOT NULL DEFAULT 0;
ALTER TABLE subscriptions ADD COLUMN expiry_slack bigint NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN pre_credits bigint NOT NULL DEFAULT 0;
CREATE INDEX leases_pre ON leases (user_id, service_id) WHERE pre_credits > 0;
CREATE INDEX credit_grants_deferred ON credit_grants (user_id, service_id) WHERE deferred > 0;
`,
	// 7: what a lease row ended (returned or swept) expired of the
	// credits it held at a deferred expiry, kept under its name: a call
	// it served and shipped later (a lapse, a node restarted past
	// lease_ttl) is charged from these credits, which it spent, rather
	// than a second time (internal/store/pgstore/heldexpiry.go).
	`
CREATE TABLE lease_pre_ended (
	holder     text COLLATE "C" NOT NULL,
	user_id    text COLLATE "C" NOT NULL,
	service_id text COLLATE "C" NOT NULL,
	period     bigint NOT NULL,
	credits    bigint NOT NULL,
	ended_at   timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (holder, user_id, service_id, period)
);
`,
	// 8: a period's spend kept per cost unit (billing.Product.CostUnit:
	// credits, a currency, or "" for a listing without one): spend is
	// the spend in spend_unit, spend_other the spend in each other unit
	// ({"EUR": 2000000}, NULL when none). A row from before has no
	// spend_unit: all its spend is counted in the unit of the first
	// product that charges it (in any unit it is read in until then), as
	// before (spend.go).
	`
ALTER TABLE allowances ADD COLUMN spend_unit text, ADD COLUMN spend_other jsonb;
`,
	// 9: what lease rows held at a deferred expiry by the age of the
	// credits (store.HeldStack, internal/store/pgstore/heldexpiry.go):
	// under each grant's deferred credits, what they held that does not
	// expire (credits not from a grant, older grants not due); what is
	// above the newest is the subscription's expiry_slack. 0 in a stack
	// from before: all of its slack above, as before.
	`
ALTER TABLE credit_grants ADD COLUMN deferred_below bigint NOT NULL DEFAULT 0;
`,
	// 10: what a lease row's end gave back that does not expire under
	// the credits it expired (lease_pre_ended.below): a call the row
	// served and shipped later spent those first, oldest first, and
	// takes back the expiry only of what it spent beyond them
	// (internal/store/pgstore/heldexpiry.go). 0 in a row from before:
	// the expiry taken back first, as before.
	`
ALTER TABLE lease_pre_ended ADD COLUMN below bigint NOT NULL DEFAULT 0;
`,
}

// SchemaVersion is the schema this build migrates a database to.
var SchemaVersion = len(migrations)

// migrate brings the database to SchemaVersion under the advisory lock. A
// database migrated by a newer build is refused: this build does not know
// its tables.
func migrate(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrationLock)); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(migrationLock))
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgstore_migrations (
		version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	var current int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM pgstore_migrations").Scan(&current); err != nil {
		return err
	}
	if current > len(migrations) {
		return fmt.Errorf("the database's schema is version %d, newer than this gateway's %d: upgrade the gateway (every node of a fleet runs the same build)",
			current, len(migrations))
	}
	for v := current + 1; v <= len(migrations); v++ {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, migrations[v-1]); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO pgstore_migrations (version) VALUES ($1)", v)
			return err
		})
		if err != nil {
			return fmt.Errorf("schema migration %d: %w", v, err)
		}
	}
	// The statements name the ledger's sequence (ledgerSeq) rather than
	// look it up for every number they take.
	var same bool
	if err := conn.QueryRow(ctx, "SELECT pg_get_serial_sequence('ledger', 'seq')::regclass = "+ledgerSeq).Scan(&same); err != nil {
		return fmt.Errorf("the ledger's sequence: %w", err)
	}
	if !same {
		return errors.New("the ledger's seq column does not take its numbers from the sequence ledger_seq_seq of the schema's search path")
	}
	return nil
}

// ledgerSeq is the sequence of the ledger's seq column (its bigserial), as
// a constant: nextval(pg_get_serial_sequence('ledger', 'seq')) resolves the
// name again for every number, about 2.5 µs of the server's CPU each (10
// times nextval's own cost), and a shipment takes a number per call.
// migrate checks that it is the column's sequence.
const ledgerSeq = "'ledger_seq_seq'::regclass"

// monthStart is the first instant of t's month, UTC.
func monthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// partitionName names the ledger partition of the month starting at m.
func partitionName(m time.Time) string {
	return fmt.Sprintf("ledger_%04d_%02d", m.Year(), int(m.Month()))
}

// ensurePartition makes the ledger partition of t's month unless this
// node made or saw it already. Two nodes making the same one at once is
// fine: the loser's "already exists" is ignored. Only partitions of this
// month and later are remembered: an older one may be dropped by any
// node's prune (PruneLedger), so a row of a past month (an import, a
// settlement from just before the month turned) checks it each time.
func (s *Store) ensurePartition(ctx context.Context, t time.Time) error {
	m := monthStart(t)
	remember := !m.Before(monthStart(time.Now()))
	s.partMu.Lock()
	_, ok := s.partitions[m]
	s.partMu.Unlock()
	if ok && remember {
		return nil
	}
	sql := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF ledger FOR VALUES FROM ('%s') TO ('%s')`,
		partitionName(m), m.Format(time.RFC3339), m.AddDate(0, 1, 0).Format(time.RFC3339))
	if _, err := s.pool.Exec(ctx, sql); err != nil {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || (pe.Code != "42P07" && pe.Code != "23505") { // duplicate table; catalog race
			return s.fail(err)
		}
	}
	if remember {
		s.partMu.Lock()
		s.partitions[m] = struct{}{}
		s.partMu.Unlock()
	}
	return nil
}

// ensurePartitionsAhead makes this month's partition and the next two, so
// inserts at a month's turn never wait for one.
func (s *Store) ensurePartitionsAhead(ctx context.Context, now time.Time) error {
	m := monthStart(now)
	for i := range 3 {
		if err := s.ensurePartition(ctx, m.AddDate(0, i, 0)); err != nil {
			return err
		}
	}
	return nil
}
