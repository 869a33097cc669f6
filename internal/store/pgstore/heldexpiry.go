package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// Credits held at a grant's expiry (store.ExpireGrantsHeld): what an
// expiring grant has left only because it is held (credits_held: blocks
// leased to nodes, open jobs' holds) is deferred (credit_grants.deferred)
// and expires as those holds give it back unspent.
//
// The holds are the lease rows. The expiry, in the transaction that holds
// the subscription's row, marks every lease row of the subscription as
// held at the expiry (pre_credits = credits): a lease granted or topped up
// after it locks that row after the expiry's commit, so what it adds is
// not marked, whatever any node's clock says. What a row's charges take
// from it takes the marked credits first (the settlement batch); what the
// row gives back when it ends (a lease returned or swept, a job's end)
// gives back its marked credits left, and of those, past the
// subscription's slack (subscriptions.expiry_slack), the deferred credits
// expire, in the same transaction (giveBackDeferred). When no row has
// marked credits left, what is still deferred was charged.

// preHeld is what the subscription's lease rows still hold of what they
// held at its deferred expiry.
func preHeld(ctx context.Context, tx pgx.Tx, userID, serviceID string) (billing.Units, error) {
	var n int64
	err := tx.QueryRow(ctx, `SELECT coalesce(sum(least(pre_credits, credits)), 0)::bigint FROM leases
		WHERE user_id = $1 AND service_id = $2 AND pre_credits > 0`, userID, serviceID).Scan(&n)
	return billing.Units(n), err
}

// deferredGrants reads, locked, the subscription's grants with credits
// deferred, oldest first.
func deferredGrants(ctx context.Context, tx pgx.Tx, userID, serviceID string) ([]store.CreditGrant, error) {
	rows, err := tx.Query(ctx, "SELECT "+grantColumns+` FROM credit_grants
		WHERE user_id = $1 AND service_id = $2 AND deferred > 0 ORDER BY granted_at, id FOR UPDATE`, userID, serviceID)
	if err != nil {
		return nil, err
	}
	return scanGrants(rows)
}

// giveBackDeferred is called in the transaction that ended holds marked at
// a deferred expiry of the subscription, its row locked: they charged
// charged of their marked credits and gave back returned. It spends and
// expires the deferred credits as store.SpendDeferred and
// store.GiveBackDeferred say, closes the expiry when no marked credits are
// left, and returns what expired: the caller takes it off the balance.
func giveBackDeferred(ctx context.Context, tx pgx.Tx, userID, serviceID string, charged, returned billing.Units) (billing.Units, error) {
	gs, err := deferredGrants(ctx, tx, userID, serviceID)
	if err != nil || len(gs) == 0 {
		return 0, err
	}
	var slack int64
	if err := tx.QueryRow(ctx, "SELECT expiry_slack FROM subscriptions WHERE user_id = $1 AND service_id = $2 FOR UPDATE",
		userID, serviceID).Scan(&slack); err != nil {
		return 0, err
	}
	deferred := make([]billing.Units, len(gs))
	for i, g := range gs {
		deferred[i] = g.Deferred
	}
	spent := store.SpendDeferred(deferred, charged)
	for i := range deferred {
		deferred[i] -= spent[i]
	}
	exp, x, after := store.GiveBackDeferred(deferred, billing.Units(slack), returned)
	left, err := preHeld(ctx, tx, userID, serviceID)
	if err != nil {
		return 0, err
	}
	closed := left <= 0
	if closed {
		after = 0 // every hold the expiry waited for has ended: the rest was charged
	}
	now := time.Now().UTC()
	for i, g := range gs {
		d := deferred[i] - exp[i]
		if closed {
			d = 0
		}
		if d == g.Deferred && exp[i] == 0 {
			continue
		}
		if _, err := tx.Exec(ctx, `UPDATE credit_grants SET deferred = $2, expired = expired + $3, expired_later = expired_later + $3
			WHERE id = $1`, g.ID, int64(d), int64(exp[i])); err != nil {
			return 0, err
		}
		if exp[i] > 0 {
			if err := insertAudit(ctx, tx, grantAudit(g, now, "credits.expire",
				fmt.Sprintf("expired %s credits held at the expiry and given back unspent (grant %s)", exp[i], g.ID))); err != nil {
				return 0, err
			}
		}
	}
	if _, err := tx.Exec(ctx, "UPDATE subscriptions SET expiry_slack = $3 WHERE user_id = $1 AND service_id = $2",
		userID, serviceID, int64(after)); err != nil {
		return 0, err
	}
	return x, nil
}

// returnedPre is what returnSQL answers of the marked credits it gave
// back: per lease row, as [user, service, credits, holder, period],
// ordered by subscription.
type returnedPre [][5]json.RawMessage

