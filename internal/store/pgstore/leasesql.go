package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// pgLeases is LeaseDB on PostgreSQL. Rows are locked in one order
// everywhere (subscription, allowance, lease) so that grants, returns and
// settlements never deadlock one another.
type pgLeases struct{ s *Store }

// querier runs statements on the pool or in a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// grantSQL leases $6.. (big) if every limit allows it, else $9.. (small),
// in one statement: the subscription row (prepaid) and the allowance row
// are locked and checked, and the lease row upserted, atomically. The
// condition is the whole protocol: settled + leased + asked <= limit, as
// billing.Decide judges it: asking no units or no spend never crosses a
// quota or a cap (a call of cost 0 past a quota a report overdrew), while
// a balance below zero refuses even a call that costs nothing.
// $1 holder, $2 user, $3 service, $4 period, $5 ttl seconds, $6-$8 big
// units/spend/credits, $9-$11 small, $12 unit limit, $13 spend limit
// (NULL: none), $14 whether credits are bounded, $15 a spending cap on
// overage past the quota $12 (NULL: none; unitBoundSQL), $16 the price,
// $17 the cost unit the spend limits count (spendInSQL).
//
// The sums are taken in numeric: a report is charged past the hard
// limits, so a period's usage and spend may sit at the most a bigint
// holds (they saturate there) and a balance at the least; in bigint,
// settled plus leased plus asked failed with "bigint out of range", every
// call of the subscription a 500 where the embedded store refuses it as
// past the limit (storetest SaturatedCountersRefuse).
//
// A holder's row that has expired is never added to (nor its expiry moved:
// the upsert would revive it, as a renewal never does): the statement
// grants nothing and answers 'x' (errLeaseExpired).
const grantSQL = `
WITH sb AS (
	SELECT credits::numeric - credits_held AS avail FROM subscriptions
	WHERE user_id = $2 AND service_id = $3 AND $14::bool FOR UPDATE
), av AS (
	SELECT CASE WHEN $14::bool THEN (SELECT avail FROM sb) ELSE 9223372036854775807 END AS avail
), ex AS (
	SELECT 'x'::text AS k FROM leases
	WHERE holder = $1 AND user_id = $2 AND service_id = $3 AND period = $4 AND expires_at <= now()
), b AS (
	UPDATE allowances SET leased_units = leased_units + $6, leased_spend = leased_spend + $7
	WHERE user_id = $2 AND service_id = $3 AND period = $4 AND NOT EXISTS (SELECT 1 FROM ex)
	  AND ($12::bigint IS NULL OR $6 = 0 OR used::numeric + leased_units + $6 <= ` + unitBoundSQL + `)
	  AND ($13::bigint IS NULL OR $7 = 0 OR ` + spendInSQL + `::numeric + leased_spend + $7 <= $13)
	  AND (SELECT avail FROM av) >= $8
	RETURNING 'b'::text AS k
), sm AS (
	UPDATE allowances SET leased_units = leased_units + $9, leased_spend = leased_spend + $10
	WHERE user_id = $2 AND service_id = $3 AND period = $4 AND NOT EXISTS (SELECT 1 FROM b) AND NOT EXISTS (SELECT 1 FROM ex)
	  AND ($12::bigint IS NULL OR $9 = 0 OR used::numeric + leased_units + $9 <= ` + unitBoundSQL + `)
	  AND ($13::bigint IS NULL OR $10 = 0 OR ` + spendInSQL + `::numeric + leased_spend + $10 <= $13)
	  AND (SELECT avail FROM av) >= $11
	RETURNING 's'::text AS k
), g AS (
	SELECT k, CASE k WHEN 'b' THEN $6 ELSE $9 END::bigint AS u, CASE k WHEN 'b' THEN $7 ELSE $10 END::bigint AS sp,
		CASE k WHEN 'b' THEN $8 ELSE $11 END::bigint AS c
	FROM (SELECT k FROM b UNION ALL SELECT k FROM sm) x
), cr AS (
	UPDATE subscriptions SET credits_held = credits_held + g.c FROM g
	WHERE user_id = $2 AND service_id = $3 AND $14::bool
), l AS (
	INSERT INTO leases (holder, user_id, service_id, period, units, spend, credits, expires_at)
	SELECT $1, $2, $3, $4, g.u, g.sp, g.c, now() + $5 * interval '1 second' FROM g
	ON CONFLICT (holder, user_id, service_id, period) DO UPDATE SET
		units = leases.units + EXCLUDED.units, spend = leases.spend + EXCLUDED.spend,
		credits = leases.credits + EXCLUDED.credits, expires_at = EXCLUDED.expires_at
)
SELECT k FROM g UNION ALL SELECT k FROM ex`

