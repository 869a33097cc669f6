package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// settlement is one record of the settlement log (internal/store/settlelog): what a
// settled call, a report, a job's change or a credit change did, in the
// form the applier writes to the database. Every part is optional; a
// record with none is a probe of the log.
//
// Counter changes are carried as the operations the billing state went
// through (charge, hold, unhold, a credit change), not as the state after
// them: the state in memory also carries the holds of calls in flight,
// which the database never sees, and operations applied to the database's
// own figures give exactly what they gave in memory, minus those holds.
type settlement struct {
	acct   *acctChange
	ledger *store.LedgerEntry
	idem   *idemClaim
	job    *jobChange
	// grant is a credit grant's, reversal's or expiry's change to the
	// grants (payments.go).
	grant *grantChange
}

// acctChange is what a settlement did to one subscription's figures in
// one billing period (period 0: only its balance).
type acctChange struct {
	userID, serviceID string
	period            int64
	ops               []acctOp
	// updated, when set, is the subscription's new UpdatedAt (a credit
	// change by an operator).
	updated time.Time
	// later, when set, takes back in memory what the record did to a
	// deferred expiry (heldexpiry.go) if it is refused (undo); never
	// written.
	later func()
	// unit, when unitSet, is the cost unit its charges are counted in
	// (billing.Product.CostUnit; the counter's spend is kept per unit,
	// spend.go). A record written before has none: its charges count in
	// the counter's unit.
	unit    string
	unitSet bool
}

// Operation kinds of acctOp.
const (
	opCharge byte = 1 + iota
	opHold
	opUnhold
	opCredit
)

// acctOp is one billing-state operation: units and cost as the decision
// said, prepaid when the product it ran under is prepaid (the only thing
// of the product the operations read).
type acctOp struct {
	kind        byte
	prepaid     bool
	units, cost billing.Units
}

// idemClaim is a report's idempotency claim with its stored response.
type idemClaim struct {
	serviceID, key string
	created        time.Time
	response       []byte
}

// jobChange stores a job's new state: raw is the job record as the
// database keeps it. The open-jobs index moves from oldOpen to newOpen
// (either empty); a hold taken for the job is stored (holdPut) or removed
// (holdDel).
type jobChange struct {
	id      string
	raw     []byte
	oldOpen []byte
	newOpen []byte
	holdID  uint64
	holdRaw []byte // with holdID: the hold to store
	holdDel uint64
	newJob  bool
}

// Record layout: a flags byte saying which parts follow, then each part.
const (
	partAcct byte = 1 << iota
	partLedger
	partIdem
	partJob
	partGrant
	// partUnit: the acct part's cost unit follows its operations.
	partUnit
)

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return binary.AppendVarint(b, 0)
	}
	return binary.AppendVarint(b, t.UnixNano())
}