// settleReturned gives back, per subscription, the marked credits the
// lease rows returnSQL ended held, and takes what expires off the
// balance. What each row's give-back expired is kept under the row's name
// (lease_pre_ended): the row may have ended with calls it served still to
// be shipped (a lapse, a node restarted past lease_ttl, a lapsed lease
// given back with calls in flight), and a charge of such a call spends
// those credits rather than others (unexpireLapsed).
func settleReturned(ctx context.Context, tx pgx.Tx, raw []byte) ([]store.AccountRef, error) {
	var rows returnedPre
	if err := json.Unmarshal(raw, &rows); err != nil {
		return nil, fmt.Errorf("returned lease credits: %w", err)
	}
	type ended struct {
		ref LeaseRef
		pre billing.Units
	}
	var changed []store.AccountRef
	for i := 0; i < len(rows); {
		var group []ended
		var sum billing.Units
		for ; i < len(rows); i++ {
			var e ended
			var pre int64
			for j, dst := range []any{&e.ref.Key.UserID, &e.ref.Key.ServiceID, &pre, &e.ref.Holder, &e.ref.Key.Period} {
				if err := json.Unmarshal(rows[i][j], dst); err != nil {
					return nil, fmt.Errorf("returned lease credits: %w", err)
				}
			}
			if len(group) > 0 && (e.ref.Key.UserID != group[0].ref.Key.UserID || e.ref.Key.ServiceID != group[0].ref.Key.ServiceID) {
				break
			}
			e.pre = billing.Units(pre)
			group = append(group, e)
			sum += e.pre
		}
		user, service := group[0].ref.Key.UserID, group[0].ref.Key.ServiceID
		x, err := giveBackDeferred(ctx, tx, user, service, 0, sum)
		if err != nil {
			return nil, err
		}
		if x <= 0 {
			continue
		}
		if err := addCredits(ctx, tx, user, service, -x); err != nil {
			return nil, err
		}
		changed = append(changed, store.AccountRef{UserID: user, ServiceID: service})
		left := x
		for _, e := range group {
			if left <= 0 {
				break
			}
			n := min(e.pre, left)
			if n <= 0 {
				continue // a row whose marked credits were spent
			}
			left -= n
			if _, err := tx.Exec(ctx, `INSERT INTO lease_pre_ended (holder, user_id, service_id, period, credits)
				VALUES ($1, $2, $3, $4, $5) ON CONFLICT (holder, user_id, service_id, period)
				DO UPDATE SET credits = lease_pre_ended.credits + EXCLUDED.credits, ended_at = now()`,
				e.ref.Holder, user, service, e.ref.Key.Period, int64(n)); err != nil {
				return nil, err
			}
		}
	}
	return changed, nil
}

// unexpireSQL takes $3 credits back off what the subscription's grants
// expired after their expiry (expired_later), the latest expiry first:
// a call charged from credits that expired as its lease row ended
// (lease_pre_ended) spent them.
const unexpireSQL = `WITH g AS (
	SELECT id, expired_later, sum(expired_later) OVER (ORDER BY expired_at DESC, granted_at DESC, id DESC) AS run
	FROM credit_grants WHERE user_id = $1 AND service_id = $2 AND expired_later > 0
), x AS (
	SELECT id, least(expired_later, greatest(0, $3::bigint - (run - expired_later))) AS n FROM g
)
UPDATE credit_grants c SET expired = c.expired - x.n, expired_later = c.expired_later - x.n
FROM x WHERE c.id = x.id AND x.n > 0`

// expireHeld is ExpireCredits' rule for one subscription in tx, its row
// locked: balance and held as read, grants all of its grants. A deferred
// expiry still open is kept out of this one: of what it defers, what its
// rows can still give back past its slack stays deferred (the newest of
// it), the rest was charged. When this one defers credits, every lease
// row of the subscription is marked (a deferred expiry still open joins
// it). It returns the grants due and the balance change.
func expireHeld(ctx context.Context, tx pgx.Tx, userID, serviceID string, balance, held billing.Units, grants []store.CreditGrant,
	now time.Time, hasSub bool) ([]store.CreditGrant, billing.Units, error) {
	var owed billing.Units
	var slack int64
	open := false
	for _, g := range grants {
		if g.Deferred > 0 {
			open = true
		}
	}
	if open && hasSub {
		if err := tx.QueryRow(ctx, "SELECT expiry_slack FROM subscriptions WHERE user_id = $1 AND service_id = $2",
			userID, serviceID).Scan(&slack); err != nil {
			return nil, 0, err
		}
		left, err := preHeld(ctx, tx, userID, serviceID)
		if err != nil {
			return nil, 0, err
		}
		can := max(0, left-billing.Units(slack))
		for i := len(grants) - 1; i >= 0; i-- {
			g := &grants[i]
			if g.Deferred <= 0 {
				continue
			}
			keep := min(g.Deferred, can)
			if keep != g.Deferred {
				if _, err := tx.Exec(ctx, "UPDATE credit_grants SET deferred = $2 WHERE id = $1", g.ID, int64(keep)); err != nil {
					return nil, 0, err
				}
				g.Deferred = keep
			}
			can -= keep
			owed += keep
		}
	}
	if !hasSub {
		held = 0
	}
	expired, after, newSlack := store.ExpireGrantsHeld(balance-owed, held-owed, grants, now)
	var deferred billing.Units
	for _, g := range expired {
		deferred += g.Deferred
		if _, err := tx.Exec(ctx, "UPDATE credit_grants SET expired = $2, expired_at = $3, deferred = $4 WHERE id = $1",
			g.ID, int64(g.Expired), g.ExpiredAt, int64(g.Deferred)); err != nil {
			return nil, 0, err
		}
		detail := fmt.Sprintf("expired %s credits left of %s (grant %s)", g.Expired, g.Credits, g.ID)
		if g.Deferred > 0 {
			detail += fmt.Sprintf("; %s more held at the expiry expire as the holds give them back unspent", g.Deferred)
		}
		if err := insertAudit(ctx, tx, grantAudit(g, now, "credits.expire", detail)); err != nil {
			return nil, 0, err
		}
	}
	if deferred > 0 {
		if _, err := tx.Exec(ctx, "UPDATE leases SET pre_credits = credits WHERE user_id = $1 AND service_id = $2 AND credits > 0",
			userID, serviceID); err != nil {
			return nil, 0, err
		}
		if _, err := tx.Exec(ctx, "UPDATE subscriptions SET expiry_slack = $3 WHERE user_id = $1 AND service_id = $2",
			userID, serviceID, int64(newSlack)); err != nil {
			return nil, 0, err
		}
	}
	return expired, after + owed - balance, nil
}

