package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// openHold is a sync call's hold as its node keeps it: in memory, backed
// by the node's lease. A node that dies takes its holds with it; the
// lease's units come back when it expires.
type openHold struct {
	res    store.Reservation
	lim    Limits
	lease  Hold // what the call holds of the node's lease, when leased
	leased bool // false: the product has no hard limit, nothing is leased
}

// periodOf is the start of the billing period containing now, for a
// subscription started at started.
func periodOf(p billing.Product, started, now time.Time) int64 {
	start, _ := billing.PeriodBounds(p.Period, p.CalendarPeriods, started, now)
	return start.Unix()
}

// Reserve holds units for a call: from the node's lease when the product
// has a hard limit (a database round trip only when a new block is
// leased), in memory only otherwise.
func (s *Store) Reserve(ctx context.Context, a store.Account, units billing.Units, now time.Time) (store.Reservation, error) {
	if err := store.CheckUnits(units); err != nil {
		return store.Reservation{}, err
	}
	if s.settle.full() && (!s.logAck || !fixedPrice(a.Product)) {
		// Its settlement would go to the group commit (settle commit, or
		// a price the usage so far decides), where maxWaiting already
		// wait for the database: refused before it is forwarded, not
		// served with a charge that cannot be made durable.
		return store.Reservation{}, fmt.Errorf("pgstore: %d settlements wait for the database: %w", s.settle.waiting.Load(), store.ErrUnavailable)
	}
	if a.Free {
		return store.Reservation{Account: a, Decision: billing.Decision{Allowed: true, Units: units}}, nil
	}
	if err := store.CtxErr(ctx); err != nil {
		return store.Reservation{}, err
	}
	sub, err := s.getSubscription(ctx, a.UserID, a.ServiceID)
	if err != nil {
		return store.Reservation{}, err
	}
	k := AllowanceKey{a.UserID, a.ServiceID, periodOf(a.Product, sub.StartedAt, now)}
	lim := limitsOf(a.Product)
	h := &openHold{lim: lim}
	if lim.Hard() {
		hold, g, err := s.leaser.Take(ctx, k, lim, units)
		if errors.Is(err, errRefused) {
			r, err := s.knownRow(ctx, k)
			if err != nil {
				return store.Reservation{}, err
			}
			return store.Reservation{Decision: refusal(a.Product, lim, g, units), State: s.view(k, a.Product, r)}, nil
		}
		if errors.Is(err, errNoSub) {
			return store.Reservation{}, store.ErrNoAccount
		}
		if err != nil {
			return store.Reservation{}, s.fail(err)
		}
		h.lease, h.leased = hold, true
	}
	r, err := s.knownRow(ctx, k)
	if err != nil {
		if h.leased {
			s.leaser.Release(h.lease)
		}
		return store.Reservation{}, err
	}
	st := s.view(k, a.Product, r)
	dec := billing.Decide(a.Product, st, units)
	dec.Allowed, dec.Code, dec.Reason = true, "", ""
	st.Hold(a.Product, dec)
	s.addHold(k, a.Product, dec)
	h.res = store.Reservation{ID: s.node + ":" + strconv.FormatUint(s.holdSeq.Add(1), 10), Account: a, Decision: dec, PeriodKey: k.Period}
	s.holdsMu.Lock()
	s.holds[h.res.ID] = h
	s.holdsMu.Unlock()
	res := h.res
	res.State = st
	return res, nil
}

