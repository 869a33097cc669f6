package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// jobHoldTTL is the expiry of a job's lease row: a job's hold ends with
// the job (completion, failure or ExpireJobs), never by lease expiry.
const jobHoldTTL = 100 * 365 * 24 * time.Hour

func jobHolder(id string) string { return "job/" + id }

func insertJob(ctx context.Context, tx pgx.Tx, rec jobRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "INSERT INTO jobs (id, open, expires_at, rec) VALUES ($1, $2, $3, $4)",
		rec.ID, !rec.job().Terminal(), rec.ExpiresAt, raw)
	if uniqueViolation(err) {
		return store.ErrExists
	}
	return err
}

// CreateJob stores a new job that holds nothing.
func (s *Store) CreateJob(ctx context.Context, j store.Job) error {
	if err := store.CtxErr(ctx); err != nil {
		return err
	}
	j.ReservationID = ""
	return s.tx(ctx, func(tx pgx.Tx) error { return insertJob(ctx, tx, toJobRecord(j, nil)) })
}

// errJobRefused rolls back a job whose hold was refused.
var errJobRefused = errors.New("job refused")

// CreateJobReserved holds units for a and stores the job in one
// transaction. The hold is a lease row held by the job, taken with the
// same conditional statement as a node's lease, so any node can end it.
func (s *Store) CreateJobReserved(ctx context.Context, j store.Job, a store.Account, units billing.Units, now time.Time) (store.Reservation, error) {
	if err := store.CheckUnits(units); err != nil {
		return store.Reservation{}, err
	}
	if j.Terminal() {
		return store.Reservation{},
			fmt.Errorf("create job %s: a job holding units must start open, not %s", j.ID, j.Status)
	}
	if err := store.CtxErr(ctx); err != nil {
		return store.Reservation{}, err
	}
	j.ReservationID = ""
	j = j.WithTerms(a) // the terms name the product the hold is taken under
	if a.Free {
		err := s.tx(ctx, func(tx pgx.Tx) error { return insertJob(ctx, tx, toJobRecord(j, nil)) })
		if err != nil {
			return store.Reservation{}, err
		}
		return store.Reservation{Account: a, Decision: billing.Decision{Allowed: true, Units: units}, JobID: j.ID}, nil
	}
	sub, err := s.getSubscription(ctx, a.UserID, a.ServiceID)
	if err != nil {
		return store.Reservation{}, err
	}
	k := AllowanceKey{a.UserID, a.ServiceID, periodOf(a.Product, sub.StartedAt, now)}
	lim := limitsOf(a.Product)
	var (
		dec   billing.Decision
		state billing.State
		after row // the rows once the hold is taken, shown after the commit
	)
	err = s.tx(ctx, func(tx pgx.Tx) error {
		job := j
		job.ReservationID = jobHolder(j.ID)
		if err := insertJob(ctx, tx, toJobRecord(job, &k)); err != nil {
			return err
		}
		// The hold is a lease row of the job, in every dimension its
		// decision holds (so that State shows it as held, as bbolt does),
		// checked against the product's hard limits. The node's lease is
		// read (view) before the grant takes the allowance's rows, never
		// after: a call of this node leasing a block holds the lease's
		// mutex while its grant waits for those rows, and this
		// transaction waiting for the mutex while holding them was a
		// deadlock neither PostgreSQL nor Go could see
		// (TestJobCreationBesideALeaseGrant).
		before, err := scanRow(tx.QueryRow(ctx, stateSQL, k.UserID, k.ServiceID, k.Period))
		if err != nil {
			return err
		}
		if !before.hasSub {
			return store.ErrNoAccount
		}
		state = s.view(k, a.Product, before)
		dec = billing.Decide(a.Product, state, units)
		need := lim.Need(units)
		need.Units, need.Spend = units, dec.Cost
		if a.Product.BillingModel == billing.Prepaid {
			need.Credits = dec.Cost
		}
		g, _, err := grant(ctx, tx, jobHolder(j.ID), k, lim, need, need, jobHoldTTL)
		if errors.Is(err, errNoSub) {
			return store.ErrNoAccount
		}
		if err != nil {
			return err
		}
		if !g.OK {
			dec = refusal(a.Product, lim, g, units)
			return errJobRefused
		}
		if after, err = scanRow(tx.QueryRow(ctx, stateSQL, k.UserID, k.ServiceID, k.Period)); err != nil {
			return err
		}
		dec.Allowed, dec.Code, dec.Reason = true, "", ""
		return nil
	})
	if errors.Is(err, errJobRefused) {
		return store.Reservation{Decision: dec, State: state}, nil
	}
	if err != nil {
		return store.Reservation{}, err
	}
	state = s.view(k, a.Product, after) // the rows' locks released
	return store.Reservation{ID: jobHolder(j.ID), Account: a, Decision: dec, PeriodKey: k.Period, JobID: j.ID, State: state}, nil
}

