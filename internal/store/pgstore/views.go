package pgstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/store"
)

// ListSubscriptions pages through the subscriptions of one user, or all,
// in (user, service) order.
func (s *Store) ListSubscriptions(ctx context.Context, userID, cursor string, limit int) ([]store.Subscription, string, error) {
	if err := store.CtxErr(ctx); err != nil {
		return nil, "", err
	}
	after, err := store.DecodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	if noSuchText(userID) {
		return nil, "", nil
	}
	afterUser, afterService, hasAfter := "", "", after != nil
	if hasAfter {
		u, sv, ok := bytes.Cut(after, []byte{0})
		if !ok || (userID != "" && string(u) != userID) {
			return nil, "", store.ErrBadCursor
		}
		afterUser, afterService = string(u), string(sv)
		if noSuchText(afterUser, afterService) { // forged: no subscription is keyed by such text
			return nil, "", store.ErrBadCursor
		}
	}
	limit = max(limit, 1)
	rows, err := s.pool.Query(ctx, `SELECT `+subColumns+` FROM subscriptions
		WHERE ($1 = '' OR user_id = $1) AND (NOT $2 OR (user_id, service_id) > ($3, $4))
		ORDER BY user_id, service_id LIMIT $5`, userID, hasAfter, afterUser, afterService, limit+1)
	if err != nil {
		return nil, "", s.fail(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Subscription, error) { return scanSub(r) })
	if err != nil {
		return nil, "", s.fail(err)
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		last := out[limit-1]
		next = store.EncodeCursor([]byte(last.UserID + "\x00" + last.ServiceID))
	}
	for i := range out {
		out[i].CreditsHeld = s.shownHeld(out[i])
	}
	return out, next, nil
}

// ListJobs pages through the jobs matching f, in id order.
func (s *Store) ListJobs(ctx context.Context, f store.JobFilter, cursor string, limit int) ([]store.Job, string, error) {
	if err := store.CtxErr(ctx); err != nil {
		return nil, "", err
	}
	after, err := store.DecodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	if noSuchText(string(after)) { // a forged cursor: no job id is such text
		return nil, "", store.ErrBadCursor
	}
	if noSuchText(f.UserID, f.ServiceID, f.Status) {
		return nil, "", nil // a filter no job matches (PostgreSQL refuses it as text)
	}
	limit = max(limit, 1)
	rows, err := s.pool.Query(ctx, `SELECT rec FROM jobs WHERE id > $1
		AND ($2 = '' OR rec->>'userId' = $2) AND ($3 = '' OR rec->>'serviceId' = $3) AND ($4 = '' OR rec->>'status' = $4)
		ORDER BY id LIMIT $5`, string(after), f.UserID, f.ServiceID, f.Status, limit+1)
	if err != nil {
		return nil, "", s.fail(err)
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (jobRecord, error) { return scanJob(r) })
	if err != nil {
		return nil, "", s.fail(err)
	}
	out := make([]store.Job, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.job())
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		next = store.EncodeCursor([]byte(out[limit-1].ID))
	}
	return out, next, nil
}

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func alertSeq(id string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimPrefix(id, "alt_"), 10, 64)
	return n, err == nil && strings.HasPrefix(id, "alt_") && n > 0
}

func scanAlert(row pgx.Row) (store.Alert, error) {
	var raw []byte
	var a store.Alert
	if err := row.Scan(&raw); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return a, store.ErrNotFound
		}
		return a, err
	}
	return a, json.Unmarshal(raw, &a)
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// CreateAlert records a fired alert as pending; the same alert recorded
// before, by any node, is ErrExists (a unique constraint).
func (s *Store) CreateAlert(ctx context.Context, a store.Alert) (store.Alert, error) {
	if err := store.CtxErr(ctx); err != nil {
		return a, err
	}
	var out store.Alert
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var seq int64
		if err := tx.QueryRow(ctx, "SELECT nextval(pg_get_serial_sequence('alerts', 'seq'))").Scan(&seq); err != nil {
			return err
		}
		out = a
		out.ID = "alt_" + strconv.FormatInt(seq, 10)
		out.Status = store.AlertPending
		if out.NextAttempt.IsZero() {
			out.NextAttempt = out.Created
		}
		raw, err := json.Marshal(out)
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO alerts (seq, user_id, service_id, period_start, threshold, status, next_attempt, rec)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (user_id, service_id, period_start, threshold) DO NOTHING`,
			seq, a.UserID, a.ServiceID, a.PeriodStart.Unix(), a.Threshold, out.Status, out.NextAttempt, raw)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			out, err = scanAlert(tx.QueryRow(ctx, `SELECT rec FROM alerts WHERE user_id = $1 AND service_id = $2
				AND period_start = $3 AND threshold = $4`, a.UserID, a.ServiceID, a.PeriodStart.Unix(), a.Threshold))
			if err != nil {
				return err
			}
			return store.ErrExists
		}
		return nil
	})
	return out, err
}

// HasAlert reports whether that alert was recorded.
func (s *Store) HasAlert(ctx context.Context, userID, serviceID string, periodStart time.Time, threshold string) (bool, error) {
	var found bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM alerts WHERE user_id = $1 AND service_id = $2
		AND period_start = $3 AND threshold = $4)`, userID, serviceID, periodStart.Unix(), threshold).Scan(&found)
	return found, s.fail(err)
}

