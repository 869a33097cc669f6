package pgstore

import (
	"context"
	"encoding/json"
	"errors"
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
// gives back its marked credits left, in the same transaction
// (giveBackDeferred).
//
// What the rows hold at the expiry is kept by the age of the credits
// (store.HeldStack): each grant's deferred credits (credit_grants.deferred),
// what does not expire under them (deferred_below: credits not from a
// grant, older grants not due) and above the newest (the subscription's
// expiry_slack). Credits are spent oldest first, so what the rows charge
// is taken from the bottom (the deferred credits it takes are spent) and
// what they give back from the top (the deferred credits it takes
// expire). A charge is not seen when it is made (the settlement batch
// only lowers the row's marked credits); the next give-back takes off the
// bottom what the stack holds beyond what the rows still have marked.
// When no row has marked credits left, what is still deferred was
// charged.

// preHeld is what the subscription's lease rows still hold of what they
// held at its deferred expiry.
func preHeld(ctx context.Context, tx pgx.Tx, userID, serviceID string) (billing.Units, error) {
	var n int64
	err := tx.QueryRow(ctx, `SELECT coalesce(sum(least(pre_credits, credits)), 0)::bigint FROM leases
		WHERE user_id = $1 AND service_id = $2 AND pre_credits > 0`, userID, serviceID).Scan(&n)
	return billing.Units(n), err
}

// stackGrants reads, locked, the subscription's grants in its deferred
// expiry's stack (credits deferred, or held under them), oldest first,
// and the stack.
func stackGrants(ctx context.Context, tx pgx.Tx, userID, serviceID string) ([]store.CreditGrant, store.HeldStack, error) {
	rows, err := tx.Query(ctx, "SELECT "+grantColumns+`, deferred_below FROM credit_grants
		WHERE user_id = $1 AND service_id = $2 AND (deferred > 0 OR deferred_below > 0) ORDER BY granted_at, id FOR UPDATE`,
		userID, serviceID)
	if err != nil {
		return nil, store.HeldStack{}, err
	}
	var st store.HeldStack
	gs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.CreditGrant, error) {
		var below int64
		g, err := scanGrant(extraScan{r, []any{&below}})
		st.Layers = append(st.Layers, store.HeldLayer{ID: g.ID, Below: billing.Units(below), Deferred: g.Deferred})
		return g, err
	})
	if err != nil || len(gs) == 0 {
		return nil, store.HeldStack{}, err
	}
	var slack int64
	if err := tx.QueryRow(ctx, "SELECT expiry_slack FROM subscriptions WHERE user_id = $1 AND service_id = $2 FOR UPDATE",
		userID, serviceID).Scan(&slack); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, store.HeldStack{}, err
	}
	st.Top = billing.Units(slack)
	return gs, st, nil
}

// extraScan scans a row's columns past those its Scan is given into extra.
type extraScan struct {
	pgx.Row
	extra []any
}

func (r extraScan) Scan(dest ...any) error { return r.Row.Scan(append(dest, r.extra...)...) }

// putStack writes what changed of the stack gs were read with (st) in
// after: the grants' deferred and deferred_below, exp[i] more expired of
// gs[i] (with its audit entry), and the slack above them.
func putStack(ctx context.Context, tx pgx.Tx, userID, serviceID string, gs []store.CreditGrant, st, after store.HeldStack, exp []billing.Units) error {
	now := time.Now().UTC()
	for i, g := range gs {
		l, was := after.Layers[i], st.Layers[i]
		var x billing.Units
		if exp != nil {
			x = exp[i]
		}
		if l == was && x == 0 {
			continue
		}
		if _, err := tx.Exec(ctx, `UPDATE credit_grants SET deferred = $2, deferred_below = $3, expired = expired + $4,
			expired_later = expired_later + $4 WHERE id = $1`, g.ID, int64(l.Deferred), int64(l.Below), int64(x)); err != nil {
			return err
		}
		if x > 0 {
			if err := insertAudit(ctx, tx, grantAudit(g, now, "credits.expire",
				fmt.Sprintf("expired %s credits held at the expiry and given back unspent (grant %s)", x, g.ID))); err != nil {
				return err
			}
		}
	}
	if after.Top == st.Top {
		return nil
	}
	_, err := tx.Exec(ctx, "UPDATE subscriptions SET expiry_slack = $3 WHERE user_id = $1 AND service_id = $2",
		userID, serviceID, int64(after.Top))
	return err
}