func scanJob(row pgx.Row) (jobRecord, error) {
	var raw []byte
	var rec jobRecord
	if err := row.Scan(&raw); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return rec, store.ErrNotFound
		}
		return rec, err
	}
	return rec, json.Unmarshal(raw, &rec)
}

// noSuchText reports whether any of ss is text no row holds: not UTF-8,
// or holding U+0000, which PostgreSQL refuses as a text parameter (an
// error, where the store file finds nothing). A read given such an id,
// filter or cursor answers as for an id nobody has (the admin API's and
// the console's filters come from query strings).
func noSuchText(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return true
		}
	}
	return false
}

// GetJob reads a job, whichever node created or changed it.
func (s *Store) GetJob(ctx context.Context, id string) (store.Job, error) {
	if noSuchText(id) {
		return store.Job{}, store.ErrNotFound
	}
	rec, err := scanJob(s.pool.QueryRow(ctx, "SELECT rec FROM jobs WHERE id = $1", id))
	if err != nil {
		return store.Job{}, s.fail(err)
	}
	return rec.job(), nil
}

// UpdateJob changes a job through fn in one transaction.
func (s *Store) UpdateJob(ctx context.Context, id string, fn func(*store.Job) error) (store.Job, error) {
	return s.CompleteJob(ctx, id, store.Account{}, store.LedgerEntry{}, fn)
}

// CompleteJob changes a job through fn and, when fn ends it, settles the
// job's hold and meters e in the same transaction.
func (s *Store) CompleteJob(ctx context.Context, id string, a store.Account, e store.LedgerEntry, fn func(*store.Job) error) (store.Job, error) {
	if err := store.CheckUnits(e.Units); err != nil {
		return store.Job{}, err
	}
	if err := store.CtxErr(ctx); err != nil {
		return store.Job{}, err
	}
	if noSuchText(id) {
		return store.Job{}, store.ErrNotFound
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if err := s.ensurePartition(ctx, e.Time); err != nil {
		return store.Job{}, err
	}
	var out store.Job
	var changed *AllowanceKey
	spare := &jobSpare{leaser: s.leaser}
	attempt := func(tx pgx.Tx) error {
		spare.used, spare.ended = false, false
		changed = nil
		rec, err := scanJob(tx.QueryRow(ctx, "SELECT rec FROM jobs WHERE id = $1 FOR UPDATE", id))
		if err != nil {
			return err
		}
		j := rec.job()
		wasOpen := !j.Terminal()
		before := j
		if err := fn(&j); err != nil {
			return err
		}
		j.ReservationID, j.Terms = before.ReservationID, before.Terms
		if wasOpen && j.Terminal() {
			ca, ce := before.Charge(a, e) // under the job's terms, when it has them
			if changed, err = endJob(ctx, tx, &j, rec.HoldKey, ca, ce, spare); err != nil {
				return err
			}
		}
		raw, err := json.Marshal(toJobRecord(j, rec.HoldKey))
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "UPDATE jobs SET rec = $2, open = $3, expires_at = $4 WHERE id = $1",
			id, raw, !j.Terminal(), j.ExpiresAt); err != nil {
			return err
		}
		out = j
		spare.ended = true
		return nil
	}
	err := s.tx(ctx, attempt)
	for range 2 { // each at most once (jobSpare.asked, askedOthers)
		switch {
		case errors.Is(err, errWantSpare):
			// Cut at a limit while the node's own lease may have free units
			// for the allowance: they are taken out of the lease here,
			// outside any transaction (TakeFree may wait for a grant in
			// flight, which may wait for the rows the transaction locked),
			// and the completion runs again with them.
			spare.sp = s.leaser.TakeFree(spare.key, spare.lim, spare.want)
		case errors.Is(err, errWantOthers):
			// Cut at a limit while other nodes hold leases on the
			// allowance: they are asked to give back what they do not use,
			// and the completion runs again.
			s.askLeasesBack(ctx, spare.othersKey, spare.others)
		default:
			continue
		}
		err = s.tx(ctx, attempt)
	}
	spare.finish(err)
	if err == nil && changed != nil {
		s.touched(*changed)
	}
	return out, err
}

