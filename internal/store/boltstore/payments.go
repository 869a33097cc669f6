package boltstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The payments integration's data (store.Payments). Records and leases
// are plain writes through the commit loop. Credit grants change a
// balance, which lives in memory with the calls that draw on it, so a
// grant, a reversal and an expiry are each one settlement record carrying
// the balance change and the grants' new state (grantChange): the log
// takes both at once, the applier writes both in one transaction, and a
// replay at start restores both.
var (
	bucketPayRecords   = []byte("payment_records")   // kind \0 id -> payRecord
	bucketGrants       = []byte("credit_grants")     // grant id -> grantRecord
	bucketGrantSubs    = []byte("credit_grant_subs") // user \0 service \0 granted(8) id -> nil
	bucketGrantsDue    = []byte("credit_grants_due") // expires(8) id -> nil, until expired
	bucketReversals    = []byte("credit_reversals")  // reversal id -> reversalRecord
	bucketPayLeases    = []byte("payment_leases")    // lease name -> leaseRecord
	errGrantNotApplied = fmt.Errorf("%w: a credit change is not applied to the store file yet", store.ErrUnavailable)
)

func init() {
	allBuckets = append(allBuckets, bucketPayRecords, bucketGrants, bucketGrantSubs, bucketGrantsDue,
		bucketReversals, bucketPayLeases)
}

// payState serialises the grant changes: each reads the grants from the
// file (applied first) and appends its record before the next reads.
type payState struct {
	mu sync.Mutex
}

