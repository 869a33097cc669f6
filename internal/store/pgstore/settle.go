package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

type subKey struct{ user, service string }

// commitSettlements writes a batch in one transaction.
func (s *Store) commitSettlements(batch []*settlement) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var month time.Time // a batch's calls mostly share one
	for _, st := range batch {
		if m := monthStart(st.entry.Time); !m.Equal(month) {
			if err := s.ensurePartition(ctx, st.entry.Time); err != nil {
				return err
			}
			month = m
		}
	}
	var err error
	lookup := false
	for attempt := 0; attempt < 5; attempt++ {
		err = s.commitOnce(ctx, batch, lookup)
		if errors.Is(err, errAlreadyWritten) {
			// Some of the batch was written by an earlier attempt (a commit
			// whose answer was lost, a replay after a crash): the same batch
			// again, reading those rows first so they are not charged twice.
			lookup, attempt = true, attempt-1
			continue
		}
		if !retryable(err) {
			break
		}
		lookup = true // an attempt that failed may have committed
	}
	return s.fail(err)
}

// errAlreadyWritten: a batch written without looking up its calls first
// found some of them in the ledger already; the transaction was rolled
// back and the batch is written again with the lookup.
var errAlreadyWritten = errors.New("pgstore: some settlements of the batch are in the ledger already")

// errWrittenMeanwhile: a batch written after looking up its calls found
// one of them inserted since the lookup; rolled back, charged nothing.
var errWrittenMeanwhile = errors.New("pgstore: a settlement of the batch was written to the ledger by another writer")

