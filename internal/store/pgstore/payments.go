package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The payments integration's data (store.Payments), in the tables of
// migration 5. Every change is one transaction: a grant, a reversal or an
// expiry changes the balance, the grant and the audit log together, and
// the unique keys (a grant's id, a reversal's id, a record's kind and id)
// make the exactly-once claims across the fleet.

// InsertPaymentRecord stores body under (kind, id) unless a record is
// there: then it returns the stored body with store.ErrExists.
func (s *Store) InsertPaymentRecord(ctx context.Context, kind, id string, body []byte, at time.Time) ([]byte, error) {
	if err := store.CtxErr(ctx); err != nil {
		return nil, err
	}
	if err := store.CheckPaymentRecordID(kind, id); err != nil {
		return nil, err
	}
	var stored []byte
	exists := false
	err := s.tx(ctx, func(tx pgx.Tx) error {
		stored, exists = nil, false
		tag, err := tx.Exec(ctx, `INSERT INTO payment_records (kind, id, body, updated_at) VALUES ($1, $2, $3, $4)
			ON CONFLICT (kind, id) DO NOTHING`, kind, id, nonNil(body), at.UTC())
		if err != nil || tag.RowsAffected() == 1 {
			return err
		}
		// The conflicting row is committed (the insert waited for it),
		// and this statement's snapshot is newer than the insert's.
		exists = true
		return tx.QueryRow(ctx, "SELECT body FROM payment_records WHERE kind = $1 AND id = $2", kind, id).Scan(&stored)
	})
	if err != nil {
		return nil, err
	}
	if exists {
		stored = nonNil(stored)
		return stored, fmt.Errorf("payment record %s %s: %w", kind, id, store.ErrExists)
	}
	return nil, nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// PutPaymentRecord stores body under (kind, id), replacing any.
func (s *Store) PutPaymentRecord(ctx context.Context, kind, id string, body []byte, at time.Time) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	if err := store.CheckPaymentRecordID(kind, id); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO payment_records (kind, id, body, updated_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (kind, id) DO UPDATE SET body = EXCLUDED.body, updated_at = EXCLUDED.updated_at`,
		kind, id, nonNil(body), at.UTC())
	return s.fail(err)
}

// SwapPaymentRecord replaces the record under (kind, id) with body while
// its body is old. The UPDATE's WHERE is checked again on the row's newest
// version when another transaction changed it first (READ COMMITTED), so
// of two swaps from one old body exactly one matches.
func (s *Store) SwapPaymentRecord(ctx context.Context, kind, id string, old, body []byte, at time.Time) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	if err := store.CheckPaymentRecordID(kind, id); err != nil {
		return err
	}
	if noSuchText(kind, id) {
		return fmt.Errorf("payment record %q %q: %w", kind, id, store.ErrNotFound)
	}
	var swapped bool
	err := s.pool.QueryRow(ctx, `WITH cur AS (SELECT body FROM payment_records WHERE kind = $1 AND id = $2),
		upd AS (UPDATE payment_records SET body = $4, updated_at = $5 WHERE kind = $1 AND id = $2 AND body = $3 RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM upd) FROM cur`, kind, id, nonNil(old), nonNil(body), at.UTC()).Scan(&swapped)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("payment record %s %s: %w", kind, id, store.ErrNotFound)
	case err != nil:
		return s.fail(err)
	case !swapped:
		return fmt.Errorf("payment record %s %s: %w", kind, id, store.ErrStale)
	}
	return nil
}

// GetPaymentRecord returns the body under (kind, id), or store.ErrNotFound.
func (s *Store) GetPaymentRecord(ctx context.Context, kind, id string) ([]byte, error) {
	if err := store.CheckPaymentRecordID(kind, id); err != nil {
		return nil, err
	}
	if noSuchText(kind, id) {
		return nil, fmt.Errorf("payment record %q %q: %w", kind, id, store.ErrNotFound)
	}
	var body []byte
	err := s.pool.QueryRow(ctx, "SELECT body FROM payment_records WHERE kind = $1 AND id = $2", kind, id).Scan(&body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("payment record %s %s: %w", kind, id, store.ErrNotFound)
	}
	return nonNil(body), s.fail(err)
}

// ListPaymentRecords pages the records of kind in id order (bytewise).
func (s *Store) ListPaymentRecords(ctx context.Context, kind, after string, limit int) ([]store.PaymentRecord, bool, error) {
	if kind == "" {
		return nil, false, store.CheckPaymentRecordID(kind, "-")
	}
	if err := store.CheckListLimit(limit); err != nil {
		return nil, false, err
	}
	if noSuchText(kind, after) {
		return nil, false, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT id, body, updated_at FROM payment_records
		WHERE kind = $1 AND id > $2 ORDER BY id LIMIT $3`, kind, after, int64(limit)+1)
	if err != nil {
		return nil, false, s.fail(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.PaymentRecord, error) {
		rec := store.PaymentRecord{Kind: kind}
		err := r.Scan(&rec.ID, &rec.Body, &rec.UpdatedAt)
		rec.Body, rec.UpdatedAt = nonNil(rec.Body), rec.UpdatedAt.UTC()
		return rec, err
	})
	if err != nil {
		return nil, false, s.fail(err)
	}
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

// Leases.

// TakeLease gives the lease to holder when it is free, expired or the
// holder's, in one statement; a change of holder increments the epoch.
func (s *Store) TakeLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (store.Lease, error) {
	if err := store.CtxErr(ctx); err != nil {
		return store.Lease{}, err
	}
	if err := store.CheckLease(name, holder, ttl); err != nil {
		return store.Lease{}, err
	}
	l := store.Lease{Name: name}
	scan := func(row pgx.Row) error {
		var expires *time.Time
		err := row.Scan(&l.Holder, &l.Epoch, &expires, &l.Cursor)
		l.Expires = time.Time{}
		if expires != nil {
			l.Expires = expires.UTC()
		}
		return err
	}
	err := s.tx(ctx, func(tx pgx.Tx) error {
		err := scan(tx.QueryRow(ctx, `INSERT INTO payment_leases AS l (name, holder, epoch, expires_at) VALUES ($1, $2, 1, $3)
			ON CONFLICT (name) DO UPDATE SET
				epoch = CASE WHEN l.holder = EXCLUDED.holder THEN l.epoch ELSE l.epoch + 1 END,
				holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
			WHERE l.holder = EXCLUDED.holder OR l.holder = '' OR l.expires_at IS NULL OR l.expires_at <= $4
			RETURNING holder, epoch, expires_at, lease_cursor`, name, holder, now.Add(ttl).UTC(), now.UTC()))
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return scan(tx.QueryRow(ctx, "SELECT holder, epoch, expires_at, lease_cursor FROM payment_leases WHERE name = $1", name))
	})
	l.Held = err == nil && l.Holder == holder
	return l, err
}

// ReleaseLease gives the lease up if holder has it; the cursor stays.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	if err := store.CheckLease(name, holder, 1); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `UPDATE payment_leases SET holder = '', expires_at = NULL
		WHERE name = $1 AND holder = $2`, name, holder)
	return s.fail(err)
}

// PutLeaseCursor stores the cursor while holder holds the lease with
// epoch, unexpired at now; otherwise store.ErrLeaseLost.
func (s *Store) PutLeaseCursor(ctx context.Context, name, holder string, epoch uint64, cursor []byte, now time.Time) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	if err := store.CheckLease(name, holder, 1); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE payment_leases SET lease_cursor = $4
		WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > $5`, name, holder, int64(epoch), cursor, now.UTC())
	if err != nil {
		return s.fail(err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("lease %s: not held by %q with epoch %d at %s: %w", name, holder, epoch,
			now.UTC().Format(time.RFC3339Nano), store.ErrLeaseLost)
	}
	return nil
}