// chargedHeld takes off the bottom of st what it holds beyond what the
// subscription's lease rows still have marked (left): the rows' charges
// since it was last written. With nothing marked left, every hold the
// expiry waited for has ended: all of it was charged.
func chargedHeld(st store.HeldStack, left billing.Units) store.HeldStack {
	if left <= 0 {
		st, _ = st.Charge(st.Total())
		return st
	}
	st, _ = st.Charge(st.Total() - left)
	return st
}

// giveBackDeferred is called in the transaction that ended holds marked at
// a deferred expiry of the subscription, its row locked, once they are
// off their lease rows: they gave back returned of their marked credits
// (what they charged is what the rows' marks went down by). It takes
// returned off the top of the stack (the deferred credits it takes
// expire), then what was charged off the bottom (chargedHeld), closes the
// expiry when no marked credits are left, and returns what expired: the
// caller takes it off the balance.
func giveBackDeferred(ctx context.Context, tx pgx.Tx, userID, serviceID string, returned billing.Units) (billing.Units, error) {
	_, x, err := giveBackEnded(ctx, tx, userID, serviceID, []billing.Units{returned})
	return x, err
}

// giveBackEnded is giveBackDeferred for holds that gave back pres[i]
// each, taken off the top of the stack in that order (the first the
// top); it also returns what each one's part expired (preEnded).
func giveBackEnded(ctx context.Context, tx pgx.Tx, userID, serviceID string, pres []billing.Units) ([]preEnded, billing.Units, error) {
	gs, st, err := stackGrants(ctx, tx, userID, serviceID)
	if err != nil || len(gs) == 0 {
		return nil, 0, err
	}
	var returned billing.Units
	for _, p := range pres {
		returned += max(p, 0)
	}
	after, exp, x := st.GiveBack(returned)
	parts := endedParts(st, after, exp, pres)
	left, err := preHeld(ctx, tx, userID, serviceID)
	if err != nil {
		return nil, 0, err
	}
	after = chargedHeld(after, left)
	return parts, x, putStack(ctx, tx, userID, serviceID, gs, st, after, exp)
}

// preEnded is what a hold's give-back expired (credits) and, under the
// lowest of it, what the give-back took that does not expire (below): a
// call the hold served and charged later spent its credits oldest first,
// below first, and only past below the credits that expired.
type preEnded struct {
	credits, below billing.Units
}

