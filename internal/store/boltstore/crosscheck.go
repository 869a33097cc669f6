package boltstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	segledger "github.com/platformgw/gateway/internal/store/ledger"
)

// ErrCountersDisagree marks a store whose counters differ from what its
// ledger and holds say they must be.
var ErrCountersDisagree = errors.New("stored counters disagree with the ledger")

// Mismatch is one stored figure that differs from the figure derived from
// the ledger (used, spend) or from the stored holds (reserved).
type Mismatch struct {
	UserID, ServiceID string
	// Period is the start of the counter's billing period, or zero for
	// the sum over every period (used and spend: a ledger row does not say
	// which period it was charged to, only when it was written, and a
	// call that straddles a period's end is charged to the period it
	// started in).
	Period          time.Time
	Counter         string // used, spend or reserved
	Stored, Derived billing.Units
}

func (m Mismatch) String() string {
	period := "all periods"
	if !m.Period.IsZero() {
		period = "period " + m.Period.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("user %q service %q %s: %s stored %s, derived %s", m.UserID, m.ServiceID, period, m.Counter,
		units(m.Stored), units(m.Derived))
}

// units writes a figure signed (a stored one may be negative).
func units(u billing.Units) string {
	if u < 0 {
		return "-" + (-u).String()
	}
	return u.String()
}

// CrossCheck is what the check of the counters against the ledger found.
type CrossCheck struct {
	// Accounts counts the subscriptions whose counters were compared.
	Accounts int
	// Skipped says why the counters could not be derived (and were not
	// compared); empty when they were.
	Skipped    string
	Mismatches []Mismatch
}

type acctKey struct{ user, service string }

type figures struct{ used, spend billing.Units }

// crossCheck compares every account's counters with the ledger rows the
// file accounts for (those numbered up to its ledger_seq: the ledger may
// hold rows of a commit of the file that did not happen, which the next
// start drops) and with the holds stored in the file:
//
//   - used and spend summed over the account's periods equal the units
//     and costs of its ledger rows (rows without a product are of free
//     accounts, which keep no counters);
//   - reserved of each period equals the units of the holds stored for it.
//
// Credit balances are not compared: a grant (AddCredits) writes no ledger
// row, so a balance cannot be derived from the ledger.
func crossCheck(db *bolt.DB, led *segledger.Ledger, ledgerSeq uint64) (CrossCheck, error) {
	var cc CrossCheck
	stored := map[acctKey]figures{}
	type periodKey struct {
		acctKey
		period int64
	}
	reserved, held := map[periodKey]billing.Units{}, map[periodKey]billing.Units{}
	err := db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketLedger) != nil {
			cc.Skipped = "the ledger is still in the store file (a store of an earlier build): the next start moves it into the ledger directory"
			return nil
		}
		err := tx.Bucket(bucketCounters).ForEach(func(k, v []byte) error {
			var c counter
			if err := decodeJSON(bucketCounters, k, v, &c); err != nil {
				return err
			}
			user, service, period, ok := splitCounterKey(k)
			if !ok {
				return fmt.Errorf("counter key %q: not user, service and period", k)
			}
			a := acctKey{user, service}
			f := stored[a]
			f.used += billing.Units(c.Used)
			f.spend += billing.Units(c.spendTotal())
			stored[a] = f
			reserved[periodKey{a, period}] += billing.Units(c.Reserved)
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketReservations).ForEach(func(k, v []byte) error {
			var r reservation
			if err := decodeJSON(bucketReservations, k, v, &r); err != nil {
				return err
			}
			held[periodKey{acctKey{r.UserID, r.ServiceID}, r.PeriodKey}] += r.Decision.decision().Units
			return nil
		})
	})
	if err != nil || cc.Skipped != "" {
		return cc, err
	}
	derived := map[acctKey]figures{}
	first := uint64(0)
	scan := func(fn func(store.LedgerEntry) error) error {
		if led == nil {
			return nil
		}
		return led.Scan(context.Background(), store.LedgerFilter{}, fn)
	}
	err = scan(func(e store.LedgerEntry) error {
		if first == 0 {
			first = e.Seq
		}
		if e.Seq > ledgerSeq || e.ProductID == "" {
			return nil
		}
		a := acctKey{e.UserID, e.ServiceID}
		f := derived[a]
		f.used += e.Units
		f.spend += e.Cost
		derived[a] = f
		return nil
	})
	if err != nil {
		return cc, err
	}
	switch {
	case first > 1:
		cc.Skipped = fmt.Sprintf("the ledger's rows before row %d were pruned: used and spend cannot be derived from it", first)
	case first == 0 && ledgerSeq > 0:
		// Every row was pruned (a gateway idle past ledger_retention):
		// the counters stay, and an empty ledger accounts for none of
		// them. Taken for damage, it also refused every backup and
		// restore, which check what they copy.
		cc.Skipped = fmt.Sprintf("every row of the ledger (up to row %d) was pruned: used and spend cannot be derived from it", ledgerSeq)
	}
	accounts := map[acctKey]bool{}
	if cc.Skipped == "" {
		for a := range stored {
			accounts[a] = true
		}
		for a := range derived {
			accounts[a] = true
		}
		for a := range accounts {
			s, d := stored[a], derived[a]
			if s.used != d.used {
				cc.Mismatches = append(cc.Mismatches, Mismatch{UserID: a.user, ServiceID: a.service, Counter: "used", Stored: s.used, Derived: d.used})
			}
			if s.spend != d.spend {
				cc.Mismatches = append(cc.Mismatches, Mismatch{UserID: a.user, ServiceID: a.service, Counter: "spend", Stored: s.spend, Derived: d.spend})
			}
		}
	}
	// The holds are in the file itself: compared even when the ledger was
	// pruned.
	for p := range reserved {
		accounts[p.acctKey] = true
	}
	for p := range held {
		accounts[p.acctKey] = true
	}
	for p, r := range reserved {
		if h := held[p]; r != h {
			cc.Mismatches = append(cc.Mismatches, Mismatch{UserID: p.user, ServiceID: p.service, Period: time.Unix(p.period, 0),
				Counter: "reserved", Stored: r, Derived: h})
		}
	}
	for p, h := range held {
		if _, ok := reserved[p]; !ok && h != 0 {
			cc.Mismatches = append(cc.Mismatches, Mismatch{UserID: p.user, ServiceID: p.service, Period: time.Unix(p.period, 0),
				Counter: "reserved", Stored: 0, Derived: h})
		}
	}
	cc.Accounts = len(accounts)
	slices.SortFunc(cc.Mismatches, func(a, b Mismatch) int { return strings.Compare(a.String(), b.String()) })
	return cc, nil
}

// splitCounterKey takes a counter key (user \0 service \0 period(8))
// apart.
func splitCounterKey(k []byte) (user, service string, period int64, ok bool) {
	if len(k) < 10 || k[len(k)-9] != 0 {
		return "", "", 0, false
	}
	user, service, ok = strings.Cut(string(k[:len(k)-9]), "\x00")
	return user, service, int64(binary.BigEndian.Uint64(k[len(k)-8:])), ok
}

// disagree is the error for counters that differ from the ledger.
func disagree(path string, ms []Mismatch) error {
	lines := make([]string, 0, min(len(ms), maxDamagedRecords))
	for _, m := range ms[:min(len(ms), maxDamagedRecords)] {
		lines = append(lines, m.String())
	}
	more := ""
	if len(ms) > len(lines) {
		more = fmt.Sprintf(", the first %d named", len(lines))
	}
	return fmt.Errorf("store %s: %d figures differ from the ledger and the stored holds%s:\n  %s\n%w",
		path, len(ms), more, strings.Join(lines, "\n  "), ErrCountersDisagree)
}