type payRecord struct {
	Body      []byte    `json:"body"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// grantRecord is a credit grant as stored.
type grantRecord struct {
	ID        string    `json:"id"`
	UserID    string    `json:"userId"`
	ServiceID string    `json:"serviceId"`
	Credits   amount    `json:"credits"`
	GrantedAt time.Time `json:"grantedAt"`
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	Source    string    `json:"source,omitempty"`
	Reference string    `json:"reference,omitempty"`
	Reversed  amount    `json:"reversed,omitempty"`
	Expired   amount    `json:"expired,omitempty"`
	ExpiredAt time.Time `json:"expiredAt,omitzero"`
	// ExpiredLater and Deferred: store.CreditGrant's (heldexpiry.go).
	ExpiredLater amount `json:"expiredLater,omitempty"`
	Deferred     amount `json:"deferred,omitempty"`
}

func toGrantRecord(g store.CreditGrant) grantRecord {
	return grantRecord{ID: g.ID, UserID: g.UserID, ServiceID: g.ServiceID, Credits: amount(g.Credits),
		GrantedAt: g.GrantedAt.UTC(), ExpiresAt: g.ExpiresAt.UTC(), Source: g.Source, Reference: g.Reference,
		Reversed: amount(g.Reversed), Expired: amount(g.Expired), ExpiredAt: g.ExpiredAt.UTC(),
		ExpiredLater: amount(g.ExpiredLater), Deferred: amount(g.Deferred)}
}

func (r grantRecord) grant() store.CreditGrant {
	return store.CreditGrant{ID: r.ID, UserID: r.UserID, ServiceID: r.ServiceID, Credits: billing.Units(r.Credits),
		GrantedAt: r.GrantedAt, ExpiresAt: r.ExpiresAt, Source: r.Source, Reference: r.Reference,
		Reversed: billing.Units(r.Reversed), Expired: billing.Units(r.Expired), ExpiredAt: r.ExpiredAt,
		ExpiredLater: billing.Units(r.ExpiredLater), Deferred: billing.Units(r.Deferred)}
}

// reversalRecord is an applied reversal: what it asked and what it took.
type reversalRecord struct {
	ID      string    `json:"id"`
	GrantID string    `json:"grantId"`
	Credits amount    `json:"credits"`
	Took    amount    `json:"took"`
	At      time.Time `json:"at"`
	Reason  string    `json:"reason,omitempty"`
}

type leaseRecord struct {
	Holder  string    `json:"holder"`
	Epoch   uint64    `json:"epoch"`
	Expires time.Time `json:"expires"`
	Cursor  []byte    `json:"cursor,omitempty"`
}

// grantChange is the part of a settlement record a credit grant, reversal
// or expiry adds: the grants' new state, the reversal claimed, and the
// audit entries, all written by the applier with the balance change.
type grantChange struct {
	Grants   []grantRecord      `json:"grants,omitempty"`
	Reversal *reversalRecord    `json:"reversal,omitempty"`
	Audit    []store.AuditEntry `json:"audit,omitempty"`
	// Later changes a deferred expiry (heldexpiry.go).
	Later *laterChange `json:"later,omitempty"`
	// Reverse adds Credits to the grant's Reversed, the one figure a
	// reversal changes: written whole from the grant as the reversal read
	// it, the record put back what holds ending between that read and
	// the record's append had expired of its deferred credits (records
	// from before carry the grant whole in Grants).
	Reverse *laterMove `json:"reverse,omitempty"`
}

func (c *grantChange) encode() []byte {
	b, err := json.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("encode credit grant change: %v", err)) // plain fields: cannot fail
	}
	return b
}

func decodeGrantChange(b []byte) (*grantChange, error) {
	c := new(grantChange)
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("%w: credit grant part: %v", errRecord, err)
	}
	return c, nil
}

func timeKey(t time.Time, id string) []byte { return append(u64(uint64(t.UnixNano())), id...) }

func grantSubKey(g grantRecord) []byte {
	return append(append(joinKey(g.UserID, g.ServiceID), 0), timeKey(g.GrantedAt, g.ID)...)
}

// applyGrant writes a record's grant part in the applier's transaction.
func (s *Store) applyGrant(tx *bolt.Tx, c *grantChange) error {
	for _, g := range c.Grants {
		if err := putJSON(tx, bucketGrants, []byte(g.ID), g); err != nil {
			return err
		}
		if err := putRaw(tx, bucketGrantSubs, grantSubKey(g), nil); err != nil {
			return err
		}
		if !g.ExpiresAt.IsZero() {
			due := timeKey(g.ExpiresAt, g.ID)
			var err error
			if g.ExpiredAt.IsZero() {
				err = putRaw(tx, bucketGrantsDue, due, nil)
			} else {
				err = tx.Bucket(bucketGrantsDue).Delete(due)
			}
			if err != nil {
				return err
			}
		}
	}
	if r := c.Reversal; r != nil {
		if err := putJSON(tx, bucketReversals, []byte(r.ID), r); err != nil {
			return err
		}
	}
	if m := c.Reverse; m != nil {
		// The reversal read the grant from the file, and grants are never
		// deleted; one missing is left missing, as applyLater does.
		var g grantRecord
		switch err := getJSON(tx, bucketGrants, []byte(m.ID), &g); {
		case err == store.ErrNotFound:
		case err != nil:
			return err
		default:
			g.Reversed += m.Credits
			if err := putJSON(tx, bucketGrants, []byte(m.ID), g); err != nil {
				return err
			}
		}
	}
	if l := c.Later; l != nil {
		if err := applyLater(tx, l); err != nil {
			return err
		}
	}
	// A copy: a replay of the record numbers them again.
	return appendAudit(tx, slices.Clone(c.Audit))
}

// Records.

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
	err := s.update(func(tx *bolt.Tx) error {
		stored, exists = nil, false
		var cur payRecord
		err := getJSON(tx, bucketPayRecords, joinKey(kind, id), &cur)
		if err == nil {
			stored, exists = nonNil(cur.Body), true
			return nil
		}
		if err != store.ErrNotFound {
			return err
		}
		return putJSON(tx, bucketPayRecords, joinKey(kind, id), payRecord{Body: nonNil(body), UpdatedAt: at.UTC()})
	})
	if err != nil {
		return nil, err
	}
	if exists {
		return stored, fmt.Errorf("payment record %s %s: %w", kind, id, store.ErrExists)
	}
	return nil, nil
}

// PutPaymentRecord stores body under (kind, id), replacing any.
func (s *Store) PutPaymentRecord(ctx context.Context, kind, id string, body []byte, at time.Time) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	if err := store.CheckPaymentRecordID(kind, id); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		return putJSON(tx, bucketPayRecords, joinKey(kind, id), payRecord{Body: nonNil(body), UpdatedAt: at.UTC()})
	})
}

// SwapPaymentRecord replaces the record under (kind, id) with body while
// its body is old: the compare and the write are one update transaction,
// which bbolt runs one at a time.
func (s *Store) SwapPaymentRecord(ctx context.Context, kind, id string, old, body []byte, at time.Time) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	if err := store.CheckPaymentRecordID(kind, id); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		var cur payRecord
		if err := getJSON(tx, bucketPayRecords, joinKey(kind, id), &cur); err != nil {
			return err
		}
		if !bytes.Equal(cur.Body, old) {
			return fmt.Errorf("payment record %s %s: %w", kind, id, store.ErrStale)
		}
		return putJSON(tx, bucketPayRecords, joinKey(kind, id), payRecord{Body: nonNil(body), UpdatedAt: at.UTC()})
	})
}

// GetPaymentRecord returns the body under (kind, id), or store.ErrNotFound.
func (s *Store) GetPaymentRecord(_ context.Context, kind, id string) ([]byte, error) {
	if err := store.CheckPaymentRecordID(kind, id); err != nil {
		return nil, err
	}
	var rec payRecord
	err := s.view(func(tx *bolt.Tx) error { return getJSON(tx, bucketPayRecords, joinKey(kind, id), &rec) })
	if err != nil {
		return nil, err
	}
	return nonNil(rec.Body), nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// ListPaymentRecords pages the records of kind in id order (bytewise).
func (s *Store) ListPaymentRecords(_ context.Context, kind, after string, limit int) ([]store.PaymentRecord, bool, error) {
	if kind == "" {
		return nil, false, store.CheckPaymentRecordID(kind, "-")
	}
	if err := store.CheckListLimit(limit); err != nil {
		return nil, false, err
	}
	prefix := append([]byte(kind), 0)
	var out []store.PaymentRecord
	more := false
	err := s.view(func(tx *bolt.Tx) error {
		out, more = nil, false
		c := tx.Bucket(bucketPayRecords).Cursor()
		k, v := c.Seek(append(slices.Clip(prefix), after...))
		if after != "" && k != nil && string(k[len(prefix):]) == after {
			k, v = c.Next()
		}
		for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if len(out) == limit {
				more = true
				return nil
			}
			var rec payRecord
			if err := decodeJSON(bucketPayRecords, k, v, &rec); err != nil {
				return err
			}
			out = append(out, store.PaymentRecord{Kind: kind, ID: string(k[len(prefix):]), Body: nonNil(rec.Body),
				UpdatedAt: rec.UpdatedAt})
		}
		return nil
	})
	return out, more, err
}

// Leases.

func (r leaseRecord) lease(name, holder string) store.Lease {
	return store.Lease{Name: name, Holder: r.Holder, Epoch: r.Epoch, Expires: r.Expires, Cursor: r.Cursor,
		Held: holder != "" && r.Holder == holder}
}

// TakeLease gives the lease to holder when it is free, expired or the
// holder's; a change of holder increments the epoch.
func (s *Store) TakeLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (store.Lease, error) {
	if err := store.CtxErr(ctx); err != nil {
		return store.Lease{}, err
	}
	if err := store.CheckLease(name, holder, ttl); err != nil {
		return store.Lease{}, err
	}
	var out store.Lease
	err := s.update(func(tx *bolt.Tx) error {
		var rec leaseRecord
		if err := getJSON(tx, bucketPayLeases, []byte(name), &rec); err != nil && err != store.ErrNotFound {
			return err
		}
		if rec.Holder != holder && rec.Holder != "" && rec.Expires.After(now) {
			out = rec.lease(name, holder)
			return nil
		}
		if rec.Holder != holder {
			rec.Holder = holder
			rec.Epoch++
		}
		rec.Expires = now.Add(ttl).UTC()
		out = rec.lease(name, holder)
		return putJSON(tx, bucketPayLeases, []byte(name), rec)
	})
	return out, err
}

// ReleaseLease gives the lease up if holder has it; the cursor stays.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	if err := store.CheckLease(name, holder, 1); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		var rec leaseRecord
		if err := getJSON(tx, bucketPayLeases, []byte(name), &rec); err == store.ErrNotFound {
			return nil
		} else if err != nil {
			return err
		}
		if rec.Holder != holder {
			return nil
		}
		rec.Holder, rec.Expires = "", time.Time{}
		return putJSON(tx, bucketPayLeases, []byte(name), rec)
	})
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
	return s.update(func(tx *bolt.Tx) error {
		var rec leaseRecord
		if err := getJSON(tx, bucketPayLeases, []byte(name), &rec); err == store.ErrNotFound {
			return fmt.Errorf("lease %s: never taken: %w", name, store.ErrLeaseLost)
		} else if err != nil {
			return err
		}
		if rec.Holder != holder || rec.Epoch != epoch || !rec.Expires.After(now) {
			return fmt.Errorf("lease %s: held by %q with epoch %d until %s, not by %q with epoch %d: %w",
				name, rec.Holder, rec.Epoch, rec.Expires.Format(time.RFC3339Nano), holder, epoch, store.ErrLeaseLost)
		}
		rec.Cursor = slices.Clone(cursor)
		return putJSON(tx, bucketPayLeases, []byte(name), rec)
	})
}

// Credit grants.

// readGrant reads a grant from the file; store.ErrNotFound when none.
func readGrant(tx *bolt.Tx, id string) (store.CreditGrant, error) {
	var rec grantRecord
	if err := getJSON(tx, bucketGrants, []byte(id), &rec); err != nil {
		return store.CreditGrant{}, err
	}
	return rec.grant(), nil
}

// grantsOf reads the grants whose index key starts with prefix.
func grantsOf(tx *bolt.Tx, prefix []byte) ([]store.CreditGrant, error) {
	var out []store.CreditGrant
	c := tx.Bucket(bucketGrantSubs).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if _, err := unseal(bucketGrantSubs, k, v); err != nil {
			return nil, err
		}
		if len(k) < len(prefix)+8 {
			return nil, recordError(bucketGrantSubs, k, "key too short")
		}
		// The id follows the last NUL before the time; the time is 8
		// bytes, so the id is what follows user \0 service \0 time.
		i := bytes.IndexByte(k, 0)
		j := i + 1 + bytes.IndexByte(k[i+1:], 0)
		g, err := readGrant(tx, string(k[j+1+8:]))
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// current applies what the log took, so the file has every grant; the
// caller holds pay.mu.
func (s *Store) current() error {
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.applyAll(); err != nil {
		return fmt.Errorf("%w (%v)", errGrantNotApplied, err)
	}
	return nil
}

// commitCredit appends a record changing the balance of acc by delta (none
// when acc is nil) with the grant part c, and waits until it is durable;
// on failure the balance in memory is restored.
func (s *Store) commitCredit(acc *memAccount, userID, serviceID string, delta billing.Units, c *grantChange) error {
	_, err := s.commitCreditWith(acc, userID, serviceID, func(_, _ billing.Units) (billing.Units, *grantChange, func()) {
		return delta, c, nil
	})
	return err
}

// commitCreditWith is commitCredit with the change decided by decide from
// the account's balance and what calls and jobs hold of it, under the
// account's lock, so that no call is admitted between the reading and the
// change (ExpireCredits). decide returning a nil change commits nothing
// (false); undo, when not nil, takes back what decide changed in memory
// besides the balance, under the lock, if the record is refused.
func (s *Store) commitCreditWith(acc *memAccount, userID, serviceID string, decide func(credits, held billing.Units) (billing.Units, *grantChange, func())) (bool, error) {
	var credits, held billing.Units
	if acc != nil {
		acc.mu.Lock()
		credits, held = acc.credits, max(acc.held, 0)
	}
	delta, c, undo := decide(credits, held)
	if c == nil {
		if acc != nil {
			acc.mu.Unlock()
		}
		return false, nil
	}
	if acc != nil && (delta > 0) != (acc.credits+delta > acc.credits) {
		// Past what a balance holds, as AddCredits refuses it: added, it
		// wrapped round to a balance of the other sign.
		if undo != nil {
			undo()
		}
		acc.mu.Unlock()
		return false, store.ErrBalanceRange
	}
	rec := &settlement{grant: c}
	if acc != nil && delta != 0 {
		rec.acct = &acctChange{userID: userID, serviceID: serviceID, ops: []acctOp{{kind: opCredit, units: delta}}}
	}
	if acc != nil {
		acc.credits += delta
	}
	_, b, err := s.commitRecord(rec, nil)
	if acc != nil {
		acc.mu.Unlock()
	}
	if err == nil {
		err = s.await(b)
	}
	if err != nil {
		if acc != nil {
			acc.mu.Lock()
			acc.credits -= delta
			if undo != nil {
				undo()
			}
			acc.mu.Unlock()
		}
		return true, err
	}
	if acc != nil && delta != 0 {
		s.noteChange(userID, serviceID)
	}
	// The file has it at once, so reads of grants and of the audit log
	// see it; if this apply fails the log keeps it and the next applies.
	if applyGrantsAtOnce {
		s.applyAll()
	}
	return true, nil
}

// applyGrantsAtOnce: a credit change is applied to the file as soon as it
// is durable. The crash tests turn it off to find it only in the log.
var applyGrantsAtOnce = true

func grantAudit(g store.CreditGrant, at time.Time, action, detail string) store.AuditEntry {
	actor := g.Source
	if actor == "" {
		actor = "payments"
	}
	return store.AuditEntry{Time: at.UTC(), Actor: actor, Action: action, UserID: g.UserID, ServiceID: g.ServiceID,
		Detail: detail}
}

// GrantCredits adds the grant's credits to the balance and keeps the
// grant, in one settlement record.
func (s *Store) GrantCredits(ctx context.Context, g store.CreditGrant) (store.Subscription, error) {
	if err := store.CtxErr(ctx); err != nil {
		return store.Subscription{}, err
	}
	if err := store.CheckGrant(g); err != nil {
		return store.Subscription{}, err
	}
	s.pay.mu.Lock()
	defer s.pay.mu.Unlock()
	if err := s.current(); err != nil {
		return store.Subscription{}, err
	}
	var found bool
	err := s.view(func(tx *bolt.Tx) error {
		found = tx.Bucket(bucketGrants).Get([]byte(g.ID)) != nil
		return nil
	})
	if err != nil {
		return store.Subscription{}, err
	}
	if found {
		sub, err := s.GetSubscription(ctx, g.UserID, g.ServiceID)
		if err != nil {
			return sub, err
		}
		return sub, fmt.Errorf("credit grant %s: %w", g.ID, store.ErrReplayed)
	}
	acc, err := s.account(g.UserID, g.ServiceID)
	if err != nil {
		return store.Subscription{}, err
	}
	g.GrantedAt, g.ExpiresAt = g.GrantedAt.UTC(), g.ExpiresAt.UTC()
	detail := fmt.Sprintf("granted %s credits (grant %s", g.Credits, g.ID)
	if g.Reference != "" {
		detail += ", " + g.Reference
	}
	if !g.ExpiresAt.IsZero() {
		detail += ", expires " + g.ExpiresAt.Format(time.RFC3339)
	}
	c := &grantChange{Grants: []grantRecord{toGrantRecord(g)},
		Audit: []store.AuditEntry{grantAudit(g, g.GrantedAt, "credits.grant", detail+")")}}
	if err := s.commitCredit(acc, g.UserID, g.ServiceID, g.Credits, c); err != nil {
		return store.Subscription{}, err
	}
	return s.GetSubscription(ctx, g.UserID, g.ServiceID)
}

// ReverseCredits takes back up to r.Credits of the grant, once per
// reversal id.
func (s *Store) ReverseCredits(ctx context.Context, r store.CreditReversal) (store.Subscription, store.CreditGrant, error) {
	if err := store.CtxErr(ctx); err != nil {
		return store.Subscription{}, store.CreditGrant{}, err
	}
	if err := store.CheckReversal(r); err != nil {
		return store.Subscription{}, store.CreditGrant{}, err
	}
	s.pay.mu.Lock()
	defer s.pay.mu.Unlock()
	if err := s.current(); err != nil {
		return store.Subscription{}, store.CreditGrant{}, err
	}
	var (
		g        store.CreditGrant
		replayed bool
	)
	err := s.view(func(tx *bolt.Tx) error {
		var rev reversalRecord
		err := getJSON(tx, bucketReversals, []byte(r.ID), &rev)
		switch {
		case err == nil:
			replayed = true
			g, err = readGrant(tx, rev.GrantID)
			return err
		case err != store.ErrNotFound:
			return err
		}
		g, err = readGrant(tx, r.GrantID)
		if err == store.ErrNotFound {
			return fmt.Errorf("credit grant %s: %w", r.GrantID, store.ErrNotFound)
		}
		return err
	})
	if err != nil {
		return store.Subscription{}, store.CreditGrant{}, err
	}
	if replayed {
		sub, err := s.GetSubscription(ctx, g.UserID, g.ServiceID)
		if err != nil {
			return sub, g, err
		}
		return sub, g, fmt.Errorf("credit reversal %s: %w", r.ID, store.ErrReplayed)
	}
	if reverseRead != nil {
		reverseRead()
	}
	acc, err := s.account(g.UserID, g.ServiceID)
	if err != nil {
		return store.Subscription{}, g, err
	}
	g, took := g.Reverse(r.Credits)
	detail := fmt.Sprintf("took back %s of %s credits asked (grant %s, reversal %s", took, r.Credits, g.ID, r.ID)
	if r.Reason != "" {
		detail += ", " + r.Reason
	}
	// Only Reversed changes, by took: holds ending before the record is
	// appended may change the grant's deferred and expired figures.
	c := &grantChange{Reverse: &laterMove{ID: g.ID, Credits: amount(took)},
		Reversal: &reversalRecord{ID: r.ID, GrantID: g.ID, Credits: amount(r.Credits), Took: amount(took), At: r.At.UTC(),
			Reason: r.Reason},
		Audit: []store.AuditEntry{grantAudit(g, r.At, "credits.reverse", detail+")")}}
	if err := s.commitCredit(acc, g.UserID, g.ServiceID, -took, c); err != nil {
		return store.Subscription{}, store.CreditGrant{}, err
	}
	// The grant as the file has it now that the record is applied
	// (commitCredit applied it), holds ended meanwhile included.
	if applyGrantsAtOnce {
		s.view(func(tx *bolt.Tx) error {
			if now, err := readGrant(tx, g.ID); err == nil && now.Reversed == g.Reversed {
				g = now
			}
			return nil
		})
	}
	sub, err := s.GetSubscription(ctx, g.UserID, g.ServiceID)
	return sub, g, err
}

// reverseRead, when set (tests), runs in ReverseCredits after it read the
// grant and before it appends its record: holds ending then change the
// grant's deferred expiry under it.
var reverseRead func()

// ExpireCredits expires every grant due at now (store.ExpireGrants), one
// settlement record per subscription.
func (s *Store) ExpireCredits(ctx context.Context, now time.Time) ([]store.CreditGrant, error) {
	if err := store.CtxErr(ctx); err != nil {
		return nil, err
	}
	if now.IsZero() {
		return nil, fmt.Errorf("%w: ExpireCredits needs a time", store.ErrBadInput)
	}
	s.pay.mu.Lock()
	defer s.pay.mu.Unlock()
	if err := s.current(); err != nil {
		return nil, err
	}
	type subGrants struct {
		userID, serviceID string
		grants            []store.CreditGrant
	}
	var subs []subGrants
	err := s.view(func(tx *bolt.Tx) error {
		subs = nil
		seen := map[string]bool{}
		c := tx.Bucket(bucketGrantsDue).Cursor()
		limit := u64(uint64(now.UnixNano()))
		for k, v := c.First(); k != nil && bytes.Compare(k[:min(8, len(k))], limit) <= 0; k, v = c.Next() {
			if _, err := unseal(bucketGrantsDue, k, v); err != nil {
				return err
			}
			if len(k) < 8 {
				return recordError(bucketGrantsDue, k, "key too short")
			}
			g, err := readGrant(tx, string(k[8:]))
			if err != nil {
				return err
			}
			key := string(subKey(g.UserID, g.ServiceID))
			if seen[key] {
				continue
			}
			seen[key] = true
			all, err := grantsOf(tx, append(subKey(g.UserID, g.ServiceID), 0))
			if err != nil {
				return err
			}
			subs = append(subs, subGrants{g.UserID, g.ServiceID, all})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// One subscription's error does not stop the others: each is its own
	// commit, and a grant left due there must not keep every later
	// subscription's from expiring on every sweep (found by a review;
	// ExpireCreditsSaturated of the contract suite). The errors are
	// returned together after the loop; the store failing as a whole
	// (ErrUnavailable, the context ended) stops it.
	var out []store.CreditGrant
	var errs []error
	for _, sg := range subs {
		if stopExpiry(ctx, errs) {
			break
		}
		acc, err := s.account(sg.userID, sg.serviceID)
		if err != nil && err != store.ErrNoAccount {
			errs = append(errs, fmt.Errorf("subscription %s/%s: %w", sg.userID, sg.serviceID, err))
			continue
		}
		// Credits held for calls in flight and open jobs count as spent:
		// a call settled after the expiry must not spend credits the
		// expiry took as well. The balance is read, and the expiry
		// decided and made, under the account's lock: read before it and
		// changed after, a call admitted in between held credits the
		// expiry then took as well, and was charged almost nothing (found
		// by a review; TestExpireCreditsRacesReserve). What the expiry
		// leaves only because it is held is deferred: it expires as the
		// holds open now give it back (heldexpiry.go).
		var expired []store.CreditGrant
		_, err = s.commitCreditWith(acc, sg.userID, sg.serviceID, func(credits, held billing.Units) (billing.Units, *grantChange, func()) {
			return s.expireHeld(acc, sg.grants, credits, held, now, &expired)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("subscription %s/%s: %w", sg.userID, sg.serviceID, err))
			continue
		}
		out = append(out, expired...)
	}
	return out, errors.Join(errs...)
}

// stopExpiry says whether ExpireCredits stops before its next
// subscription: the context ended, or the last error says the store
// cannot write at all (every later subscription would fail the same).
func stopExpiry(ctx context.Context, errs []error) bool {
	if store.CtxErr(ctx) != nil {
		return true
	}
	return len(errs) > 0 && errors.Is(errs[len(errs)-1], store.ErrUnavailable)
}

// ListCreditGrants lists a subscription's grants, a user's (serviceID
// empty) or every grant (both empty), oldest first.
func (s *Store) ListCreditGrants(ctx context.Context, userID, serviceID string) ([]store.CreditGrant, error) {
	if err := store.CtxErr(ctx); err != nil {
		return nil, err
	}
	if userID == "" && serviceID != "" {
		return nil, fmt.Errorf("%w: listing credit grants of a service needs a user", store.ErrBadInput)
	}
	s.pay.mu.Lock()
	err := s.current()
	s.pay.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []store.CreditGrant
	err = s.view(func(tx *bolt.Tx) (err error) {
		var prefix []byte
		switch {
		case serviceID != "":
			prefix = append(subKey(userID, serviceID), 0)
		case userID != "":
			prefix = append([]byte(userID), 0)
		}
		out, err = grantsOf(tx, prefix)
		return err
	})
	slices.SortFunc(out, store.OlderGrant)
	return out, err
}

var _ store.Payments = (*Store)(nil)

// exportPayments hands the payments data to a store.PaymentsImporter; a
// target without it is refused when there is any.
func exportPayments(ctx context.Context, tx *bolt.Tx, to store.Importer, n int, t *store.Totals) error {
	held := 0
	for _, b := range [][]byte{bucketPayRecords, bucketGrants, bucketReversals, bucketPayLeases} {
		held += tx.Bucket(b).Stats().KeyN
	}
	if held == 0 {
		return nil
	}
	imp, ok := to.(store.PaymentsImporter)
	if !ok {
		return fmt.Errorf("the store holds payments data (%d records) and the target cannot import it (no store.PaymentsImporter)", held)
	}
	recs := &batcher[store.PaymentRecord]{n: n, flush: func(rs []store.PaymentRecord) error { return imp.ImportPaymentRecords(ctx, rs) }}
	err := eachJSON(tx, bucketPayRecords, func(k []byte, rec payRecord) error {
		i := bytes.IndexByte(k, 0)
		if i < 0 {
			return fmt.Errorf("payment record key %q has no id", k)
		}
		t.PaymentRecords++
		return recs.add(store.PaymentRecord{Kind: string(k[:i]), ID: string(k[i+1:]), Body: nonNil(rec.Body), UpdatedAt: rec.UpdatedAt})
	})
	if err == nil {
		err = recs.done()
	}
	if err != nil {
		return err
	}
	grants := &batcher[store.CreditGrant]{n: n, flush: func(gs []store.CreditGrant) error { return imp.ImportCreditGrants(ctx, gs) }}
	err = eachJSON(tx, bucketGrants, func(_ []byte, rec grantRecord) error {
		t.CreditGrants++
		return grants.add(rec.grant())
	})
	if err == nil {
		err = grants.done()
	}
	if err != nil {
		return err
	}
	revs := &batcher[store.CreditReversal]{n: n, flush: func(rs []store.CreditReversal) error { return imp.ImportCreditReversals(ctx, rs) }}
	err = eachJSON(tx, bucketReversals, func(_ []byte, rec reversalRecord) error {
		t.CreditReversals++
		return revs.add(store.CreditReversal{ID: rec.ID, GrantID: rec.GrantID, Credits: billing.Units(rec.Took), At: rec.At, Reason: rec.Reason})
	})
	if err == nil {
		err = revs.done()
	}
	if err != nil {
		return err
	}
	leases := &batcher[store.Lease]{n: n, flush: func(ls []store.Lease) error { return imp.ImportLeases(ctx, ls) }}
	err = eachJSON(tx, bucketPayLeases, func(k []byte, rec leaseRecord) error {
		t.Leases++
		return leases.add(rec.lease(string(k), ""))
	})
	if err == nil {
		err = leases.done()
	}
	return err
}