// encode appends the record's bytes to b.
func (r *settlement) encode(b []byte) []byte {
	var flags byte
	if r.acct != nil {
		flags |= partAcct
	}
	if r.ledger != nil {
		flags |= partLedger
	}
	if r.idem != nil {
		flags |= partIdem
	}
	if r.job != nil {
		flags |= partJob
	}
	if r.grant != nil {
		flags |= partGrant
	}
	if r.acct != nil && r.acct.unitSet {
		flags |= partUnit
	}
	b = append(b, flags)
	if a := r.acct; a != nil {
		b = appendStr(b, a.userID)
		b = appendStr(b, a.serviceID)
		b = binary.AppendVarint(b, a.period)
		b = appendTime(b, a.updated)
		b = binary.AppendUvarint(b, uint64(len(a.ops)))
		for _, op := range a.ops {
			k := op.kind
			if op.prepaid {
				k |= 0x80
			}
			b = append(b, k)
			b = binary.AppendVarint(b, int64(op.units))
			b = binary.AppendVarint(b, int64(op.cost))
		}
		if a.unitSet {
			b = appendStr(b, a.unit)
		}
	}
	if e := r.ledger; e != nil {
		b = binary.AppendUvarint(b, e.Seq)
		b = appendTime(b, e.Time)
		b = appendTime(b, e.OccurredAt)
		for _, s := range [...]string{e.UserID, e.ServiceID, e.EndpointID, e.ProductID, e.RequestID, e.Source, e.IdempotencyKey} {
			b = appendStr(b, s)
		}
		for _, u := range [...]billing.Units{e.Units, e.Overage, e.Cost, e.UnitsClaimed} {
			b = binary.AppendVarint(b, int64(u))
		}
	}
	if c := r.idem; c != nil {
		b = appendStr(b, c.serviceID)
		b = appendStr(b, c.key)
		b = appendTime(b, c.created)
		b = appendBytes(b, c.response)
	}
	if j := r.job; j != nil {
		b = appendStr(b, j.id)
		b = appendBytes(b, j.raw)
		b = appendBytes(b, j.oldOpen)
		b = appendBytes(b, j.newOpen)
		b = binary.AppendUvarint(b, j.holdID)
		b = appendBytes(b, j.holdRaw)
		b = binary.AppendUvarint(b, j.holdDel)
		if j.newJob {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	if g := r.grant; g != nil {
		b = appendBytes(b, g.encode())
	}
	return b
}

// errRecord marks a record that passed its checksum but does not decode:
// written by another version, or a bug.
var errRecord = errors.New("settlement record does not decode")

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errRecord
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errRecord
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errRecord
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str() string { return string(d.bytes()) }

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = errRecord
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) time() time.Time {
	ns := d.varint()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// decodeSettlement reads a record; byte slices of the result share rec.
func decodeSettlement(rec []byte) (settlement, error) {
	d := &decoder{b: rec}
	var r settlement
	flags := d.byte()
	if flags&partAcct != 0 {
		a := &acctChange{userID: d.str(), serviceID: d.str(), period: d.varint(), updated: d.time()}
		n := d.uvarint()
		if n > uint64(len(d.b)) {
			return r, errRecord
		}
		for range n {
			k := d.byte()
			a.ops = append(a.ops, acctOp{kind: k &^ 0x80, prepaid: k&0x80 != 0,
				units: billing.Units(d.varint()), cost: billing.Units(d.varint())})
		}
		if flags&partUnit != 0 {
			a.unit, a.unitSet = d.str(), true
		}
		r.acct = a
	}
	if flags&partLedger != 0 {
		e := &store.LedgerEntry{Seq: d.uvarint(), Time: d.time(), OccurredAt: d.time()}
		e.UserID, e.ServiceID, e.EndpointID, e.ProductID = d.str(), d.str(), d.str(), d.str()
		e.RequestID, e.Source, e.IdempotencyKey = d.str(), d.str(), d.str()
		e.Units, e.Overage = billing.Units(d.varint()), billing.Units(d.varint())
		e.Cost, e.UnitsClaimed = billing.Units(d.varint()), billing.Units(d.varint())
		e.ID = ledgerID(e.Seq)
		r.ledger = e
	}
	if flags&partIdem != 0 {
		r.idem = &idemClaim{serviceID: d.str(), key: d.str(), created: d.time(), response: d.bytes()}
	}
	if flags&partJob != 0 {
		j := &jobChange{id: d.str(), raw: d.bytes(), oldOpen: d.bytes(), newOpen: d.bytes(), holdID: d.uvarint()}
		j.holdRaw, j.holdDel, j.newJob = d.bytes(), d.uvarint(), d.byte() == 1
		r.job = j
	}
	if flags&partGrant != 0 {
		raw := d.bytes()
		if d.err == nil {
			g, err := decodeGrantChange(raw)
			if err != nil {
				return r, err
			}
			r.grant = g
		}
	}
	if d.err != nil {
		return r, d.err
	}
	if len(d.b) != 0 || flags&^(partAcct|partLedger|partIdem|partJob|partGrant|partUnit) != 0 || flags&partUnit != 0 && flags&partAcct == 0 {
		return r, fmt.Errorf("%w: %d bytes left, flags %#x", errRecord, len(d.b), flags)
	}
	return r, nil
}

// applyOps runs the operations on a billing state, the way they ran in
// memory (minus the holds of calls in flight, which never reach the log).
func applyOps(st *billing.State, ops []acctOp) {
	for _, op := range ops {
		p := billing.Product{BillingModel: billing.Subscription}
		if op.prepaid {
			p.BillingModel = billing.Prepaid
		}
		d := billing.Decision{Allowed: true, Units: op.units, Cost: op.cost}
		switch op.kind {
		case opCharge:
			st.Charge(p, d)
		case opHold:
			st.Hold(p, d)
		case opUnhold:
			st.Unhold(p, d)
		case opCredit:
			st.Credits += op.units
		}
	}
}

// undoOps takes operations back off a state in memory after their record
// could not be written (the reverse of applyOps; p reprices the holds).
func undoOps(st *billing.State, ops []acctOp, p billing.Product) {
	for i := len(ops) - 1; i >= 0; i-- {
		op := ops[i]
		q := billing.Product{BillingModel: billing.Subscription}
		if op.prepaid {
			q.BillingModel = billing.Prepaid
		}
		d := billing.Decision{Allowed: true, Units: op.units, Cost: op.cost}
		switch op.kind {
		case opCharge:
			st.Used -= op.units
			st.Spend -= op.cost
			if op.prepaid {
				st.Credits += op.cost
			}
		case opHold:
			st.Unhold(q, d)
		case opUnhold:
			st.Hold(q, d)
		case opCredit:
			st.Credits -= op.units
		}
	}
	st.Hold(p, billing.Decision{}) // reprice
}
