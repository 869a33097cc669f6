package pgstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// notifyChannel carries cache invalidations between nodes: "k<hex hash>"
// for a key, `s["user","service"]` for a subscription, "*" for all.
const notifyChannel = "pgstore_changes"

// cacheMax bounds each kind of cached record.
const cacheMax = 1 << 16

// keyCacheTTL is how long a key is trusted while notifications flow: a
// revocation reaches every node at once through NOTIFY, so this only
// bounds a notification that was lost with its connection.
const keyCacheTTL = time.Minute

// readCache holds keys and subscriptions for the lookups every call makes.
// An entry is dropped when a notification says it changed, and trusted
// only CacheTTL while the notification connection is down. A reader that
// missed must not put back what it read before a drop: every drop bumps
// the generation, and a fill is kept only if it is still the one the
// reader saw before it read.
type readCache struct {
	mu   sync.Mutex
	gen  uint64
	keys map[[32]byte]cached[store.KeyRecord]
	subs map[[2]string]cached[store.Subscription]
	// seen is every subscription as last read, whatever was dropped
	// since: only what the database's being unreachable falls back on.
	seen map[[2]string]cached[store.Subscription]
}

type cached[T any] struct {
	v  T
	at time.Time
}

func newReadCache() *readCache {
	return &readCache{keys: make(map[[32]byte]cached[store.KeyRecord]), subs: make(map[[2]string]cached[store.Subscription]),
		seen: make(map[[2]string]cached[store.Subscription])}
}

func (c *readCache) key(h [32]byte, ttl time.Duration) (store.KeyRecord, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.keys[h]
	if ok && time.Since(e.at) < ttl {
		return e.v, true, c.gen
	}
	return store.KeyRecord{}, false, c.gen
}

func (c *readCache) fillKey(k store.KeyRecord, gen uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if len(c.keys) >= cacheMax {
		clear(c.keys)
	}
	c.keys[k.Hash] = cached[store.KeyRecord]{k, at}
}

func (c *readCache) sub(user, service string, ttl time.Duration) (store.Subscription, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.subs[[2]string{user, service}]
	if ok && time.Since(e.at) < ttl {
		return e.v, true, c.gen
	}
	return store.Subscription{}, false, c.gen
}

// staleSub is a cached subscription however old, up to maxAge.
func (c *readCache) staleSub(user, service string, maxAge time.Duration) (store.Subscription, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.seen[[2]string{user, service}]
	return e.v, ok && time.Since(e.at) < maxAge
}

func (c *readCache) fillSub(s store.Subscription, gen uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.seen) >= cacheMax {
		clear(c.seen)
	}
	c.seen[[2]string{s.UserID, s.ServiceID}] = cached[store.Subscription]{s, at}
	if gen != c.gen {
		return
	}
	if len(c.subs) >= cacheMax {
		clear(c.subs)
	}
	c.subs[[2]string{s.UserID, s.ServiceID}] = cached[store.Subscription]{s, at}
}

// setCredits updates a cached balance to what a commit of this node
// wrote (the entry keeps its age).
func (c *readCache) setCredits(user, service string, credits, held billing.Units) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.subs[[2]string{user, service}]; ok {
		e.v.Credits, e.v.CreditsHeld = credits, held
		c.subs[[2]string{user, service}] = e
	}
}

func (c *readCache) dropKey(h [32]byte) {
	c.mu.Lock()
	delete(c.keys, h)
	c.gen++
	c.mu.Unlock()
}

func (c *readCache) dropSub(user, service string) {
	c.mu.Lock()
	delete(c.subs, [2]string{user, service})
	c.gen++
	c.mu.Unlock()
}

func (c *readCache) dropAll() {
	c.mu.Lock()
	clear(c.keys)
	clear(c.subs)
	c.gen++
	c.mu.Unlock()
}