// unitBoundSQL is billing.HardLimits.UnitsBound of the allowance row in
// grantSQL: the unit limit $12, or with a cap $15 on overage past the
// quota $12 at price $16, the quota or the units used past it plus the
// most overage units u whose cost billing.Mul(u, $16) (rounded half up
// to a millionth) fits in what spend leaves of the cap. In numeric, so
// that nothing overflows, with div (the dividend is positive: its
// quotient truncated), not floor of "/": numeric "/" rounds a quotient
// of more than 16 significant digits to a whole number, a millionth of
// a unit past the bound (a cap of 100000 at 0.000003 a unit). Computed in the statement, from the row it
// locks: the units the whole cap buys, bounded beside the quota, did
// not see spend recorded earlier in the period under another product.
const unitBoundSQL = `(CASE WHEN $15::bigint IS NULL THEN $12::numeric
	ELSE greatest($12::bigint, used)::numeric + CASE WHEN ` + spendInSQL + ` > $15 THEN 0
		ELSE div(($15::bigint - greatest(` + spendInSQL + `, 0) + 1)::numeric * 1000000 - 500001, $16::bigint) END END)`

// spendInSQL is the allowance row's spend in the cost unit $17 (row.spendIn):
// spend when the row counts it in $17 or does not say (a row from before
// schema version 8), else what spend_other holds in $17.
const spendInSQL = `(CASE WHEN spend_unit IS NULL OR spend_unit = $17::text THEN spend
	ELSE coalesce((spend_other->>$17::text)::bigint, 0) END)`

const ensureAllowanceSQL = `INSERT INTO allowances (user_id, service_id, period) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`

func nullable(u *billing.Units) any {
	if u == nil {
		return nil
	}
	return int64(*u)
}

// row is an allowance and its subscription's balance as read.
type row struct {
	used, leased, spend, leasedSpend, credits, creditsHeld billing.Units
	hasSub                                                 bool
	// unit is the cost unit spend is counted in, when unitSet; other
	// the spend in other units, as spend_other's text (spend.go).
	unit    string
	unitSet bool
	other   string
}

func (r row) left(lim Limits) Vec {
	var v Vec
	if lim.Units != nil {
		v.Units = billing.HardLimits(lim).UnitsBound(r.used, r.spendIn(lim.Unit)) - r.used - r.leased
	}
	if lim.Spend != nil {
		v.Spend = *lim.Spend - r.spendIn(lim.Unit) - r.leasedSpend
	}
	if lim.Credits {
		v.Credits = r.credits - r.creditsHeld
	}
	return v
}

// refusedIn names the first dimension need does not fit in, in the order
// billing.Decide checks its limits (quota, credits, cap), so that a call
// is told what Decide would tell it: a PREPAID product with a spending
// cap, out of credits and past its cap, answered 429 quota_exceeded
// where Decide (and the embedded store) answers 403 insufficient_credits.
// As in grantSQL, no units and no spend fit whatever is left.
func refusedIn(need, left Vec) int {
	switch {
	case need.Units > 0 && need.Units > left.Units:
		return DimUnits
	case need.Credits > left.Credits:
		return DimCredits
	case need.Spend > 0 && need.Spend > left.Spend:
		return DimSpend
	}
	return DimNone
}

// Grant runs grantSQL in one round trip: the allowance row is made if
// missing, the lease taken, and the row read back for the next block's
// size (and a refusal's reason), all pipelined.
func (p pgLeases) Grant(ctx context.Context, holder string, k AllowanceKey, lim Limits, big, small Vec, ttl time.Duration) (Grant, error) {
	g, r, err := grant(ctx, p.s.pool, holder, k, lim, big, small, ttl)
	if err == nil && r.hasSub {
		p.s.learn(k, r)
	}
	return g, err
}