// refusal is the decision a refused grant stands for, in the words of
// billing.Decide.
func refusal(p billing.Product, lim Limits, g Grant, units billing.Units) billing.Decision {
	d := billing.Decision{Units: units}
	switch g.Refused {
	case DimCredits:
		// The balance as the caller can use it: what no lease holds.
		st := billing.State{Credits: max(0, g.Left.Credits)}
		if p.Quota != nil {
			st.Used = 0
		}
		dd := billing.Decide(billing.Product{ID: p.ID, BillingModel: billing.Prepaid, Price: p.Price, UnitLabel: p.UnitLabel}, st, units)
		d.Code, d.Reason = dd.Code, dd.Reason
	case DimSpend:
		d.Code, d.Reason = billing.CodeQuotaExceeded, "spending cap for this period is reached"
	default:
		d.Code, d.Reason = billing.CodeQuotaExceeded, "quota for this period is used up"
		if p.Quota != nil && p.OverageAllowed() {
			d.Reason = "spending cap for this period is reached"
		}
	}
	if d.Code == "" {
		d.Code, d.Reason = billing.CodeInsufficientCredits, "not enough credits"
	}
	return d
}

// Settle releases the hold and charges units, capped at what the hard
// limits allow, in the node's next group commit; it returns once the
// charge is durable.
func (s *Store) Settle(ctx context.Context, r store.Reservation, units billing.Units, e store.LedgerEntry) (store.LedgerEntry, error) {
	if err := store.CheckUnits(units); err != nil {
		return store.LedgerEntry{}, err
	}
	if r.JobID != "" {
		return store.LedgerEntry{}, store.ErrJobHold
	}
	if r.ID == "" && (!r.Account.Free || units <= 0) {
		return e, nil // nothing was held, nothing to record
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC().Truncate(time.Microsecond)
	if r.Account.Free {
		e.Units = units
		st := &settlement{callID: s.node + ":f" + strconv.FormatUint(s.holdSeq.Add(1), 10), free: true, units: units, entry: e}
		if s.logAck {
			return s.logSettle(ctx, st)
		}
		return s.settle.submit(ctx, st)
	}
	s.holdsMu.Lock()
	h := s.holds[r.ID]
	delete(s.holds, r.ID)
	s.holdsMu.Unlock()
	if h == nil {
		return store.LedgerEntry{}, store.ErrNotFound // already settled, or another node's
	}
	a := h.res.Account
	k := AllowanceKey{a.UserID, a.ServiceID, h.res.PeriodKey}
	s.dropHold(k, a.Product, h.res.Decision)
	st := &settlement{callID: r.ID, key: k, product: a.Product, units: units, entry: e, held: h.res.Decision.Units}
	if h.leased {
		if units == 0 {
			s.leaser.Release(h.lease)
			return store.LedgerEntry{}, nil
		}
		// Busy from the moment its units leave the hold until the
		// settlement is queued (where the queues count it): a lease given
		// back in between (Leaser.GiveBack) took the units the charge
		// consumes back to the allowance.
		s.settling.add(h.lease.Holder, 1)
		defer s.settling.add(h.lease.Holder, -1)
		consume, covered, err := s.leaser.Settle(ctx, h.lease, h.lim, h.lim.Need(units))
		if err != nil && !covered {
			err = nil // capped against the database instead
		}
		st.holder, st.consume, st.covered = h.lease.Holder, consume, covered
		_ = err
	} else if units == 0 {
		return store.LedgerEntry{}, nil
	}
	// A charge decided here (its lease covers it, or nothing limits it, at
	// a price the usage so far does not change) goes to the settlement
	// log; any other is capped or priced against the database, in the
	// group commit.
	if s.logAck && fixedPrice(a.Product) && (!h.leased || st.covered) {
		return s.logSettle(ctx, st)
	}
	return s.settle.submit(ctx, st)
}

// stateSQL reads a subscription's balance and its allowance in a period.
const stateSQL = `
SELECT coalesce(a.used, 0), coalesce(a.leased_units, 0), coalesce(a.spend, 0), coalesce(a.leased_spend, 0), s.credits, s.credits_held, true,
	a.spend_unit, a.spend_other::text
FROM subscriptions s LEFT JOIN allowances a ON a.user_id = s.user_id AND a.service_id = s.service_id AND a.period = $3
WHERE s.user_id = $1 AND s.service_id = $2`

// Writable is nil unless the node is closed. Whether the database answers
// is what State, Reserve and the lookups find out by asking it: an
// estimate reads the subscription's row from the database, so it answers
// store_unavailable when the database does not (a call may still be
// admitted from a lease meanwhile, docs/fleet.md).
func (s *Store) Writable(ctx context.Context) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	select {
	case <-s.stop:
		return fmt.Errorf("pgstore: closed: %w", store.ErrUnavailable)
	default:
		return nil
	}
}

