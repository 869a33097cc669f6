package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
// back: per subscription, as [user, service, credits].
type returnedPre [][3]json.RawMessage

// settleReturned gives back, per subscription, the marked credits the
// lease rows returnSQL ended held, and takes what expires off the balance.
func settleReturned(ctx context.Context, tx pgx.Tx, raw []byte) ([]store.AccountRef, error) {
	var rows returnedPre
	if err := json.Unmarshal(raw, &rows); err != nil {
		return nil, fmt.Errorf("returned lease credits: %w", err)
	}
	var changed []store.AccountRef
	for _, r := range rows {
		var user, service string
		var pre int64
		if err := json.Unmarshal(r[0], &user); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(r[1], &service); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(r[2], &pre); err != nil {
			return nil, err
		}
		x, err := giveBackDeferred(ctx, tx, user, service, 0, billing.Units(pre))
		if err != nil {
			return nil, err
		}
		if x > 0 {
			if err := addCredits(ctx, tx, user, service, -x); err != nil {
				return nil, err
			}
			changed = append(changed, store.AccountRef{UserID: user, ServiceID: service})
		}
	}
	return changed, nil
}

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