func grant(ctx context.Context, q querier, holder string, k AllowanceKey, lim Limits, big, small Vec, ttl time.Duration) (Grant, row, error) {
	b := &pgx.Batch{}
	b.Queue(ensureAllowanceSQL, k.UserID, k.ServiceID, k.Period)
	b.Queue(grantSQL, holder, k.UserID, k.ServiceID, k.Period, ttl.Seconds(),
		int64(big.Units), int64(big.Spend), int64(big.Credits), int64(small.Units), int64(small.Spend), int64(small.Credits),
		nullable(lim.Units), nullable(lim.Spend), lim.Credits, nullable(lim.OverageCap), int64(lim.Price), lim.Unit)
	b.Queue(stateSQL, k.UserID, k.ServiceID, k.Period)
	br := q.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return Grant{}, row{}, err
	}
	var kind string
	if err := br.QueryRow().Scan(&kind); err != nil && err != pgx.ErrNoRows {
		return Grant{}, row{}, err
	}
	r, err := scanRow(br.QueryRow())
	if err != nil {
		return Grant{}, row{}, err
	}
	g := Grant{Left: r.left(lim)}
	switch kind {
	case "b":
		g.Granted, g.OK = big, true
	case "s":
		g.Granted, g.OK = small, true
	case "x":
		return Grant{}, row{}, errLeaseExpired
	default:
		if !r.hasSub {
			return Grant{}, row{}, errNoSub
		}
		g.Refused = refusedIn(small, g.Left)
	}
	return g, r, br.Close()
}

func scanRow(r pgx.Row) (row, error) {
	var used, leased, spend, ls, credits, held int64
	var unit, other *string
	var out row
	err := r.Scan(&used, &leased, &spend, &ls, &credits, &held, &out.hasSub, &unit, &other)
	if err == pgx.ErrNoRows {
		return out, nil
	}
	if unit != nil {
		out.unit, out.unitSet = *unit, true
	}
	if other != nil {
		out.other = *other
	}
	out.used, out.leased, out.spend, out.leasedSpend = billing.Units(used), billing.Units(leased), billing.Units(spend), billing.Units(ls)
	out.credits, out.creditsHeld = billing.Units(credits), billing.Units(held)
	return out, err
}

// Renew extends the leases of holders that have not expired. The leases
// other holders let expire are read in the same request (one implicit
// transaction), for the sweep that follows (sweepExpired).
func (p pgLeases) Renew(ctx context.Context, holders []string, ttl time.Duration) ([]string, error) {
	b := &pgx.Batch{}
	b.Queue(`UPDATE leases SET expires_at = now() + $2 * interval '1 second'
		WHERE holder = ANY($1) AND expires_at > now() RETURNING holder`, holders, ttl.Seconds())
	b.Queue(expiredSQL)
	br := p.s.pool.SendBatch(ctx, b)
	defer br.Close()
	rows, _ := br.Query()
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, p.s.fail(err)
	}
	rows, _ = br.Query()
	refs, err := pgx.CollectRows(rows, scanLeaseRef)
	if err != nil {
		return nil, p.s.fail(err)
	}
	p.s.expiredMu.Lock()
	p.s.expired, p.s.expiredRead = refs, true
	p.s.expiredMu.Unlock()
	return out, p.s.fail(br.Close())
}

// expiredSQL reads the leases past their expiry, oldest first, a bounded
// number at a time.
const expiredSQL = `SELECT holder, user_id, service_id, period FROM leases
	WHERE expires_at < now() ORDER BY expires_at LIMIT 1024`

func scanLeaseRef(r pgx.CollectableRow) (LeaseRef, error) {
	var l LeaseRef
	return l, r.Scan(&l.Holder, &l.Key.UserID, &l.Key.ServiceID, &l.Key.Period)
}

// returnSQL ends leases and gives back what they still hold, locking the
// rows in the order every statement does (subscriptions, allowances,
// leases). $1-$4: holders, users, services, periods; $5: only those
// expired (the sweep: a lease renewed meanwhile is kept).
const returnSQL = `
WITH k AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS k(h, u, sv, p)
), sb AS (
	SELECT 1 FROM subscriptions s WHERE (s.user_id, s.service_id) IN (SELECT u, sv FROM k)
	ORDER BY s.user_id, s.service_id FOR UPDATE
), al AS (
	SELECT 1 FROM allowances a WHERE (a.user_id, a.service_id, a.period) IN (SELECT u, sv, p FROM k)
	ORDER BY a.user_id, a.service_id, a.period FOR UPDATE
), d AS (
	DELETE FROM leases l USING k
	WHERE l.holder = k.h AND l.user_id = k.u AND l.service_id = k.sv AND l.period = k.p
	  AND (NOT $5::bool OR l.expires_at < now())
	  AND (SELECT count(*) FROM sb) >= 0 AND (SELECT count(*) FROM al) >= 0
	RETURNING l.holder, l.user_id, l.service_id, l.period, l.units, l.spend, l.credits, least(l.pre_credits, l.credits) AS pre
), a AS (
	UPDATE allowances x SET leased_units = x.leased_units - d.units, leased_spend = x.leased_spend - d.spend
	FROM (SELECT user_id, service_id, period, sum(units) AS units, sum(spend) AS spend FROM d GROUP BY 1, 2, 3) d
	WHERE x.user_id = d.user_id AND x.service_id = d.service_id AND x.period = d.period
), c AS (
	UPDATE subscriptions x SET credits_held = x.credits_held - d.credits
	FROM (SELECT user_id, service_id, sum(credits) AS credits FROM d GROUP BY 1, 2) d
	WHERE x.user_id = d.user_id AND x.service_id = d.service_id AND d.credits <> 0
), pr AS (
	-- Also a row whose marked credits its calls spent (pre 0): its end
	-- may be the last of the expiry's holds, which then closes.
	SELECT d.holder, d.user_id, d.service_id, d.period, d.pre::bigint AS pre FROM d
	WHERE d.pre > 0 OR EXISTS (SELECT 1 FROM credit_grants g
		WHERE g.user_id = d.user_id AND g.service_id = d.service_id AND g.deferred > 0)
)
SELECT (SELECT count(*) FROM d), coalesce((SELECT json_agg(json_build_array(user_id, service_id, pre, holder, period)
	ORDER BY user_id, service_id, holder, period) FROM pr)::text, '[]')`