// State returns the subscription's state in the period containing now.
// Units and credits leased to nodes count as held.
func (s *Store) State(ctx context.Context, a store.Account, now time.Time) (billing.State, error) {
	if a.Free {
		return billing.State{}, nil
	}
	sub, err := s.getSubscription(ctx, a.UserID, a.ServiceID)
	if err != nil {
		return billing.State{}, err
	}
	k := AllowanceKey{a.UserID, a.ServiceID, periodOf(a.Product, sub.StartedAt, now)}
	r, err := scanRow(s.pool.QueryRow(ctx, stateSQL, k.UserID, k.ServiceID, k.Period))
	if err != nil {
		return billing.State{}, s.fail(err)
	}
	if !r.hasSub {
		return billing.State{}, store.ErrNoAccount
	}
	s.learn(k, r)
	return s.view(k, a.Product, r), nil
}

// Record charges usage reported after the fact, claiming the idempotency
// key in the same transaction: the key is unique across the fleet, and a
// duplicate returns the first report's stored response.
func (s *Store) Record(ctx context.Context, a store.Account, e store.LedgerEntry, response func(store.LedgerEntry, billing.State) ([]byte, error)) ([]byte, error) {
	if err := store.CheckUnits(e.Units); err != nil {
		return nil, err
	}
	if err := store.CtxErr(ctx); err != nil {
		return nil, err
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC().Truncate(time.Microsecond)
	if err := s.ensurePartition(ctx, e.Time); err != nil {
		return nil, err
	}
	var (
		stored    []byte
		dup       bool
		overdrawn bool
	)
	err := s.tx(ctx, func(tx pgx.Tx) error {
		stored, dup, overdrawn = nil, false, false
		if e.IdempotencyKey != "" {
			tag, err := tx.Exec(ctx, `INSERT INTO idempotency (service_id, key, created, response) VALUES ($1, $2, $3, '')
				ON CONFLICT DO NOTHING`, a.ServiceID, e.IdempotencyKey, e.Time)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				dup = true
				return tx.QueryRow(ctx, "SELECT response FROM idempotency WHERE service_id = $1 AND key = $2",
					a.ServiceID, e.IdempotencyKey).Scan(&stored)
			}
		}
		entry := e
		var state billing.State
		if a.Free {
			entry.ProductID = ""
		} else {
			acc, err := lockAccount(ctx, tx, a.UserID, a.ServiceID, a.Product, 0, entry.Time)
			if err != nil {
				return err
			}
			dec := billing.Decide(a.Product, store.PricingState(acc.state), entry.Units)
			acc.charge(a.Product, dec)
			entry.Overage, entry.Cost = dec.Overage, dec.Cost
			if err := acc.save(ctx, tx); err != nil {
				return err
			}
			state = acc.state
			// A report is charged past the hard limits (as the bbolt store
			// charges it), into units the nodes' leases hold: those
			// leases no longer stand for anything left, and a node
			// admitting calls from them would serve past the limit every
			// call the bbolt store refuses from here on. Every node's
			// leases of the subscription ask the database again, as after
			// credits taken back (notifyCredits).
			if overdrawn = leasesOverdrawn(limitsOf(a.Product), acc.state); overdrawn {
				if err := notify(ctx, tx, notifyCredits(a.UserID, a.ServiceID, -1)); err != nil {
					return err
				}
			}
		}
		if err := insertLedger(ctx, tx, "", &entry); err != nil {
			return err
		}
		body, err := response(entry, state)
		if err != nil {
			return err
		}
		if e.IdempotencyKey != "" {
			if _, err := tx.Exec(ctx, "UPDATE idempotency SET response = $3 WHERE service_id = $1 AND key = $2",
				a.ServiceID, e.IdempotencyKey, body); err != nil {
				return err
			}
		}
		stored = body
		return nil
	})
	if err != nil {
		return nil, err
	}
	if overdrawn && !dup {
		s.leaser.Invalidate(a.UserID, a.ServiceID) // this node's own, at once
	}
	if !a.Free && !dup {
		s.cache.dropSub(a.UserID, a.ServiceID)
		s.forget(a.UserID, a.ServiceID)
		s.changes.add(a.UserID, a.ServiceID)
		s.changes.publish()
	}
	if dup {
		return stored, store.ErrReplayed
	}
	return stored, nil
}