// Credit grants.

const grantColumns = "id, user_id, service_id, credits, granted_at, expires_at, source, reference, reversed, expired, expired_at, expired_later, deferred"

func scanGrant(row pgx.Row) (store.CreditGrant, error) {
	var (
		g                          store.CreditGrant
		credits, reversed, expired int64
		later, deferred            int64
		expiresAt, expiredAt       *time.Time
	)
	err := row.Scan(&g.ID, &g.UserID, &g.ServiceID, &credits, &g.GrantedAt, &expiresAt, &g.Source, &g.Reference,
		&reversed, &expired, &expiredAt, &later, &deferred)
	g.Credits, g.Reversed, g.Expired = billing.Units(credits), billing.Units(reversed), billing.Units(expired)
	g.ExpiredLater, g.Deferred = billing.Units(later), billing.Units(deferred)
	g.GrantedAt = g.GrantedAt.UTC()
	if expiresAt != nil {
		g.ExpiresAt = expiresAt.UTC()
	}
	if expiredAt != nil {
		g.ExpiredAt = expiredAt.UTC()
	}
	return g, err
}

func scanGrants(rows pgx.Rows) ([]store.CreditGrant, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.CreditGrant, error) { return scanGrant(r) })
}

// insertAudit appends e to the audit log in tx, as AppendAudit does.
func insertAudit(ctx context.Context, tx pgx.Tx, e store.AuditEntry) error {
	return tx.QueryRow(ctx, `INSERT INTO audit (seq, rec)
		SELECT n, jsonb_set($1::jsonb, '{seq}', to_jsonb(n)) FROM (SELECT nextval(pg_get_serial_sequence('audit', 'seq')) AS n) q
		RETURNING seq`, e).Scan(&e.Seq)
}