// readPreEnded reads, locked, what the ended lease rows the batch's
// charges come from expired of their marked credits (lease_pre_ended);
// alive says which rows are still there. Nothing is read when every row
// is (the hot path: no lease ended under a call in flight).
func readPreEnded(ctx context.Context, conn *pgxpool.Conn, batch []*settlement, alive func(string, AllowanceKey) bool) (map[LeaseRef]billing.Units, error) {
	var hs, us, ss []string
	var ps []int64
	seen := map[LeaseRef]bool{}
	for _, st := range batch {
		r := LeaseRef{st.holder, st.key}
		if st.free || st.holder == "" || st.consume.Credits <= 0 || seen[r] || alive(st.holder, st.key) {
			continue
		}
		seen[r] = true
		hs, us, ss, ps = append(hs, r.Holder), append(us, r.Key.UserID), append(ss, r.Key.ServiceID), append(ps, r.Key.Period)
	}
	if len(hs) == 0 {
		return nil, nil
	}
	rows, err := conn.Query(ctx, `SELECT e.holder, e.user_id, e.service_id, e.period, e.credits FROM lease_pre_ended e
		JOIN unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) k(h, u, sv, p)
		  ON e.holder = k.h AND e.user_id = k.u AND e.service_id = k.sv AND e.period = k.p
		ORDER BY 1, 2, 3, 4 FOR UPDATE OF e`, hs, us, ss, ps)
	if err != nil {
		return nil, err
	}
	out := map[LeaseRef]billing.Units{}
	for rows.Next() {
		var r LeaseRef
		var n int64
		if err := rows.Scan(&r.Holder, &r.Key.UserID, &r.Key.ServiceID, &r.Key.Period, &n); err != nil {
			rows.Close()
			return nil, err
		}
		out[r] = billing.Units(n)
	}
	return out, rows.Err()
}

// queueUnexpired queues, in the settlement batch's transaction, what the
// batch's charges spent of credits their ended lease rows had expired:
// lease_pre_ended as left, the grants' expiry taken back by as much
// (unexpireSQL; the charges took them off the balance again) and an audit
// entry per subscription.
func queueUnexpired(b *pgx.Batch, lapsed map[LeaseRef]billing.Units, unexpired map[subKey]billing.Units) {
	if len(unexpired) == 0 {
		return
	}
	for r, n := range lapsed {
		if n > 0 {
			b.Queue(`UPDATE lease_pre_ended SET credits = $5 WHERE holder = $1 AND user_id = $2 AND service_id = $3 AND period = $4`,
				r.Holder, r.Key.UserID, r.Key.ServiceID, r.Key.Period, int64(n))
		} else {
			b.Queue(`DELETE FROM lease_pre_ended WHERE holder = $1 AND user_id = $2 AND service_id = $3 AND period = $4`,
				r.Holder, r.Key.UserID, r.Key.ServiceID, r.Key.Period)
		}
	}
	now := time.Now().UTC()
	for k, n := range unexpired {
		b.Queue(unexpireSQL, k.user, k.service, int64(n))
		b.Queue(`INSERT INTO audit (seq, rec)
		SELECT n, jsonb_set($1::jsonb, '{seq}', to_jsonb(n)) FROM (SELECT nextval(pg_get_serial_sequence('audit', 'seq')) AS n) q`,
			store.AuditEntry{Time: now, Actor: "payments", Action: "credits.unexpire", UserID: k.user, ServiceID: k.service,
				Detail: fmt.Sprintf("took back the expiry of %s credits: calls served from a lease held at the expiry were charged them after the lease ended", n)})
	}
}