// commitOnce writes batch in one transaction. With lookup, it first reads
// the ledger rows the batch's calls already have (written by an earlier
// attempt) and charges only the others. Without it, it charges every call
// and checks, before the COMMIT, that every ledger row was inserted (the
// insert skips a call id that is there already): if one was not, it rolls
// back and answers errAlreadyWritten. Almost every batch is new, so the
// lookup, a probe of the ledger's unique index per call, is paid only when
// a row is found where none was expected.
func (s *Store) commitOnce(ctx context.Context, batch []*settlement, lookup bool) (err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	defer func() {
		if err != nil && !conn.Conn().PgConn().IsClosed() {
			conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()

	// The rows to lock, in the one order every statement locks them.
	var (
		keys       []AllowanceKey
		subs       []subKey
		hrefs      []LeaseRef
		callIDs    []string
		callTimes  []time.Time
		seenKey    = map[AllowanceKey]bool{}
		seenSub    = map[subKey]bool{}
		seenHolder = map[LeaseRef]bool{}
	)
	for _, st := range batch {
		callIDs = append(callIDs, st.callID)
		callTimes = append(callTimes, st.entry.Time)
		if st.free {
			continue
		}
		if !seenKey[st.key] {
			seenKey[st.key] = true
			keys = append(keys, st.key)
		}
		sk := subKey{st.key.UserID, st.key.ServiceID}
		if !seenSub[sk] {
			seenSub[sk] = true
			subs = append(subs, sk)
		}
		if st.holder != "" {
			if hk := (LeaseRef{st.holder, st.key}); !seenHolder[hk] {
				seenHolder[hk] = true
				hrefs = append(hrefs, hk)
			}
		}
	}
	slices.SortFunc(subs, func(a, b subKey) int {
		return strings.Compare(a.user+"\x00"+a.service, b.user+"\x00"+b.service)
	})
	su, ss := make([]string, len(subs)), make([]string, len(subs))
	for i, k := range subs {
		su[i], ss[i] = k.user, k.service
	}
	ku, ks, kp := splitKeys(keys)
	// The lease rows in the order they are locked, each holder with its
	// own allowance.
	slices.SortFunc(hrefs, func(a, b LeaseRef) int {
		if c := strings.Compare(a.Holder, b.Holder); c != 0 {
			return c
		}
		return compareKeys(a.Key, b.Key)
	})
	holders := make([]string, len(hrefs))
	hkeys := make([]AllowanceKey, len(hrefs))
	for i, r := range hrefs {
		holders[i], hkeys[i] = r.Holder, r.Key
	}
	hu, hs, hp := unzipKeys(hkeys)

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`INSERT INTO allowances (user_id, service_id, period) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
		ORDER BY 1, 2, 3 ON CONFLICT DO NOTHING`, ku, ks, kp)
	b.Queue(`SELECT s.user_id, s.service_id, s.credits, s.credits_held FROM subscriptions s
		JOIN unnest($1::text[], $2::text[]) k(u, sv) ON s.user_id = k.u AND s.service_id = k.sv
		ORDER BY s.user_id, s.service_id FOR UPDATE OF s`, su, ss)
	b.Queue(`SELECT a.user_id, a.service_id, a.period, a.used, a.leased_units, a.spend, a.leased_spend, a.spend_unit, a.spend_other::text FROM allowances a
		JOIN unnest($1::text[], $2::text[], $3::bigint[]) k(u, sv, p) ON a.user_id = k.u AND a.service_id = k.sv AND a.period = k.p
		ORDER BY a.user_id, a.service_id, a.period FOR UPDATE OF a`, ku, ks, kp)
	b.Queue(`SELECT l.holder, l.user_id, l.service_id, l.period, l.units, l.spend, l.credits, l.pre_credits FROM leases l
		JOIN unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) k(h, u, sv, p)
		  ON l.holder = k.h AND l.user_id = k.u AND l.service_id = k.sv AND l.period = k.p
		ORDER BY 1, 2, 3, 4 FOR UPDATE OF l`, holders, hu, hs, hp)
	if lookup {
		b.Queue(`SELECT l.call_id, l.seq, l.time, l.user_id, l.service_id, l.entry FROM ledger l JOIN unnest($1::text[], $2::timestamptz[]) k(c, t)
		ON l.call_id = k.c AND l.time = k.t`, callIDs, callTimes)
	}
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return err
	}
	if _, err := br.Exec(); err != nil {
		br.Close()
		return err
	}
	subRows := map[subKey]*row{}
	rows, _ := br.Query()
	for rows.Next() {
		var k subKey
		var c, h int64
		if err := rows.Scan(&k.user, &k.service, &c, &h); err != nil {
			rows.Close()
			br.Close()
			return err
		}
		subRows[k] = &row{credits: billing.Units(c), creditsHeld: billing.Units(h), hasSub: true}
	}
	if err := rows.Err(); err != nil {
		br.Close()
		return err
	}
	allow := map[AllowanceKey]*row{}
	rows, _ = br.Query()
	for rows.Next() {
		var k AllowanceKey
		var u, l, sp, ls int64
		var unit, other *string
		if err := rows.Scan(&k.UserID, &k.ServiceID, &k.Period, &u, &l, &sp, &ls, &unit, &other); err != nil {
			rows.Close()
			br.Close()
			return err
		}
		r := &row{used: billing.Units(u), leased: billing.Units(l), spend: billing.Units(sp), leasedSpend: billing.Units(ls)}
		if unit != nil {
			r.unit, r.unitSet = *unit, true
		}
		if other != nil {
			r.other = *other
		}
		allow[k] = r
	}
	if err := rows.Err(); err != nil {
		br.Close()
		return err
	}
	type leaseKey struct {
		holder string
		k      AllowanceKey
	}
	leaseRows := map[leaseKey]*Vec{}
	// leasePre: what each row holds of what it held at a deferred expiry
	// of its subscription (heldexpiry.go); a charge takes it first.
	leasePre := map[leaseKey]int64{}
	rows, _ = br.Query()
	for rows.Next() {
		var lk leaseKey
		var u, sp, c, pre int64
		if err := rows.Scan(&lk.holder, &lk.k.UserID, &lk.k.ServiceID, &lk.k.Period, &u, &sp, &c, &pre); err != nil {
			rows.Close()
			br.Close()
			return err
		}
		leaseRows[lk] = &Vec{billing.Units(u), billing.Units(sp), billing.Units(c)}
		leasePre[lk] = pre
	}
	if err := rows.Err(); err != nil {
		br.Close()
		return err
	}
	dups := map[string]store.LedgerEntry{}
	if lookup {
		rows, _ = br.Query()
		for rows.Next() {
			var id, user, service string
			var seq int64
			var t time.Time
			var raw []byte
			if err := rows.Scan(&id, &seq, &t, &user, &service, &raw); err != nil {
				rows.Close()
				br.Close()
				return err
			}
			e, err := rowEntry(raw, seq, t, user, service)
			if err != nil {
				rows.Close()
				br.Close()
				return err
			}
			dups[id] = e
		}
		if err := rows.Err(); err != nil {
			br.Close()
			return err
		}
	}
	if err := br.Close(); err != nil {
		return err
	}
	// A charge whose lease row has ended: what the row's end expired of
	// the credits it held at a deferred expiry (lease_pre_ended,
	// heldexpiry.go). Read only when such a charge is in the batch.
	lapsed, err := readPreEnded(ctx, conn, batch, func(h string, k AllowanceKey) bool { return leaseRows[leaseKey{h, k}] != nil })
	if err != nil {
		return err
	}
	unexpired := map[subKey]billing.Units{}

	// Apply each settlement to the locked rows, in order.
	var ins ledgerRows
	touchedLease := map[leaseKey]bool{}
	// overdrawn: subscriptions a charge floored at its hold took past a
	// limit into units leases hold (see below).
	var overdrawn []subKey
	for i, st := range batch {
		st.err = nil
		if e, ok := dups[st.callID]; ok {
			st.out = e // written by an earlier attempt of this batch
			continue
		}
		entry := st.entry
		entry.Units = st.units
		if st.free {
			entry.ProductID = ""
			st.out = entry
			ins.add(i, st.callID, st.seq, entry)
			continue
		}
		sub := subRows[subKey{st.key.UserID, st.key.ServiceID}]
		a := allow[st.key]
		if sub == nil || a == nil {
			if !st.logged {
				st.err = store.ErrNoAccount
				continue
			}
			// Acknowledged from the settlement log, and its subscription
			// is gone since (a row deleted by hand, a database restored
			// from before it was made): recorded, charged nothing, with
			// the units it stated kept in unitsClaimed, as a charge cut
			// at a limit is. It was dropped (logged, then released from
			// the log with the others): an acknowledged charge lost.
			entry.UnitsClaimed, entry.Units, entry.Overage, entry.Cost = st.units, 0, 0, 0
			st.out = store.LedgerEntry{}
			if st.units > 0 {
				ins.add(i, st.callID, st.seq, entry)
				st.out = entry
			}
			continue
		}
		p := st.product
		if !st.anyUnit {
			a.inUnit(p.CostUnit()) // its spend counts in the product's cost unit (spend.go)
		}
		state := billing.State{Used: a.used, Reserved: a.leased, Spend: a.spend, ReservedSpend: a.leasedSpend,
			Credits: sub.credits, CreditsHeld: sub.creditsHeld}
		covered := st.covered
		if st.holder != "" {
			lk := leaseKey{st.holder, st.key}
			lv := leaseRows[lk]
			if lv != nil && st.consume.within(*lv) {
				// The charge's units leave the lease: no longer leased.
				*lv = lv.sub(st.consume)
				if pre := leasePre[lk]; pre > 0 {
					leasePre[lk] = max(0, pre-int64(st.consume.Credits))
				}
				touchedLease[lk] = true
				state.Reserved -= st.consume.Units
				state.ReservedSpend -= st.consume.Spend
				state.CreditsHeld -= st.consume.Credits
			} else {
				covered = false // the lease was returned meanwhile: capped below
			}
		}
		// Credits the call held of its row when the row ended and the end
		// expired: the call spent them (heldexpiry.go), up to its charge,
		// oldest first: what the end gave back under them that does not
		// expire (below) first.
		var back billing.Units
		var pre *preEnded
		if st.holder != "" && st.consume.Credits > 0 {
			if pre = lapsed[LeaseRef{st.holder, st.key}]; pre != nil && pre.credits > 0 {
				back = min(pre.credits, max(0, st.consume.Credits-pre.below))
				state.Credits += back
			} else {
				pre = nil
			}
		}
		leasedSpend := state.ReservedSpend
		var dec billing.Decision
		floored := false
		if st.units > 0 {
			dec = billing.DecideCharge(p, state, st.units)
			if !dec.Allowed && !covered {
				// Cut at the limits, never below what the call held, as
				// far as it stated (store.ChargeFloor, as bbolt charges
				// it): a lease row given back while the call was in
				// flight (a lapse, the row swept) put its hold back in
				// the allowance, and what took that room meanwhile (a
				// report, credits taken back, other nodes' calls) was
				// never promised it. Capped with no floor, such a call
				// was charged 0 units: served free.
				dec = store.ChargeFloor(p, state, st.units, st.held, &entry)
				floored = true
			}
			dec.Units = entry.Units
			state.Charge(p, dec)
			entry.Overage, entry.Cost = dec.Overage, dec.Cost
		}
		if pre != nil {
			var paid billing.Units // what the call spent of its hold
			if p.BillingModel == billing.Prepaid {
				paid = min(max(dec.Cost, 0), st.consume.Credits)
			}
			under := min(pre.below, paid)
			spent := min(back, paid-under)
			state.Credits -= back - spent // not spent: it stays expired
			pre.below -= under
			if spent > 0 {
				pre.credits -= spent
				unexpired[subKey{st.key.UserID, st.key.ServiceID}] += spent
			}
		}
		if sk := (subKey{st.key.UserID, st.key.ServiceID}); floored && leasesOverdrawn(limitsOf(p), state) && !slices.Contains(overdrawn, sk) {
			// Charged its hold past the limit, into units other leases
			// hold (other nodes' calls took the room the lapsed lease gave
			// back): those leases stand for nothing left, and must not
			// admit more calls, as after a report past the limit (Record).
			overdrawn = append(overdrawn, sk)
		}
		a.used, a.spend, a.leased, a.leasedSpend = state.Used, state.Spend, state.Reserved, leasedSpend
		sub.credits, sub.creditsHeld = state.Credits, state.CreditsHeld
		if entry.Units > 0 || entry.UnitsClaimed > 0 {
			ins.add(i, st.callID, st.seq, entry)
			st.out = entry
		} else {
			st.out = store.LedgerEntry{}
		}
	}

	b = &pgx.Batch{}
	numbered := ins.numbered()
	var inserted int
	if numbered {
		// Sent by COPY (rollups.go): all rows go in or the statement fails,
		// a row already there with a unique violation.
		if len(ins.index) > 0 {
			tag, err := conn.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(ins.copyData()), copyLedgerSQL)
			if err != nil {
				var pe *pgconn.PgError
				if errors.As(err, &pe) && pe.Code == "23505" {
					if lookup {
						return errWrittenMeanwhile
					}
					return errAlreadyWritten
				}
				return err
			}
			inserted = int(tag.RowsAffected())
		}
	} else {
		b.Queue(insertLedgerSQL, ins.insertArgs()...) // rollups.go
	}
	if len(ins.roll.keys) > 0 {
		b.Queue(addRollupsSQL, ins.roll.args()...)
	}
	var au, as []string
	var ap, aused, aleased, aspend, als []int64
	var aunit, aother []*string
	for k, r := range allow {
		au, as, ap = append(au, k.UserID), append(as, k.ServiceID), append(ap, k.Period)
		aused, aleased, aspend, als = append(aused, int64(r.used)), append(aleased, int64(r.leased)), append(aspend, int64(r.spend)), append(als, int64(r.leasedSpend))
		var unit, other *string
		if r.unitSet {
			unit = &r.unit
		}
		if r.other != "" {
			other = &r.other
		}
		aunit, aother = append(aunit, unit), append(aother, other)
	}
	b.Queue(`UPDATE allowances a SET used = k.used, leased_units = k.leased, spend = k.spend, leased_spend = k.ls,
		spend_unit = k.unit, spend_other = k.other::jsonb
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::text[], $9::text[])
			k(u, sv, p, used, leased, spend, ls, unit, other)
		WHERE a.user_id = k.u AND a.service_id = k.sv AND a.period = k.p`, au, as, ap, aused, aleased, aspend, als, aunit, aother)
	var cu, cs []string
	var cc, ch []int64
	for k, r := range subRows {
		cu, cs, cc, ch = append(cu, k.user), append(cs, k.service), append(cc, int64(r.credits)), append(ch, int64(r.creditsHeld))
	}
	b.Queue(`UPDATE subscriptions s SET credits = k.c, credits_held = k.h
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) k(u, sv, c, h)
		WHERE s.user_id = k.u AND s.service_id = k.sv AND (s.credits <> k.c OR s.credits_held <> k.h)`, cu, cs, cc, ch)
	var lh, lu, ls2 []string
	var lp, lun, lsp, lcr, lpre []int64
	for lk := range touchedLease {
		v := leaseRows[lk]
		lh, lu, ls2, lp = append(lh, lk.holder), append(lu, lk.k.UserID), append(ls2, lk.k.ServiceID), append(lp, lk.k.Period)
		lun, lsp, lcr = append(lun, int64(v.Units)), append(lsp, int64(v.Spend)), append(lcr, int64(v.Credits))
		lpre = append(lpre, leasePre[lk])
	}
	b.Queue(`UPDATE leases l SET units = k.units, spend = k.spend, credits = k.credits, pre_credits = k.pre
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[]) k(h, u, sv, p, units, spend, credits, pre)
		WHERE l.holder = k.h AND l.user_id = k.u AND l.service_id = k.sv AND l.period = k.p`, lh, lu, ls2, lp, lun, lsp, lcr, lpre)
	queueUnexpired(b, lapsed, unexpired)
	for _, sk := range overdrawn {
		b.Queue("SELECT pg_notify($1, $2)", notifyChannel, notifyCredits(sk.user, sk.service, -1))
	}
	if numbered && inserted == len(ins.index) {
		// Every row is in: the COMMIT goes with the rest.
		b.Queue("COMMIT")
	}
	br = conn.SendBatch(ctx, b)
	var seqs map[string]int64
	if !numbered {
		seqs = make(map[string]int64, len(ins.index))
		rows, _ = br.Query()
		for rows.Next() {
			var id string
			var seq int64
			if err := rows.Scan(&id, &seq); err != nil {
				rows.Close()
				br.Close()
				return err
			}
			seqs[id] = seq
		}
		if err := rows.Err(); err != nil {
			br.Close()
			return err
		}
		inserted = len(seqs)
	}
	rest := b.Len()
	if !numbered {
		rest-- // the insert's rows were read above
	}
	committed := false
	for range rest {
		tag, err := br.Exec()
		if err != nil {
			br.Close()
			return err
		}
		committed = tag.String() == "COMMIT"
	}
	if err := br.Close(); err != nil {
		return err
	}
	// Every row must have gone in: the rollups added are the batch's sums.
	// A row already there is a call an earlier attempt wrote (rolled back
	// above, charged nothing; the batch is written again with the lookup).
	// With the lookup done, one found here was written meanwhile by someone
	// else: nothing this node does, so an error, never a double charge.
	if inserted != len(ins.index) {
		if lookup {
			return errWrittenMeanwhile
		}
		return errAlreadyWritten
	}
	if !committed {
		tag, err := conn.Exec(ctx, "COMMIT")
		if err != nil {
			return err
		}
		if tag.String() != "COMMIT" {
			return fmt.Errorf("pgstore: the settlement batch's transaction ended with %s", tag)
		}
	}
	for _, i := range ins.index {
		st := batch[i]
		seq := st.seq
		if !numbered {
			seq = seqs[st.callID]
		}
		st.out.Seq = uint64(seq) // its ID when someone asks: result
	}
	for _, sk := range overdrawn {
		s.leaser.Invalidate(sk.user, sk.service) // this node's own, at once
	}
	for k, r := range allow {
		known := *r
		if sub := subRows[subKey{k.UserID, k.ServiceID}]; sub != nil {
			known.credits, known.creditsHeld, known.hasSub = sub.credits, sub.creditsHeld, true
		}
		s.learn(k, known)
		if known.hasSub {
			s.cache.setCredits(k.UserID, k.ServiceID, known.credits, known.creditsHeld)
		}
		s.changes.add(k.UserID, k.ServiceID)
	}
	s.changes.publish()
	return nil
}