// returnLeases runs returnSQL, and in the same transaction expires what
// the rows gave back of the credits they held at a deferred expiry of
// their subscription (pre_credits, heldexpiry.go). It returns how many
// rows it ended.
func (s *Store) returnLeases(ctx context.Context, refs []LeaseRef, onlyExpired bool) (int, error) {
	hs, us, ss, ps := make([]string, len(refs)), make([]string, len(refs)), make([]string, len(refs)), make([]int64, len(refs))
	for i, r := range refs {
		hs[i], us[i], ss[i], ps[i] = r.Holder, r.Key.UserID, r.Key.ServiceID, r.Key.Period
	}
	var n int
	var changed []store.AccountRef
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var pre string
		if err := tx.QueryRow(ctx, returnSQL, hs, us, ss, ps, onlyExpired).Scan(&n, &pre); err != nil {
			return err
		}
		if pre == "[]" {
			return nil
		}
		var err error
		changed, err = settleReturned(ctx, tx, []byte(pre))
		return err
	})
	if err != nil {
		return 0, err
	}
	for _, r := range changed {
		// What expired had just come back: the free balance did not go
		// down, so the node's leases stand.
		s.changedCredits(r.UserID, r.ServiceID, false)
	}
	return n, nil
}

// returnPartSQL takes part of what a lease row holds off it, and off its
// allowance and subscription, locking the rows in the order every
// statement does (subscriptions, allowances, leases). Only a row that has
// not expired and holds at least the part: an expired one is the sweep's.
// $1 holder, $2 user, $3 service, $4 period, $5-$7 units, spend, credits.
const returnPartSQL = `
WITH sb AS (
	SELECT 1 FROM subscriptions WHERE user_id = $2 AND service_id = $3 FOR UPDATE
), al AS (
	SELECT 1 FROM allowances WHERE user_id = $2 AND service_id = $3 AND period = $4 FOR UPDATE
), l AS (
	UPDATE leases SET units = units - $5, spend = spend - $6, credits = credits - $7,
		pre_credits = greatest(least(pre_credits, credits) - $7, 0)
	WHERE holder = $1 AND user_id = $2 AND service_id = $3 AND period = $4 AND expires_at > now()
	  AND units >= $5 AND spend >= $6 AND credits >= $7
	  AND (SELECT count(*) FROM sb) >= 0 AND (SELECT count(*) FROM al) >= 0
	RETURNING 1
), a AS (
	UPDATE allowances SET leased_units = leased_units - $5, leased_spend = leased_spend - $6
	WHERE user_id = $2 AND service_id = $3 AND period = $4 AND EXISTS (SELECT 1 FROM l)
), c AS (
	UPDATE subscriptions SET credits_held = credits_held - $7
	WHERE user_id = $2 AND service_id = $3 AND $7 <> 0 AND EXISTS (SELECT 1 FROM l)
)
SELECT count(*) FROM l`

// ReturnPart takes part off a live lease row. What it gives back of the
// credits the row held at a deferred expiry of its subscription
// (pre_credits, heldexpiry.go; taken first, as a whole row's return
// does) expires in the same transaction, as far as the expiry deferred
// it: given back into the balance, it was credits of an expired grant the
// caller kept (TestExpiredBlockPartlyReturnedAtAPriceChange).
func (p pgLeases) ReturnPart(ctx context.Context, ref LeaseRef, part Vec) error {
	var err error
	var expired billing.Units
	for attempt := 0; attempt < 5; attempt++ {
		expired, err = p.s.returnPart(ctx, ref, part)
		if !retryable(err) {
			break
		}
	}
	if err == nil && expired > 0 {
		// What expired had just come back: the free balance did not go
		// down, so the node's leases stand.
		p.s.changedCredits(ref.Key.UserID, ref.Key.ServiceID, false)
	}
	return p.s.fail(err)
}