// ExpireJobs fails every open job whose deadline has passed, releasing
// its hold, a bounded number per transaction.
func (s *Store) ExpireJobs(ctx context.Context, now time.Time, message string) (int, error) {
	if err := store.CtxErr(ctx); err != nil {
		return 0, err
	}
	total := 0
	for {
		n := 0
		var changed []AllowanceKey
		err := s.tx(ctx, func(tx pgx.Tx) error {
			n, changed = 0, nil
			// expires_at <= now is store.Job.Expired's rule (now >= ExpiresAt).
			// The column holds microseconds and pgx truncates both sides
			// alike, so the query never misses a job the rule expires; a
			// job due within the same microsecond after now is selected too
			// and left alone by the check below on its full deadline.
			rows, err := tx.Query(ctx, `SELECT rec FROM jobs WHERE open AND expires_at <= $1 ORDER BY expires_at
				LIMIT 256 FOR UPDATE SKIP LOCKED`, now)
			if err != nil {
				return err
			}
			recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (jobRecord, error) { return scanJob(r) })
			if err != nil {
				return err
			}
			for _, rec := range recs {
				j := rec.job()
				if j.Terminal() || !j.Expired(now) {
					continue
				}
				j.Status, j.ErrorMessage = store.JobFailed, message
				j.UpdatedAt, j.CompletedAt = now.UTC(), now.UTC()
				k, err := endJob(ctx, tx, &j, rec.HoldKey, store.Account{}, store.LedgerEntry{}, nil)
				if err != nil {
					return err
				}
				if k != nil {
					changed = append(changed, *k)
				}
				raw, err := json.Marshal(toJobRecord(j, rec.HoldKey))
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "UPDATE jobs SET rec = $2, open = false WHERE id = $1", j.ID, raw); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		total += n
		for _, k := range changed {
			s.touched(k)
		}
		if err != nil || n < 256 {
			return total, err
		}
	}
}

// endJob ends the hold of a job that has just become terminal, in the
// transaction that stores it: the job's lease row is given back, and a
// COMPLETED job's units are charged to a, capped at the hard limits, into
// the period the hold was taken in; a charge past them may use the node's
// free leased units (sp: nil for none). It returns the allowance it
// changed.
func endJob(ctx context.Context, tx pgx.Tx, j *store.Job, hold *AllowanceKey, a store.Account, e store.LedgerEntry, sp *jobSpare) (*AllowanceKey, error) {
	units := e.Units
	if j.Status != store.JobCompleted {
		units = 0
	}
	var acc *account
	var held billing.Units // what the job's hold had, the least its charge is
	var pre int64          // the hold's credits held at a deferred expiry (heldexpiry.go)
	if hold != nil && j.ReservationID != "" {
		var err error
		acc, err = lockAccount(ctx, tx, hold.UserID, hold.ServiceID, billing.Product{}, hold.Period, time.Now())
		if errors.Is(err, store.ErrNoAccount) {
			acc, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		if acc != nil {
			var u, sp, c int64
			err := tx.QueryRow(ctx, `DELETE FROM leases WHERE holder = $1 AND user_id = $2 AND service_id = $3 AND period = $4
				RETURNING units, spend, credits, least(pre_credits, credits)`, jobHolder(j.ID), hold.UserID, hold.ServiceID,
				hold.Period).Scan(&u, &sp, &c, &pre)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return nil, err
			}
			acc.state.Reserved -= billing.Units(u)
			acc.state.ReservedSpend -= billing.Units(sp)
			acc.state.CreditsHeld -= billing.Units(c)
			held = billing.Units(u)
		}
	}
	if units == 0 || a.Free {
		if acc != nil && pre > 0 {
			x, err := giveBackDeferred(ctx, tx, acc.key.UserID, acc.key.ServiceID, billing.Units(pre))
			if err != nil {
				return nil, err
			}
			acc.state.Credits -= x
		}
		if acc != nil {
			if err := acc.save(ctx, tx); err != nil {
				return nil, err
			}
		}
		if units == 0 {
			return keyOf(acc), nil
		}
		entry := e
		entry.Units, entry.ProductID = units, ""
		if err := insertLedger(ctx, tx, "job:"+j.ID, &entry); err != nil {
			return nil, err
		}
		j.Units, j.Cost = entry.Units, 0
		return keyOf(acc), nil
	}
	if acc == nil {
		var err error
		if acc, err = lockAccount(ctx, tx, a.UserID, a.ServiceID, a.Product, 0, e.Time); err != nil {
			return nil, err
		}
	}
	p := a.Product
	acc.inUnit(p.CostUnit())
	entry := e
	entry.Units = units
	dec := billing.DecideCharge(p, acc.state, units)
	if !dec.Allowed && sp != nil {
		ok, err := sp.cover(ctx, tx, acc, p, units)
		if err != nil {
			return nil, err
		}
		if ok {
			dec = billing.DecideCharge(p, acc.state, units)
		}
		if !dec.Allowed {
			if err := sp.askOthers(ctx, tx, acc, p); err != nil {
				return nil, err
			}
		}
	}
	if !dec.Allowed {
		dec = store.ChargeFloor(p, acc.state, units, held, &entry)
	}
	acc.charge(p, dec)
	entry.Overage, entry.Cost = dec.Overage, dec.Cost
	if pre > 0 && hold != nil && acc.key.UserID == hold.UserID && acc.key.ServiceID == hold.ServiceID {
		// Held at a deferred expiry: what the charge takes of the hold is
		// spent, the rest given back (heldexpiry.go).
		var c billing.Units
		if p.BillingModel == billing.Prepaid {
			c = min(max(dec.Cost, 0), billing.Units(pre))
		}
		x, err := giveBackDeferred(ctx, tx, acc.key.UserID, acc.key.ServiceID, billing.Units(pre)-c)
		if err != nil {
			return nil, err
		}
		acc.state.Credits -= x
	}
	if err := acc.save(ctx, tx); err != nil {
		return nil, err
	}
	if entry.Units > 0 || entry.UnitsClaimed > 0 {
		if err := insertLedger(ctx, tx, "job:"+j.ID, &entry); err != nil {
			return nil, err
		}
	}
	j.Units, j.Cost = entry.Units, entry.Cost
	return keyOf(acc), nil
}

// touched drops what the node knows of an allowance another path than the
// settlement batches changed, and tells the alerts.
func (s *Store) touched(k AllowanceKey) {
	s.cache.dropSub(k.UserID, k.ServiceID)
	s.forget(k.UserID, k.ServiceID)
	s.changes.add(k.UserID, k.ServiceID)
	s.changes.publish()
}

func keyOf(acc *account) *AllowanceKey {
	if acc == nil {
		return nil
	}
	return &acc.key
}

// errWantSpare rolls back a job's completion that was cut at a limit
// while the node's own lease may have free units for the allowance: the
// completion runs again with them (CompleteJob).
var errWantSpare = errors.New("pgstore: the completion asks for the node's free leased units")

// jobSpare lets a job's completion past its hold be charged from the
// node's free leased units, as a sync call's settlement is (Leaser.Settle):
// the database counts the node's whole lease as leased, so without them a
// completion near a hard limit was cut by units the node itself had idle.
// The units leave the lease in memory before the transaction (no call is
// admitted from them meanwhile) and its row in the transaction that
// charges them; what the transaction did not take goes back (finish).
type jobSpare struct {
	leaser *Leaser
	asked  bool          // a first attempt asked for the lease's free units
	key    AllowanceKey  // what it asked for: the allowance,
	lim    Limits        // under these limits,
	want   billing.Units // and the units its charge was cut by
	sp     Spare         // what was taken out of the lease
	used   bool          // this attempt took sp out of the lease row
	ended  bool          // this attempt's work ended well: an error after it is the COMMIT's

	// askedOthers: an attempt asked the other nodes holding leases on the
	// allowance (others, on othersKey) to give back what they do not use.
	askedOthers bool
	othersKey   AllowanceKey
	others      []string
}

// errWantOthers rolls back a job's completion that was cut at a limit
// while other nodes hold leases on the allowance: they are asked to give
// back what they do not use and the completion runs again (CompleteJob).
var errWantOthers = errors.New("pgstore: the completion asks the other nodes for the units their leases do not use")

// othersLeasesSQL reads the live lease rows of other nodes on an
// allowance that hold something (not the holds of jobs, not this node's,
// whose prefix is $4).
const othersLeasesSQL = `SELECT holder FROM leases WHERE user_id = $1 AND service_id = $2 AND period = $3
	AND left(holder, 4) <> 'job/' AND left(holder, length($4)) <> $4 AND expires_at > now()
	AND (units > 0 OR spend > 0 OR credits > 0)`

// askOthers is called when a completion is cut at a limit even with the
// node's own free leased units: when other nodes' leases on the
// allowance hold units, the first attempt that finds them rolls back
// (errWantOthers) so that CompleteJob asks those nodes for them. Without
// it, a completion was cut by the units another node had leased and did
// not use (a found leftover, docs/fleet.md "Async jobs").
func (sp *jobSpare) askOthers(ctx context.Context, tx pgx.Tx, acc *account, p billing.Product) error {
	if sp.askedOthers || !limitsOf(p).Hard() {
		return nil
	}
	rows, err := tx.Query(ctx, othersLeasesSQL, acc.key.UserID, acc.key.ServiceID, acc.key.Period, sp.leaser.node+"/")
	if err != nil {
		return err
	}
	holders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(holders) == 0 {
		return err
	}
	sp.askedOthers, sp.othersKey, sp.others = true, acc.key, holders
	return errWantOthers
}

// giveBackWait bounds how long a completion waits for other nodes to give
// their leases back (askLeasesBack): a node that uses its lease, or is
// dead, does not, and the completion is then cut as before.
const giveBackWait = 500 * time.Millisecond

// askLeasesBack asks every node (NOTIFY) to give back its lease on k if it
// does not use it (Leaser.GiveBack), and waits until the rows of holders
// are gone, for at most giveBackWait.
func (s *Store) askLeasesBack(ctx context.Context, k AllowanceKey, holders []string) {
	ctx, cancel := context.WithTimeout(ctx, giveBackWait)
	defer cancel()
	if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, $2)", notifyChannel, notifyGiveBack(k)); err != nil {
		return
	}
	for {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM leases WHERE holder = ANY($1) AND user_id = $2 AND service_id = $3 AND period = $4`,
			holders, k.UserID, k.ServiceID, k.Period).Scan(&n)
		if err != nil || n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// shrinkLeaseSQL takes a charge's units out of a node's lease row, if it
// still holds them (a lease given back meanwhile has no row: its units
// went back to the allowance, and the charge does without them).
const shrinkLeaseSQL = `UPDATE leases SET units = units - $5, spend = spend - $6, credits = credits - $7,
		pre_credits = greatest(pre_credits - $7, 0)
	WHERE holder = $1 AND user_id = $2 AND service_id = $3 AND period = $4
	  AND units >= $5 AND spend >= $6 AND credits >= $7`

// cover is called when acc's state does not allow a charge of units of p:
// it makes the node's free leased units available to it, taking them out
// of the node's lease row and of what acc counts as leased, and reports
// whether it did. The first attempt only asks for them (errWantSpare),
// when the node's lease may have some.
func (sp *jobSpare) cover(ctx context.Context, tx pgx.Tx, acc *account, p billing.Product, units billing.Units) (bool, error) {
	lim := limitsOf(p)
	if !lim.Hard() {
		return false, nil
	}
	if !sp.asked {
		if !sp.leaser.MayHaveFree(acc.key, lim) {
			return false, nil
		}
		sp.asked, sp.key, sp.lim = true, acc.key, lim
		sp.want = units - billing.FitCharge(p, acc.state, units)
		return false, errWantSpare
	}
	need := sp.sp.Need
	if need.IsZero() || sp.sp.Key != acc.key || !sameLimits(sp.lim, lim) {
		return false, nil
	}
	tag, err := tx.Exec(ctx, shrinkLeaseSQL, sp.sp.Holder, acc.key.UserID, acc.key.ServiceID, acc.key.Period,
		int64(need.Units), int64(need.Spend), int64(need.Credits))
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	sp.used = true
	acc.state.Reserved -= need.Units
	acc.state.ReservedSpend -= need.Spend
	acc.state.CreditsHeld -= need.Credits
	return true, nil
}

// finish gives the lease back what the completion did not take from its
// row: everything when the transaction rolled back before its COMMIT, what
// its last attempt did not use when it committed. When the COMMIT itself
// failed the transaction may have committed: what the attempt took from
// the row stays out of the lease, idle in its row until the lease is given
// back (never admitted from units the row may no longer hold).
func (sp *jobSpare) finish(err error) {
	if sp.sp.Need.IsZero() {
		return
	}
	if sp.used && (err == nil || sp.ended) {
		return
	}
	sp.leaser.PutBack(sp.sp, sp.sp.Need)
}