func compareKeys(a, b AllowanceKey) int {
	if c := strings.Compare(a.UserID, b.UserID); c != 0 {
		return c
	}
	if c := strings.Compare(a.ServiceID, b.ServiceID); c != 0 {
		return c
	}
	return int(min(max(a.Period-b.Period, -1), 1))
}

// splitKeys sorts keys (the order rows are locked in) and returns them as
// unnest arrays.
func splitKeys(keys []AllowanceKey) (u, sv []string, p []int64) {
	slices.SortFunc(keys, compareKeys)
	return unzipKeys(keys)
}

func unzipKeys(keys []AllowanceKey) (u, sv []string, p []int64) {
	for _, k := range keys {
		u, sv, p = append(u, k.UserID), append(sv, k.ServiceID), append(p, k.Period)
	}
	return u, sv, p
}

// ledgerRows are ledger rows as unnest arrays.
type ledgerRows struct {
	index    []int
	times    []time.Time
	calls    []string
	users    []string
	services []string
	entries  [][]byte
	roll     rollupSums
	seqs     []int64
	buf      []byte // the entries' bytes
}

func (l *ledgerRows) add(i int, callID string, seq int64, e store.LedgerEntry) {
	// The entries of a batch share one buffer (each a slice of it: a
	// buffer that grows leaves the earlier ones where they were).
	n := len(l.buf)
	buf, err := store.AppendLedgerEntryDetailJSON(l.buf, &e) // the rest in columns: rowEntry
	if err != nil {
		buf = l.buf[:n] // a time RFC 3339 cannot hold; json.Marshal writes nothing either
	}
	l.buf = buf
	raw := l.buf[n:len(l.buf):len(l.buf)]
	if err != nil {
		raw = nil
	}
	l.index = append(l.index, i)
	l.times = append(l.times, e.Time)
	l.calls = append(l.calls, callID)
	l.users = append(l.users, e.UserID)
	l.services = append(l.services, e.ServiceID)
	l.entries = append(l.entries, raw)
	l.roll.add(&e)
	l.seqs = append(l.seqs, seq)
}

// numbered reports whether every row has its seq (a settlement log's).
func (l *ledgerRows) numbered() bool {
	for _, q := range l.seqs {
		if q <= 0 {
			return false
		}
	}
	return true
}