// leasesOverdrawn says whether st, an allowance and its balance as a
// charge left them, holds leased units, spend or credits that the hard
// limits lim no longer cover: settled plus leased past a quota or a cap,
// or credits held past the balance (grantSQL's condition, broken). A
// report past a limit does that; the leases must not admit more calls.
func leasesOverdrawn(lim Limits, st billing.State) bool {
	left := row{used: st.Used, leased: st.Reserved, spend: st.Spend, leasedSpend: st.ReservedSpend,
		credits: st.Credits, creditsHeld: st.CreditsHeld}.left(lim)
	return lim.Units != nil && st.Reserved > 0 && left.Units < 0 ||
		lim.Spend != nil && st.ReservedSpend > 0 && left.Spend < 0 ||
		lim.Credits && st.CreditsHeld > 0 && left.Credits < 0
}

// insertLedger appends e in tx and sets its sequence number and id.
func insertLedger(ctx context.Context, tx pgx.Tx, callID string, e *store.LedgerEntry) error {
	e.Time = e.Time.UTC().Truncate(time.Microsecond)
	raw, err := store.AppendLedgerEntryDetailJSON(nil, e) // the rest in columns: rowEntry
	if err != nil {
		return err
	}
	var call any
	if callID != "" {
		call = callID
	}
	var seq int64
	if err := tx.QueryRow(ctx, insertOneLedgerSQL, insertOneArgs(call, e, raw)...).Scan(&seq); err != nil { // row and rollup (rollups.go)
		return err
	}
	e.Seq, e.ID = uint64(seq), "led_"+strconv.FormatInt(seq, 10)
	return nil
}

// account is a subscription's rows in one period, locked in a
// transaction (subscription, then allowance) and written back after a
// change.
type account struct {
	key   AllowanceKey
	state billing.State
	// spend is the allowance's spend by cost unit, made the unit of the
	// product the rows were locked for (state.Spend is its spend).
	spend row
}

// lockAccount locks and reads the rows of a's allowance in period (the
// one containing now when zero).
func lockAccount(ctx context.Context, tx pgx.Tx, userID, serviceID string, p billing.Product, period int64, now time.Time) (*account, error) {
	sub, err := scanSub(tx.QueryRow(ctx, "SELECT "+subColumns+" FROM subscriptions WHERE user_id = $1 AND service_id = $2 FOR UPDATE",
		userID, serviceID))
	if err != nil {
		return nil, err
	}
	if period == 0 {
		period = periodOf(p, sub.StartedAt, now)
	}
	acc := &account{key: AllowanceKey{userID, serviceID, period}}
	if _, err := tx.Exec(ctx, ensureAllowanceSQL, userID, serviceID, period); err != nil {
		return nil, err
	}
	var used, leased, spend, ls int64
	var unit, other *string
	if err := tx.QueryRow(ctx, `SELECT used, leased_units, spend, leased_spend, spend_unit, spend_other::text FROM allowances
		WHERE user_id = $1 AND service_id = $2 AND period = $3 FOR UPDATE`, userID, serviceID, period).Scan(&used, &leased, &spend, &ls, &unit, &other); err != nil {
		return nil, err
	}
	acc.spend = row{spend: billing.Units(spend)}
	if unit != nil {
		acc.spend.unit, acc.spend.unitSet = *unit, true
	}
	if other != nil {
		acc.spend.other = *other
	}
	if p.BillingModel != "" { // no product: the rows are not charged (endJob gives a hold back)
		acc.spend.inUnit(p.CostUnit())
	}
	acc.state = billing.State{Used: billing.Units(used), Reserved: billing.Units(leased), Spend: acc.spend.spend,
		ReservedSpend: billing.Units(ls), Credits: sub.Credits, CreditsHeld: sub.CreditsHeld}
	return acc, nil
}