// insertAudits appends the entries of a change to the audit log in the
// change's transaction (store.Keys), in order.
func insertAudits(ctx context.Context, tx pgx.Tx, es []store.AuditEntry) error {
	for _, e := range es {
		if err := insertAudit(ctx, tx, e); err != nil {
			return err
		}
	}
	return nil
}

func grantAudit(g store.CreditGrant, at time.Time, action, detail string) store.AuditEntry {
	actor := g.Source
	if actor == "" {
		actor = "payments"
	}
	return store.AuditEntry{Time: at.UTC(), Actor: actor, Action: action, UserID: g.UserID, ServiceID: g.ServiceID,
		Detail: detail}
}

// addCredits changes the balance in tx and tells the other nodes.
func addCredits(ctx context.Context, tx pgx.Tx, userID, serviceID string, delta billing.Units) error {
	tag, err := tx.Exec(ctx, "UPDATE subscriptions SET credits = credits + $3 WHERE user_id = $1 AND service_id = $2",
		userID, serviceID, int64(delta))
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "22003" { // numeric_value_out_of_range
		return fmt.Errorf("subscription %s/%s: %w", userID, serviceID, store.ErrBalanceRange)
	}
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("subscription %s/%s: %w", userID, serviceID, store.ErrNoAccount)
	}
	return notify(ctx, tx, notifyCredits(userID, serviceID, delta))
}

// changedCredits drops what this node remembers of the balance; taken
// says credits were taken, which the node's leases of the subscription
// must not go on spending from what they leased (notifyCredits).
func (s *Store) changedCredits(userID, serviceID string, taken bool) {
	if taken {
		s.leaser.Invalidate(userID, serviceID)
	}
	s.cache.dropSub(userID, serviceID)
	s.forget(userID, serviceID)
	// A balance taken below a credits_below threshold refuses every call
	// after it, so no settlement would wake the evaluator for it.
	s.changes.add(userID, serviceID)
	s.changes.publish()
}