// endedParts splits what GiveBack took off st (after, exp) among holds
// that gave back pres[i] each, the first the top of it: each one's
// expired credits, and the credits that do not expire under the lowest
// of them (credits of the stack's top, above every deferred credit, and
// those between deferred credits are left out: a late charge takes below
// first, then unexpires, never more than it did before below was kept).
func endedParts(st, after store.HeldStack, exp []billing.Units, pres []billing.Units) []preEnded {
	// What GiveBack took, top first: the top, then each layer's deferred
	// credits (expiring) and what is below them, newest layer first.
	type piece struct {
		n      billing.Units
		expire bool
	}
	pieces := []piece{{n: st.Top - after.Top}}
	for i := len(st.Layers) - 1; i >= 0; i-- {
		pieces = append(pieces, piece{exp[i], true}, piece{n: st.Layers[i].Below - after.Layers[i].Below})
	}
	out := make([]preEnded, len(pres))
	k := 0
	for j, p := range pres {
		p = max(p, 0)
		for p > 0 && k < len(pieces) {
			n := min(p, pieces[k].n)
			switch {
			case pieces[k].expire && n > 0:
				out[j].credits += n
				out[j].below = 0 // what is below this
			case out[j].credits > 0:
				out[j].below += n
			}
			pieces[k].n -= n
			p -= n
			if pieces[k].n <= 0 {
				k++
			}
		}
	}
	return out
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
// those credits rather than others (queueUnexpired), oldest first: what
// the give-back took that does not expire under them (below) first.
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
		var pres []billing.Units
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
			pres = append(pres, e.pre)
		}
		user, service := group[0].ref.Key.UserID, group[0].ref.Key.ServiceID
		parts, x, err := giveBackEnded(ctx, tx, user, service, pres)
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
		for j, e := range group {
			if parts[j].credits <= 0 {
				continue // its part expired nothing
			}
			// A row ended again (granted anew after it ended): which of
			// its ends a late call was served under is not known; the
			// least below unexpires no less than either would.
			if _, err := tx.Exec(ctx, `INSERT INTO lease_pre_ended (holder, user_id, service_id, period, credits, below)
				VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (holder, user_id, service_id, period)
				DO UPDATE SET credits = lease_pre_ended.credits + EXCLUDED.credits,
				below = least(lease_pre_ended.below, EXCLUDED.below), ended_at = now()`,
				e.ref.Holder, user, service, e.ref.Key.Period, int64(parts[j].credits), int64(parts[j].below)); err != nil {
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
// expiry still open is kept out of this one: what its rows charged since
// is taken off its stack first (chargedHeld), and what it still defers
// stays deferred, held. When this one defers credits, every lease row of
// the subscription is marked and the stack written again with both
// (store.ExpireGrantsHeld places them by age): a deferred expiry still
// open joins it. It returns the grants due and the balance change.
func expireHeld(ctx context.Context, tx pgx.Tx, userID, serviceID string, balance, held billing.Units, grants []store.CreditGrant,
	now time.Time, hasSub bool) ([]store.CreditGrant, billing.Units, error) {
	open := false
	for _, g := range grants {
		if g.Deferred > 0 {
			open = true
		}
	}
	if !hasSub {
		held = 0
	}
	if open && hasSub {
		gs, st, err := stackGrants(ctx, tx, userID, serviceID)
		if err != nil {
			return nil, 0, err
		}
		left, err := preHeld(ctx, tx, userID, serviceID)
		if err != nil {
			return nil, 0, err
		}
		after := chargedHeld(st, left)
		if err := putStack(ctx, tx, userID, serviceID, gs, st, after, nil); err != nil {
			return nil, 0, err
		}
		deferred := map[string]billing.Units{}
		for i, g := range gs {
			deferred[g.ID] = after.Layers[i].Deferred
		}
		for i := range grants {
			if grants[i].Deferred > 0 {
				grants[i].Deferred = deferred[grants[i].ID]
			}
		}
	}
	expired, after, st := store.ExpireGrantsHeld(balance, held, grants, now)
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
		// The stack of the expiry (joined with one still open).
		if _, err := tx.Exec(ctx, `UPDATE credit_grants SET deferred_below = 0
			WHERE user_id = $1 AND service_id = $2 AND deferred_below <> 0`, userID, serviceID); err != nil {
			return nil, 0, err
		}
		for _, l := range st.Layers {
			if l.Below != 0 {
				if _, err := tx.Exec(ctx, "UPDATE credit_grants SET deferred_below = $2 WHERE id = $1", l.ID, int64(l.Below)); err != nil {
					return nil, 0, err
				}
			}
		}
		if _, err := tx.Exec(ctx, "UPDATE subscriptions SET expiry_slack = $3 WHERE user_id = $1 AND service_id = $2",
			userID, serviceID, int64(st.Top)); err != nil {
			return nil, 0, err
		}
	}
	return expired, after - balance, nil
}

// readPreEnded reads, locked, what the ended lease rows the batch's
// charges come from expired of their marked credits (lease_pre_ended);
// alive says which rows are still there. Nothing is read when every row
// is (the hot path: no lease ended under a call in flight).
func readPreEnded(ctx context.Context, conn *pgxpool.Conn, batch []*settlement, alive func(string, AllowanceKey) bool) (map[LeaseRef]*preEnded, error) {
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
	rows, err := conn.Query(ctx, `SELECT e.holder, e.user_id, e.service_id, e.period, e.credits, e.below FROM lease_pre_ended e
		JOIN unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) k(h, u, sv, p)
		  ON e.holder = k.h AND e.user_id = k.u AND e.service_id = k.sv AND e.period = k.p
		ORDER BY 1, 2, 3, 4 FOR UPDATE OF e`, hs, us, ss, ps)
	if err != nil {
		return nil, err
	}
	out := map[LeaseRef]*preEnded{}
	for rows.Next() {
		var r LeaseRef
		var n, below int64
		if err := rows.Scan(&r.Holder, &r.Key.UserID, &r.Key.ServiceID, &r.Key.Period, &n, &below); err != nil {
			rows.Close()
			return nil, err
		}
		out[r] = &preEnded{credits: billing.Units(n), below: billing.Units(below)}
	}
	return out, rows.Err()
}

// queueUnexpired queues, in the settlement batch's transaction, what the
// batch's charges spent of credits their ended lease rows had expired:
// lease_pre_ended as left (what they spent of below too), the grants'
// expiry taken back by as much (unexpireSQL; the charges took them off
// the balance again) and an audit entry per subscription.
func queueUnexpired(b *pgx.Batch, lapsed map[LeaseRef]*preEnded, unexpired map[subKey]billing.Units) {
	for r, n := range lapsed {
		if n.credits > 0 {
			b.Queue(`UPDATE lease_pre_ended SET credits = $5, below = $6 WHERE holder = $1 AND user_id = $2 AND service_id = $3 AND period = $4`,
				r.Holder, r.Key.UserID, r.Key.ServiceID, r.Key.Period, int64(n.credits), int64(n.below))
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