// inUnit makes u the cost unit of the account's state.Spend (spend.go),
// for a charge under a product of that unit.
func (acc *account) inUnit(u string) {
	acc.spend.spend = acc.state.Spend
	acc.spend.inUnit(u)
	acc.state.Spend = acc.spend.spend
}

// charge applies a charge, keeping the leased spend as leased (billing's
// repricing of held spend is not what the column counts).
func (acc *account) charge(p billing.Product, d billing.Decision) {
	ls := acc.state.ReservedSpend
	acc.state.Charge(p, d)
	acc.state.ReservedSpend = ls
}

func (acc *account) save(ctx context.Context, tx pgx.Tx) error {
	st := acc.state
	if _, err := tx.Exec(ctx, `UPDATE allowances SET used = $4, leased_units = $5, spend = $6, leased_spend = $7,
		spend_unit = $8, spend_other = $9::jsonb
		WHERE user_id = $1 AND service_id = $2 AND period = $3`, acc.key.UserID, acc.key.ServiceID, acc.key.Period,
		int64(st.Used), int64(st.Reserved), int64(st.Spend), int64(st.ReservedSpend), acc.spend.unitArg(), acc.spend.otherArg()); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE subscriptions SET credits = $3, credits_held = $4 WHERE user_id = $1 AND service_id = $2`,
		acc.key.UserID, acc.key.ServiceID, int64(st.Credits), int64(st.CreditsHeld))
	return err
}

// scanChunk is how many ledger entries one query reads.
const scanChunk = 512

// ScanLedger streams matching entries in time order, a page at a time.
// The settlements this node acknowledged from its settlement log are
// shipped first, so that a node reads its own writes.
func (s *Store) ScanLedger(ctx context.Context, f store.LedgerFilter, fn func(store.LedgerEntry) error) error {
	if noSuchText(f.UserID, f.ServiceID) {
		return nil
	}
	if err := s.flushForRead(ctx); err != nil {
		return err
	}
	from := time.Unix(0, 0).UTC().AddDate(-100, 0, 0)
	if !f.From.IsZero() {
		from = f.From
	}
	to := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if !f.To.IsZero() {
		to = f.To
	}
	afterT, afterSeq := from, int64(-1)
	for {
		if err := store.CtxErr(ctx); err != nil {
			return err
		}
		rows, err := s.pool.Query(ctx, `SELECT time, seq, user_id, service_id, entry FROM ledger
			WHERE time >= $1 AND time < $2 AND (time, seq) > ($3, $4)
			  AND ($5 = '' OR user_id = $5) AND ($6 = '' OR service_id = $6)
			ORDER BY time, seq LIMIT $7`, from, to, afterT, afterSeq, f.UserID, f.ServiceID, scanChunk)
		if err != nil {
			return s.fail(err)
		}
		var chunk []store.LedgerEntry
		for rows.Next() {
			var t time.Time
			var seq int64
			var user, service string
			var raw []byte
			if err := rows.Scan(&t, &seq, &user, &service, &raw); err != nil {
				rows.Close()
				return s.fail(err)
			}
			e, err := rowEntry(raw, seq, t, user, service)
			if err != nil {
				rows.Close()
				return fmt.Errorf("ledger entry %d: %w", seq, err)
			}
			chunk = append(chunk, e)
			afterT, afterSeq = t, seq
		}
		if err := rows.Err(); err != nil {
			return s.fail(err)
		}
		for _, e := range chunk {
			if err := fn(e); err != nil {
				return err
			}
		}
		if len(chunk) < scanChunk {
			return nil
		}
	}
}

// PruneIdempotency forgets idempotency keys claimed before cutoff.
func (s *Store) PruneIdempotency(ctx context.Context, cutoff time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, "DELETE FROM idempotency WHERE created < $1", cutoff)
	if err != nil {
		return 0, s.fail(err)
	}
	return int(tag.RowsAffected()), nil
}

// changeSet collects the subscriptions whose usage or credits changed on
// this node, for the usage alerts (each node evaluates what it changed;
// an alert is recorded once across the fleet by its unique key).
type changeSet struct {
	on      bool
	mu      sync.Mutex
	pending map[store.AccountRef]struct{}
	ready   chan struct{}
}

func (c *changeSet) init() {
	c.mu.Lock()
	if c.ready == nil {
		c.ready = make(chan struct{}, 1)
	}
	c.mu.Unlock()
}

func (c *changeSet) add(userID, serviceID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on {
		return
	}
	if c.pending == nil {
		c.pending = make(map[store.AccountRef]struct{})
	}
	c.pending[store.AccountRef{UserID: userID, ServiceID: serviceID}] = struct{}{}
}

func (c *changeSet) publish() {
	c.mu.Lock()
	n, ready := len(c.pending), c.ready
	c.mu.Unlock()
	if n > 0 && ready != nil {
		select {
		case ready <- struct{}{}:
		default:
		}
	}
}

// RequeueChanged puts refs back among the changed subscriptions.
func (s *Store) RequeueChanged(refs []store.AccountRef) {
	for _, ref := range refs {
		s.changes.add(ref.UserID, ref.ServiceID)
	}
	s.changes.publish()
}

// ChangedAccounts returns the subscriptions whose counters or credits this
// node changed since the last call, and a channel ready when there are
// more.
func (s *Store) ChangedAccounts() ([]store.AccountRef, <-chan struct{}) {
	c := &s.changes
	c.init()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = true
	out := make([]store.AccountRef, 0, len(c.pending))
	for ref := range c.pending {
		out = append(out, ref)
	}
	clear(c.pending)
	return out, c.ready
}

// rowEntry is the ledger entry a row holds: its entry column read by
// decodeEntry, with the seq, id, time, user and service its own columns
// hold. A row keeps only the rest in its entry (store.AppendLedgerEntryDetailJSON:
// five fields fewer for PostgreSQL to parse and store); rows written
// before have all of it there, the same values.
func rowEntry(raw []byte, seq int64, t time.Time, userID, serviceID string) (store.LedgerEntry, error) {
	e, err := decodeEntry(raw)
	e.Seq, e.ID, e.Time, e.UserID, e.ServiceID = uint64(seq), "led_"+strconv.FormatInt(seq, 10), t.UTC(), userID, serviceID
	return e, err
}

// decodeEntry reads a ledger row as stored: its quantities as store.Amount,
// so that one past billing.MaxUnits (a cost that saturated) reads back.
func decodeEntry(raw []byte) (store.LedgerEntry, error) {
	var r struct {
		store.LedgerEntry
		Units        store.Amount `json:"units"`
		Overage      store.Amount `json:"overage,omitempty"`
		Cost         store.Amount `json:"cost,omitempty"`
		UnitsClaimed store.Amount `json:"unitsClaimed,omitempty"`
	}
	err := json.Unmarshal(raw, &r)
	e := r.LedgerEntry
	e.Units, e.Overage, e.Cost, e.UnitsClaimed = billing.Units(r.Units), billing.Units(r.Overage), billing.Units(r.Cost),
		billing.Units(r.UnitsClaimed)
	return e, err
}