// flightKey names the shared read of a record (subFlight) for the callers
// that missed it at generation gen. A caller shares only a read begun at
// its own generation: one begun before a drop it has seen (a revocation,
// a cancellation it was told of) may have read the record from before the
// change, and what it returns must not be the answer of a lookup that
// began after the change was known here.
func flightKey(kind byte, gen uint64, id string) string {
	return string(strconv.AppendUint([]byte{kind}, gen, 10)) + "\x00" + id
}

// keyTTL and subTTL are how long cached entries are trusted now.
func (s *Store) keyTTL() time.Duration {
	if s.listen.fresh(s.opts.CacheTTL) {
		return keyCacheTTL
	}
	return s.opts.CacheTTL
}

// subTTL is short even while notifications flow: other nodes' settlements
// change credit balances without a notification per batch.
func (s *Store) subTTL() time.Duration { return s.opts.CacheTTL }

func notifyKey(h [32]byte) string { return "k" + hex.EncodeToString(h[:]) }
func notifySub(user, service string) string {
	raw, _ := json.Marshal([2]string{user, service}) // strings: never fails
	return "s" + string(raw)
}

// notifyGiveBack asks every node to give back its lease on k if it does
// not use it (Leaser.GiveBack): "g" and the allowance as JSON.
func notifyGiveBack(k AllowanceKey) string {
	raw, _ := json.Marshal(giveBackNote{k.UserID, k.ServiceID, k.Period}) // strings and a number: never fails
	return "g" + string(raw)
}

type giveBackNote struct {
	U, S string
	P    int64
}

// notifyCredits is the notification of a change of the subscription's
// balance: "c" when credits were taken (delta < 0: a refund, a lost
// dispute, an expiry, an operator's correction), which also makes every
// node's leases of it ask the database again (Leaser.Invalidate), else
// notifySub's.
func notifyCredits(user, service string, delta billing.Units) string {
	p := notifySub(user, service)
	if delta < 0 {
		p = "c" + p[1:]
	}
	return p
}

func notify(ctx context.Context, tx pgx.Tx, payload string) error {
	_, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", notifyChannel, payload)
	return err
}

func uniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// CreateKey stores a new key under its hash.
func (s *Store) CreateKey(ctx context.Context, k store.KeyRecord, audit ...store.AuditEntry) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	rec, err := json.Marshal(toKeyRecord(k))
	if err != nil {
		return err
	}
	err = s.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO keys (hash, id, user_id, rec) VALUES ($1, $2, $3, $4)", k.Hash[:], k.ID, k.UserID, rec)
		if uniqueViolation(err) {
			return fmt.Errorf("key %s: %w", k.ID, store.ErrExists)
		}
		if err != nil {
			return err
		}
		if err := insertAudits(ctx, tx, audit); err != nil {
			return err
		}
		return notify(ctx, tx, notifyKey(k.Hash))
	})
	s.cache.dropKey(k.Hash)
	return err
}

func scanKey(row pgx.Row) (store.KeyRecord, error) {
	var (
		r    keyRecord
		hash []byte
		rec  []byte
	)
	if err := row.Scan(&hash, &rec); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return store.KeyRecord{}, store.ErrNotFound
		}
		return store.KeyRecord{}, err
	}
	if err := json.Unmarshal(rec, &r); err != nil {
		return store.KeyRecord{}, fmt.Errorf("key record: %w", err)
	}
	k := r.key()
	copy(k.Hash[:], hash)
	return k, nil
}

// KeyByHash finds a key by the SHA-256 of its text, from the cache when
// it is there.
func (s *Store) KeyByHash(ctx context.Context, hash [32]byte) (store.KeyRecord, error) {
	k, ok, gen := s.cache.key(hash, s.keyTTL())
	if ok {
		return k, nil
	}
	// One read per key at a time, shared by the callers that find it
	// expired together (flightKey: and saw the same generation).
	v, err, _ := s.subFlight.Do(flightKey('k', gen, string(hash[:])), func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		at := time.Now()
		k, err := scanKey(s.pool.QueryRow(ctx, "SELECT hash, rec FROM keys WHERE hash = $1", hash[:]))
		if err == nil {
			s.cache.fillKey(k, gen, at)
		}
		return k, err
	})
	k, _ = v.(store.KeyRecord)
	if err != nil {
		return k, s.fail(err)
	}
	return k, nil
}

