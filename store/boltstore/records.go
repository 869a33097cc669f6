package boltstore

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

// amount is a quantity as the store writes it: the same decimal text as
// billing.Units, read back over the whole signed int64 range.
//
// billing.Units refuses negatives and anything past MaxUnits when it reads
// JSON, rightly for the wire, but stored figures legitimately go there: a
// prepaid balance overdrawn by a report or by AddCredits, a period's usage
// summed from many large reports, a cost that saturated. Read through
// billing.Units, such a record failed to decode, and with it every later
// call for that subscription, every ledger export, or Open itself (held
// reservations are read back at start).
type amount billing.Units

func (a amount) MarshalJSON() ([]byte, error) { return billing.Units(a).MarshalJSON() }

func (a *amount) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	whole, frac, _ := strings.Cut(s, ".")
	w, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || len(frac) > 6 {
		return fmt.Errorf("stored quantity %q: %w", b, billing.ErrInvalidUnits)
	}
	var f uint64
	if frac != "" {
		if f, err = strconv.ParseUint(frac+strings.Repeat("0", 6-len(frac)), 10, 64); err != nil {
			return fmt.Errorf("stored quantity %q: %w", b, billing.ErrInvalidUnits)
		}
	}
	limit := uint64(math.MaxInt64)
	if neg {
		limit++ // math.MinInt64
	}
	if w > (limit-f)/uint64(billing.Scale) {
		return fmt.Errorf("stored quantity %q out of range: %w", b, billing.ErrInvalidUnits)
	}
	m := w*uint64(billing.Scale) + f
	if neg {
		*a = amount(-int64(m)) // m == 1<<63 wraps to math.MinInt64, as wanted
	} else {
		*a = amount(m)
	}
	return nil
}

// subRecord is a subscription as stored.
type subRecord struct {
	store.Subscription
	Credits     amount `json:"credits"`
	CreditsHeld amount `json:"creditsHeld"`
}

func toSubRecord(s store.Subscription) subRecord {
	return subRecord{Subscription: s, Credits: amount(s.Credits), CreditsHeld: amount(s.CreditsHeld)}
}

func (r subRecord) subscription() store.Subscription {
	s := r.Subscription
	s.Credits, s.CreditsHeld = billing.Units(r.Credits), billing.Units(r.CreditsHeld)
	return s
}

// ledgerRecord is a ledger entry as stored.
type ledgerRecord struct {
	store.LedgerEntry
	Units        amount `json:"units"`
	Overage      amount `json:"overage,omitempty"`
	Cost         amount `json:"cost,omitempty"`
	UnitsClaimed amount `json:"unitsClaimed,omitempty"`
}

func toLedgerRecord(e store.LedgerEntry) ledgerRecord {
	return ledgerRecord{LedgerEntry: e, Units: amount(e.Units), Overage: amount(e.Overage), Cost: amount(e.Cost),
		UnitsClaimed: amount(e.UnitsClaimed)}
}

func (r ledgerRecord) entry() store.LedgerEntry {
	e := r.LedgerEntry
	e.Units, e.Overage, e.Cost, e.UnitsClaimed = billing.Units(r.Units), billing.Units(r.Overage),
		billing.Units(r.Cost), billing.Units(r.UnitsClaimed)
	return e
}

// jobRecord is a job as stored. CompletionDigest and ReservationID are
// `json:"-"` on store.Job, to keep them out of API responses, so without
// these fields the store dropped them: a repeated completion could never be
// recognised, and a job's hold could not be found to settle.
type jobRecord struct {
	store.Job
	Units            amount `json:"units,omitempty"`
	Cost             amount `json:"cost,omitempty"`
	CompletionDigest string `json:"completionDigest,omitempty"`
	ReservationID    string `json:"reservationId,omitempty"`
}

func toJobRecord(j store.Job) jobRecord {
	return jobRecord{Job: j, Units: amount(j.Units), Cost: amount(j.Cost), CompletionDigest: j.CompletionDigest,
		ReservationID: j.ReservationID}
}

func (r jobRecord) job() store.Job {
	j := r.Job
	j.Units, j.Cost, j.CompletionDigest = billing.Units(r.Units), billing.Units(r.Cost), r.CompletionDigest
	j.ReservationID = r.ReservationID
	return j
}

// decisionRecord is the decision of a stored reservation.
type decisionRecord struct {
	billing.Decision
	Units   amount
	Overage amount
	Cost    amount
}

func toDecisionRecord(d billing.Decision) decisionRecord {
	return decisionRecord{Decision: d, Units: amount(d.Units), Overage: amount(d.Overage), Cost: amount(d.Cost)}
}

func (r decisionRecord) decision() billing.Decision {
	d := r.Decision
	d.Units, d.Overage, d.Cost = billing.Units(r.Units), billing.Units(r.Overage), billing.Units(r.Cost)
	return d
}