// DueAlerts returns up to limit pending alerts due at now, oldest first.
func (s *Store) DueAlerts(ctx context.Context, now time.Time, limit int) ([]store.Alert, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT rec FROM alerts WHERE status = 'PENDING' AND next_attempt <= $1
		ORDER BY next_attempt, seq LIMIT $2`, now, limit)
	if err != nil {
		return nil, s.fail(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Alert, error) { return scanAlert(r) })
	return out, s.fail(err)
}

// UpdateAlert stores a's delivery state if the stored alert is still
// pending with attempts attempts; otherwise ErrStale.
func (s *Store) UpdateAlert(ctx context.Context, a store.Alert, attempts int) (store.Alert, error) {
	if err := store.CtxErr(ctx); err != nil {
		return a, err
	}
	seq, ok := alertSeq(a.ID)
	if !ok {
		return a, store.ErrNotFound
	}
	var out store.Alert
	err := s.tx(ctx, func(tx pgx.Tx) error {
		cur, err := scanAlert(tx.QueryRow(ctx, "SELECT rec FROM alerts WHERE seq = $1 FOR UPDATE", seq))
		if err != nil {
			return err
		}
		out = cur
		if cur.Status != store.AlertPending || cur.Attempts != attempts {
			return store.ErrStale
		}
		out.Status, out.Attempts, out.LastError = a.Status, a.Attempts, a.LastError
		out.NextAttempt, out.DeliveredAt = a.NextAttempt, a.DeliveredAt
		if out.Status != store.AlertPending {
			out.NextAttempt = time.Time{}
		}
		raw, err := json.Marshal(out)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE alerts SET rec = $2, status = $3, next_attempt = $4 WHERE seq = $1",
			seq, raw, out.Status, nullTime(out.NextAttempt))
		return err
	})
	return out, err
}

// ListAlerts returns up to limit alerts matching f, newest first.
func (s *Store) ListAlerts(ctx context.Context, f store.AlertFilter, cursor string, limit int) ([]store.Alert, string, error) {
	if err := store.CtxErr(ctx); err != nil {
		return nil, "", err
	}
	before, err := store.DecodeAlertCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	if noSuchText(f.UserID, f.ServiceID, f.Status) {
		return nil, "", nil
	}
	beforeSeq := int64(1) << 62
	if before != nil {
		beforeSeq = int64(binary.BigEndian.Uint64(before) & (1<<62 - 1))
	}
	limit = max(limit, 1)
	rows, err := s.pool.Query(ctx, `SELECT seq, rec FROM alerts WHERE seq < $1
		AND ($2 = '' OR user_id = $2) AND ($3 = '' OR service_id = $3) AND ($4 = '' OR status = $4)
		ORDER BY seq DESC LIMIT $5`, beforeSeq, f.UserID, f.ServiceID, f.Status, limit+1)
	if err != nil {
		return nil, "", s.fail(err)
	}
	var out []store.Alert
	var seqs []int64
	for rows.Next() {
		var seq int64
		var raw []byte
		if err := rows.Scan(&seq, &raw); err != nil {
			rows.Close()
			return nil, "", s.fail(err)
		}
		var a store.Alert
		if err := json.Unmarshal(raw, &a); err != nil {
			rows.Close()
			return nil, "", err
		}
		out, seqs = append(out, a), append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, "", s.fail(err)
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		next = store.EncodeCursor(u64(uint64(seqs[limit-1])))
	}
	return out, next, nil
}