// KeyByID finds a key by its id, as boltstore reads it.
func (s *Store) KeyByID(ctx context.Context, id string) (store.KeyRecord, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, "SELECT hash, rec FROM keys WHERE id = $1", servicekey.CanonicalID(id)))
	return k, s.fail(err)
}

// ListKeys lists a user's keys (every key when userID is empty) in id
// order.
func (s *Store) ListKeys(ctx context.Context, userID string) ([]store.KeyRecord, error) {
	if noSuchText(userID) {
		return nil, nil
	}
	q, args := "SELECT hash, rec FROM keys ORDER BY id", []any(nil)
	if userID != "" {
		q, args = "SELECT hash, rec FROM keys WHERE user_id = $1 ORDER BY id", []any{userID}
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, s.fail(err)
	}
	defer rows.Close()
	var out []store.KeyRecord
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, s.fail(rows.Err())
}

// RevokeKey marks a key revoked; a second revocation keeps the first time.
// Every node drops the key from its cache when the notification arrives.
func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time, audit ...store.AuditEntry) (store.KeyRecord, error) {
	if err := store.CtxErr(ctx); err != nil {
		return store.KeyRecord{}, err
	}
	var out store.KeyRecord
	err := s.tx(ctx, func(tx pgx.Tx) error {
		k, err := scanKey(tx.QueryRow(ctx, "SELECT hash, rec FROM keys WHERE id = $1 FOR UPDATE", servicekey.CanonicalID(id)))
		if err != nil {
			return err
		}
		if k.RevokedAt.IsZero() {
			k.RevokedAt = at.UTC()
			rec, err := json.Marshal(toKeyRecord(k))
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE keys SET rec = $2 WHERE hash = $1", k.Hash[:], rec); err != nil {
				return err
			}
			if err := notify(ctx, tx, notifyKey(k.Hash)); err != nil {
				return err
			}
		}
		out = k
		return insertAudits(ctx, tx, audit)
	})
	if err == nil {
		s.cache.dropKey(out.Hash)
	}
	return out, err
}

const subColumns = "rec, credits, credits_held"

func scanSub(row pgx.Row) (store.Subscription, error) {
	var (
		r             subRecord
		rec           []byte
		credits, held int64
	)
	if err := row.Scan(&rec, &credits, &held); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return store.Subscription{}, store.ErrNoAccount
		}
		return store.Subscription{}, err
	}
	if err := json.Unmarshal(rec, &r); err != nil {
		return store.Subscription{}, fmt.Errorf("subscription record: %w", err)
	}
	return r.subscription(billing.Units(credits), billing.Units(held)), nil
}

// subRec is what the rec column keeps of sub (subRecord).
func subRec(sub store.Subscription) ([]byte, error) { return json.Marshal(toSubRecord(sub)) }

// PutSubscription creates or updates a subscription, keeping its start
// (the period anchor) and credit balance.
func (s *Store) PutSubscription(ctx context.Context, sub store.Subscription, audit ...store.AuditEntry) (store.Subscription, error) {
	return s.putSubscription(ctx, sub, nil, audit)
}

// PutSubscriptionIf is PutSubscription only over the stored revision
// given: the row is read FOR UPDATE and written in one transaction.
func (s *Store) PutSubscriptionIf(ctx context.Context, sub store.Subscription, revision uint64, audit ...store.AuditEntry) (store.Subscription, error) {
	return s.putSubscription(ctx, sub, &revision, audit)
}