// GrantCredits adds the grant's credits to the balance and keeps the
// grant, in one transaction; the grant's id is its primary key.
func (s *Store) GrantCredits(ctx context.Context, g store.CreditGrant) (store.Subscription, error) {
	if err := store.CtxErr(ctx); err != nil {
		return store.Subscription{}, err
	}
	if err := store.CheckGrant(g); err != nil {
		return store.Subscription{}, err
	}
	detail := fmt.Sprintf("granted %s credits (grant %s", g.Credits, g.ID)
	if g.Reference != "" {
		detail += ", " + g.Reference
	}
	if !g.ExpiresAt.IsZero() {
		detail += ", expires " + g.ExpiresAt.UTC().Format(time.RFC3339)
	}
	replayed := false
	err := s.tx(ctx, func(tx pgx.Tx) error {
		replayed = false
		tag, err := tx.Exec(ctx, `INSERT INTO credit_grants (`+grantColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, 0, NULL, 0, 0)
			ON CONFLICT (id) DO NOTHING`, g.ID, g.UserID, g.ServiceID, int64(g.Credits), g.GrantedAt.UTC(),
			nullTime(g.ExpiresAt.UTC()), g.Source, g.Reference)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			replayed = true
			return nil
		}
		if err := addCredits(ctx, tx, g.UserID, g.ServiceID, g.Credits); err != nil {
			return err
		}
		return insertAudit(ctx, tx, grantAudit(g, g.GrantedAt, "credits.grant", detail+")"))
	})
	if err != nil {
		return store.Subscription{}, err
	}
	s.changedCredits(g.UserID, g.ServiceID, false)
	sub, err := s.GetSubscription(ctx, g.UserID, g.ServiceID)
	if err == nil && replayed {
		err = fmt.Errorf("credit grant %s: %w", g.ID, store.ErrReplayed)
	}
	return sub, err
}

// ReverseCredits takes back up to r.Credits of the grant, once per
// reversal id, in one transaction.
func (s *Store) ReverseCredits(ctx context.Context, r store.CreditReversal) (store.Subscription, store.CreditGrant, error) {
	if err := store.CtxErr(ctx); err != nil {
		return store.Subscription{}, store.CreditGrant{}, err
	}
	if err := store.CheckReversal(r); err != nil {
		return store.Subscription{}, store.CreditGrant{}, err
	}
	var (
		g        store.CreditGrant
		replayed bool
	)
	err := s.tx(ctx, func(tx pgx.Tx) error {
		replayed = false
		var seen int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM credit_reversals WHERE id = $1", r.ID).Scan(&seen); err != nil {
			return err
		}
		if seen > 0 {
			replayed = true
			return nil
		}
		// The subscription's row is locked before the grant's, as
		// ExpireCredits and the holds giving back deferred credits
		// (giveBackDeferred) lock them: taken grant first, a refund and a
		// job held at the expiry ending together deadlocked, and one of
		// them failed (TestContract/ExpireCreditsHeldRefundConcurrent).
		// A grant's subscription never changes, so it is read unlocked.
		var user, service string
		err := tx.QueryRow(ctx, "SELECT user_id, service_id FROM credit_grants WHERE id = $1", r.GrantID).Scan(&user, &service)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("credit grant %s: %w", r.GrantID, store.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT 1 FROM subscriptions WHERE user_id = $1 AND service_id = $2 FOR UPDATE", user, service); err != nil {
			return err
		}
		g, err = scanGrant(tx.QueryRow(ctx, "SELECT "+grantColumns+" FROM credit_grants WHERE id = $1 FOR UPDATE", r.GrantID))
		if err != nil {
			return err
		}
		next, took := g.Reverse(r.Credits)
		tag, err := tx.Exec(ctx, `INSERT INTO credit_reversals (id, grant_id, credits, took, at, reason)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING`, r.ID, g.ID, int64(r.Credits), int64(took),
			r.At.UTC(), r.Reason)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 { // a concurrent reversal of the id committed first
			replayed = true
			return nil
		}
		if _, err := tx.Exec(ctx, "UPDATE credit_grants SET reversed = $2 WHERE id = $1", g.ID, int64(next.Reversed)); err != nil {
			return err
		}
		if err := addCredits(ctx, tx, g.UserID, g.ServiceID, -took); err != nil {
			return err
		}
		g = next
		detail := fmt.Sprintf("took back %s of %s credits asked (grant %s, reversal %s", took, r.Credits, g.ID, r.ID)
		if r.Reason != "" {
			detail += ", " + r.Reason
		}
		return insertAudit(ctx, tx, grantAudit(g, r.At, "credits.reverse", detail+")"))
	})
	if err != nil {
		return store.Subscription{}, g, err
	}
	if replayed {
		// The grant the reversal took from, which may not be r.GrantID.
		var grantID string
		if err := s.pool.QueryRow(ctx, "SELECT grant_id FROM credit_reversals WHERE id = $1", r.ID).Scan(&grantID); err != nil {
			return store.Subscription{}, g, s.fail(err)
		}
		if g, err = scanGrant(s.pool.QueryRow(ctx, "SELECT "+grantColumns+" FROM credit_grants WHERE id = $1", grantID)); err != nil {
			return store.Subscription{}, g, s.fail(err)
		}
	} else {
		s.changedCredits(g.UserID, g.ServiceID, true)
	}
	sub, err := s.GetSubscription(ctx, g.UserID, g.ServiceID)
	if err == nil && replayed {
		err = fmt.Errorf("credit reversal %s: %w", r.ID, store.ErrReplayed)
	}
	return sub, g, err
}

// ExpireCredits expires every grant due at now (store.ExpireGrantsHeld),
// one transaction per subscription with its row locked, so nodes running
// it together expire each grant once. Credits held (credits_held: leased
// to nodes for calls not settled or shipped yet, or held by open jobs)
// count as spent: the rule is given the balance less them, so a call
// served on them and settled after the expiry does not spend credits the
// expiry took as well; what they give back unspent expires then
// (heldexpiry.go).
func (s *Store) ExpireCredits(ctx context.Context, now time.Time) ([]store.CreditGrant, error) {
	if err := store.CtxErr(ctx); err != nil {
		return nil, err
	}
	if now.IsZero() {
		return nil, fmt.Errorf("%w: ExpireCredits needs a time", store.ErrBadInput)
	}
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT user_id, service_id FROM credit_grants
		WHERE expired_at IS NULL AND expires_at <= $1 ORDER BY 1, 2`, now.UTC())
	if err != nil {
		return nil, s.fail(err)
	}
	subs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[store.AccountRef])
	if err != nil {
		return nil, s.fail(err)
	}
	// One subscription's error does not stop the others: each is its own
	// transaction, and a grant left due there must not keep every later
	// subscription's from expiring on every sweep (found by a review;
	// ExpireCreditsSaturated of the contract suite). The errors are
	// returned together after the loop; the database failing as a whole
	// (ErrUnavailable, the context ended) stops it.
	var out []store.CreditGrant
	var errs []error
	for _, ref := range subs {
		if store.CtxErr(ctx) != nil || len(errs) > 0 && errors.Is(errs[len(errs)-1], store.ErrUnavailable) {
			break
		}
		var expired []store.CreditGrant
		err := s.tx(ctx, func(tx pgx.Tx) error {
			expired = nil
			var balance, held int64
			hasSub := true
			err := tx.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions WHERE user_id = $1 AND service_id = $2 FOR UPDATE",
				ref.UserID, ref.ServiceID).Scan(&balance, &held)
			if errors.Is(err, pgx.ErrNoRows) {
				hasSub = false
			} else if err != nil {
				return err
			}
			rows, err := tx.Query(ctx, "SELECT "+grantColumns+` FROM credit_grants
				WHERE user_id = $1 AND service_id = $2 ORDER BY granted_at, id FOR UPDATE`, ref.UserID, ref.ServiceID)
			if err != nil {
				return err
			}
			grants, err := scanGrants(rows)
			if err != nil {
				return err
			}
			var delta billing.Units
			expired, delta, err = expireHeld(ctx, tx, ref.UserID, ref.ServiceID, billing.Units(balance), billing.Units(held),
				grants, now, hasSub)
			if err != nil {
				return err
			}
			if hasSub && delta != 0 {
				return addCredits(ctx, tx, ref.UserID, ref.ServiceID, delta)
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(expired) > 0 {
			s.changedCredits(ref.UserID, ref.ServiceID, true)
		}
		out = append(out, expired...)
	}
	return out, errors.Join(errs...)
}

// ListCreditGrants lists a subscription's grants, a user's (serviceID
// empty) or every grant (both empty), oldest first.
func (s *Store) ListCreditGrants(ctx context.Context, userID, serviceID string) ([]store.CreditGrant, error) {
	if userID == "" && serviceID != "" {
		return nil, fmt.Errorf("%w: listing credit grants of a service needs a user", store.ErrBadInput)
	}
	if noSuchText(userID, serviceID) {
		return nil, nil
	}
	q, args := "SELECT "+grantColumns+" FROM credit_grants", []any{}
	switch {
	case serviceID != "":
		q, args = q+" WHERE user_id = $1 AND service_id = $2", []any{userID, serviceID}
	case userID != "":
		q, args = q+" WHERE user_id = $1", []any{userID}
	}
	rows, err := s.pool.Query(ctx, q+" ORDER BY granted_at, id", args...)
	if err != nil {
		return nil, s.fail(err)
	}
	out, err := scanGrants(rows)
	if err != nil {
		return nil, s.fail(err)
	}
	slices.SortStableFunc(out, store.OlderGrant)
	return out, nil
}

var _ store.Payments = (*Store)(nil)