func (s *Store) returnPart(ctx context.Context, ref LeaseRef, part Vec) (billing.Units, error) {
	var expired billing.Units
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		expired = 0
		// The rows locked in returnPartSQL's order before the lease row
		// is read for what it held at the expiry.
		if _, err := tx.Exec(ctx, `SELECT 1 FROM subscriptions WHERE user_id = $1 AND service_id = $2 FOR UPDATE`,
			ref.Key.UserID, ref.Key.ServiceID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM allowances WHERE user_id = $1 AND service_id = $2 AND period = $3 FOR UPDATE`,
			ref.Key.UserID, ref.Key.ServiceID, ref.Key.Period); err != nil {
			return err
		}
		var pre int64
		err := tx.QueryRow(ctx, `SELECT least(pre_credits, credits) FROM leases
			WHERE holder = $1 AND user_id = $2 AND service_id = $3 AND period = $4 FOR UPDATE`,
			ref.Holder, ref.Key.UserID, ref.Key.ServiceID, ref.Key.Period).Scan(&pre)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // gone meanwhile: nothing to give back
		} else if err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, returnPartSQL, ref.Holder, ref.Key.UserID, ref.Key.ServiceID, ref.Key.Period,
			int64(part.Units), int64(part.Spend), int64(part.Credits)).Scan(&n); err != nil {
			return err
		}
		given := min(max(pre, 0), int64(part.Credits))
		if n == 0 || given <= 0 {
			return nil
		}
		x, err := giveBackDeferred(ctx, tx, ref.Key.UserID, ref.Key.ServiceID, billing.Units(given))
		if err != nil || x <= 0 {
			return err
		}
		expired = x
		return addCredits(ctx, tx, ref.Key.UserID, ref.Key.ServiceID, -x)
	})
	return expired, err
}

// Return ends leases, giving back what they hold, in one statement.
func (p pgLeases) Return(ctx context.Context, refs []LeaseRef) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if _, err = p.s.returnLeases(ctx, refs, false); !retryable(err) {
			break
		}
	}
	return p.s.fail(err)
}

// sweepExpired gives back the leases whose holders let them expire (a
// node that died, or lost the database for longer than the TTL), oldest
// first, a bounded number per call, in one statement.
//
// A node sweeps only once it has reached PostgreSQL without a failure for
// the lease TTL (sweepReady): a database down (or failed over, or cut off
// from the nodes) for longer than the TTL lets every row expire on its
// clock, those of live nodes too, whose charges acknowledged meanwhile
// (in the settlement log, or waiting for the group commit) consume from
// them. Swept at once when the database came back, before their holders
// had shipped those charges, the units were leased and served again by
// another node and the charges, finding no lease row, cut at the limit
// (TestDatabaseDownPastLeaseTTL). A node that saw the outage too leaves
// the holders the TTL to write them.
func (s *Store) sweepExpired(ctx context.Context) (int, error) {
	s.expiredMu.Lock()
	refs, read := s.expired, s.expiredRead
	s.expired, s.expiredRead = nil, false
	s.expiredMu.Unlock()
	if !read {
		// No renewal read them just now.
		rows, err := s.pool.Query(ctx, expiredSQL)
		if err != nil {
			return 0, s.fail(err)
		}
		if refs, err = pgx.CollectRows(rows, scanLeaseRef); err != nil {
			return 0, s.fail(err)
		}
	}
	// Read even when not ready: the read is how an idle node finds the
	// database unreachable (fail).
	if len(refs) == 0 || !s.sweepReady() {
		return 0, nil
	}
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var n int
		// Still expired when locked: a holder cannot revive it (Renew
		// skips expired rows).
		if n, err = s.returnLeases(ctx, refs, true); !retryable(err) {
			return n, s.fail(err)
		}
	}
	return 0, s.fail(err)
}

// sweepReady reports whether the node's maintenance has reached
// PostgreSQL without a failure for the lease TTL, since it last found it
// unreachable or since the node started (sweepExpired).
func (s *Store) sweepReady() bool {
	return time.Since(s.born)-time.Duration(s.lastDown.Load()) >= s.opts.LeaseTTL
}

var errNoSub = fmt.Errorf("no subscription for the allowance")