// putSubscription puts sub, over the stored revision *ifRev when not
// nil (else over whatever is stored).
func (s *Store) putSubscription(ctx context.Context, sub store.Subscription, ifRev *uint64, audit []store.AuditEntry) (store.Subscription, error) {
	if err := store.CtxErr(ctx); err != nil {
		return sub, err
	}
	var out store.Subscription
	var stale bool
	err := s.tx(ctx, func(tx pgx.Tx) error {
		stale = false // a transaction retried runs fn again
		next := sub
		next.RestartPeriodsAt = time.Time{}
		next.Revision = 1
		cur, err := scanSub(tx.QueryRow(ctx, "SELECT "+subColumns+" FROM subscriptions WHERE user_id = $1 AND service_id = $2 FOR UPDATE",
			sub.UserID, sub.ServiceID))
		if ifRev != nil && err == nil && cur.Revision != *ifRev {
			out, stale = cur, true
			return store.ErrStale
		} else if ifRev != nil && err == store.ErrNoAccount {
			return err
		}
		switch {
		case err == nil:
			next.Revision = cur.Revision + 1
			next.StartedAt, next.Credits, next.CreditsHeld = cur.StartedAt, cur.Credits, cur.CreditsHeld
			if !sub.RestartPeriodsAt.IsZero() {
				next.StartedAt = sub.RestartPeriodsAt.UTC()
			}
		case err != store.ErrNoAccount:
			return err
		default:
			if next.StartedAt.IsZero() {
				next.StartedAt = sub.UpdatedAt
			}
			next.Credits, next.CreditsHeld = 0, 0
		}
		rec, err := subRec(next)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO subscriptions (user_id, service_id, rec) VALUES ($1, $2, $3)
			ON CONFLICT (user_id, service_id) DO UPDATE SET rec = EXCLUDED.rec`, next.UserID, next.ServiceID, rec); err != nil {
			return err
		}
		if err := insertAudits(ctx, tx, audit); err != nil {
			return err
		}
		out = next
		return notify(ctx, tx, notifySub(next.UserID, next.ServiceID))
	})
	s.cache.dropSub(sub.UserID, sub.ServiceID)
	if stale {
		// Nothing written: what is stored, shown as GetSubscription
		// shows it (the cache, dropped, is read afresh next).
		out.CreditsHeld = s.shownHeld(out)
		return out, store.ErrStale
	}
	s.forget(sub.UserID, sub.ServiceID)
	// A plan change moves the thresholds a subscription has reached
	// with no call: the evaluator is woken, not left for a settlement.
	s.changes.add(sub.UserID, sub.ServiceID)
	s.changes.publish()
	if err == nil {
		out.CreditsHeld = s.shownHeld(out)
	}
	return out, err
}

// shownHeld is the CreditsHeld a subscription read from the database is
// shown with, as State shows it: what calls in flight and open jobs hold.
// The database's credits_held counts this node's whole lease, its unused
// credits included (view.go).
func (s *Store) shownHeld(sub store.Subscription) billing.Units {
	mine, held := s.leaser.MineOf(sub.UserID, sub.ServiceID), s.heldOf(sub.UserID, sub.ServiceID)
	return max(0, sub.CreditsHeld-mine.Credits) + held.CreditsHeld
}

// GetSubscription reads a subscription; store.ErrNoAccount when none. Its
// CreditsHeld is what calls in flight and open jobs hold, as State shows
// it: this node's unused lease is not a hold.
func (s *Store) GetSubscription(ctx context.Context, userID, serviceID string) (store.Subscription, error) {
	if noSuchText(userID, serviceID) {
		return store.Subscription{}, store.ErrNoAccount
	}
	sub, err := s.getSubscription(ctx, userID, serviceID)
	if err != nil {
		return sub, err
	}
	sub.CreditsHeld = s.shownHeld(sub)
	return sub, nil
}

func (s *Store) getSubscription(ctx context.Context, userID, serviceID string) (store.Subscription, error) {
	sub, ok, gen := s.cache.sub(userID, serviceID, s.subTTL())
	if ok {
		return sub, nil
	}
	// One read per subscription at a time: the callers that find the
	// entry expired together share it (flightKey: and saw the same
	// generation).
	v, err, _ := s.subFlight.Do(flightKey('s', gen, userID+"\x00"+serviceID), func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		at := time.Now()
		sub, err := scanSub(s.pool.QueryRow(ctx, "SELECT "+subColumns+" FROM subscriptions WHERE user_id = $1 AND service_id = $2",
			userID, serviceID))
		if err == nil {
			s.cache.fillSub(sub, gen, at)
		}
		return sub, err
	})
	sub, _ = v.(store.Subscription)
	if err != nil {
		err = s.fail(err)
		if errors.Is(err, store.ErrUnavailable) {
			// The database is unreachable: calls a lease still covers go
			// on with the subscription as last read (for at most a lease's
			// lifetime, which bounds what they can be admitted for).
			if old, ok := s.cache.staleSub(userID, serviceID, s.opts.LeaseTTL); ok {
				return old, nil
			}
		}
		return sub, err
	}
	return sub, nil
}

// AddCredits changes a prepaid balance by amount, in one UPDATE, with its
// audit entries in the same transaction.
func (s *Store) AddCredits(ctx context.Context, userID, serviceID string, amount billing.Units, at time.Time, audit ...store.AuditEntry) (store.Subscription, error) {
	if err := store.CtxErr(ctx); err != nil {
		return store.Subscription{}, err
	}
	updated, err := json.Marshal(at.UTC())
	if err != nil {
		return store.Subscription{}, err
	}
	var out store.Subscription
	err = s.tx(ctx, func(tx pgx.Tx) (err error) {
		out, err = scanSub(tx.QueryRow(ctx, `UPDATE subscriptions SET credits = credits + $3,
			rec = jsonb_set(rec, '{updatedAt}', $4::jsonb)
			WHERE user_id = $1 AND service_id = $2 RETURNING `+subColumns, userID, serviceID, int64(amount), updated))
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "22003" { // numeric_value_out_of_range
			return store.ErrBalanceRange
		}
		if err != nil {
			return err
		}
		if err := insertAudits(ctx, tx, store.WithBalance(audit, out.Credits)); err != nil {
			return err
		}
		return notify(ctx, tx, notifyCredits(userID, serviceID, amount))
	})
	s.changedCredits(userID, serviceID, amount < 0)
	if err == nil {
		out.CreditsHeld = s.shownHeld(out)
	}
	return out, err
}

// AppendAudit appends e to the audit log, durably, before it returns.
func (s *Store) AppendAudit(ctx context.Context, e store.AuditEntry) (store.AuditEntry, error) {
	if err := store.CtxErr(ctx); err != nil {
		return e, err
	}
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var seq int64
		if err := tx.QueryRow(ctx, "SELECT nextval(pg_get_serial_sequence('audit', 'seq'))").Scan(&seq); err != nil {
			return err
		}
		e.Seq = uint64(seq)
		rec, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO audit (seq, rec) VALUES ($1, $2)", seq, rec)
		return err
	})
	return e, err
}

// ListAudit pages through the audit log, newest first.
func (s *Store) ListAudit(ctx context.Context, cursor string, limit int) ([]store.AuditEntry, string, error) {
	before := int64(1) << 62
	if cursor != "" {
		n, err := strconv.ParseUint(cursor, 10, 63)
		if err != nil || n == 0 {
			return nil, "", store.ErrBadCursor
		}
		before = int64(n)
	}
	limit = max(limit, 1)
	rows, err := s.pool.Query(ctx, "SELECT rec FROM audit WHERE seq < $1 ORDER BY seq DESC LIMIT $2", before, limit+1)
	if err != nil {
		return nil, "", s.fail(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.AuditEntry, error) {
		var rec []byte
		var e store.AuditEntry
		if err := r.Scan(&rec); err != nil {
			return e, err
		}
		return e, json.Unmarshal(rec, &e)
	})
	if err != nil {
		return nil, "", s.fail(err)
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		next = strconv.FormatUint(out[limit-1].Seq, 10)
	}
	return out, next, nil
}
