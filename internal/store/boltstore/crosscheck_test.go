package boltstore

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// meteredStore writes a store whose counters the ledger accounts for:
// calls settled on two accounts, one free call (a ledger row, no
// counter), and a job's hold in the file; and closes it.
func meteredStore(t *testing.T, path string) {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"u1", "u2"} {
		a := subscribe(t, s, u, "svc", prepaid, whole(1000))
		for i := range 3 {
			r, err := s.Reserve(ctx, a, whole(4), t0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Settle(ctx, r, whole(int64(i+1)), entryFor(a, 0, t0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	free := store.Account{UserID: "u3", ServiceID: "svc", Free: true}
	if r, err := s.Reserve(ctx, free, whole(1), t0); err != nil {
		t.Fatal(err)
	} else if _, err := s.Settle(ctx, r, whole(1), entryFor(free, 0, t0)); err != nil {
		t.Fatal(err)
	}
	a := store.Account{UserID: "u1", ServiceID: "svc", Product: prepaid}
	if _, err := s.CreateJobReserved(ctx, newJob("job-1", t0.Add(time.Hour)), a, whole(2), t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCheckCountersAgainstLedger: store check derives used and spend from
// the ledger and reserved from the stored holds, passes a store whose
// counters agree, and names every figure of one whose counters were
// changed (sealed anew, so only the comparison can tell): user, service,
// period, counter, stored and derived.
func TestCheckCountersAgainstLedger(t *testing.T) {
	path := storePath(t)
	meteredStore(t, path)
	rep, err := CheckFile(path)
	if err != nil {
		t.Fatalf("CheckFile of a sound store: %v", err)
	}
	if rep.Cross.Skipped != "" || rep.Cross.Accounts != 2 || len(rep.Cross.Mismatches) != 0 {
		t.Fatalf("cross-check of a sound store: %+v", rep.Cross)
	}

	// Change u1's counter (used +5, reserved -2) and u2's (spend +1),
	// resealed: a store that lost or invented usage, not damage.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var u1Period int64
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketCounters)
		err := b.ForEach(func(k, v []byte) error {
			if user, _, period, ok := splitCounterKey(k); ok && user == "u1" {
				u1Period = period
			}
			return nil
		})
		if err != nil || u1Period == 0 {
			t.Fatalf("no counter of u1 (%v)", err)
		}
		u1, u2 := counterKey("u1", "svc", u1Period), counterKey("u2", "svc", u1Period)
		var c1, c2 counter
		if err := getJSON(tx, bucketCounters, u1, &c1); err != nil {
			return err
		}
		if err := getJSON(tx, bucketCounters, u2, &c2); err != nil {
			return err
		}
		c1.Used += amount(whole(5))
		c1.Reserved -= amount(whole(2))
		c2.Spend += amount(1)
		if err := putRaw(tx, bucketCounters, u1, encodeCounter(c1)); err != nil {
			return err
		}
		return putRaw(tx, bucketCounters, u2, encodeCounter(c2))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	rep, err = CheckFile(path)
	if !errors.Is(err, ErrCountersDisagree) {
		t.Fatalf("CheckFile of changed counters: %v; want ErrCountersDisagree", err)
	}
	period := time.Unix(u1Period, 0).UTC().Format(time.RFC3339)
	for _, want := range []string{
		`user "u1" service "svc" all periods: used stored 11, derived 6`,
		`user "u1" service "svc" period ` + period + `: reserved stored 0, derived 2`,
		`user "u2" service "svc" all periods: spend stored `,
		"3 figures differ",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("CheckFile error does not say %q:\n%v", want, err)
		}
	}
	if len(rep.Cross.Mismatches) != 3 {
		t.Errorf("%d mismatches, want 3: %+v", len(rep.Cross.Mismatches), rep.Cross.Mismatches)
	}
	for _, m := range rep.Cross.Mismatches {
		if m.UserID == "u2" && (m.Counter != "spend" || m.Stored-m.Derived != billing.Units(1)) {
			t.Errorf("u2's mismatch: %+v", m)
		}
	}
}

// TestCheckAfterEveryRowPruned: a store whose ledger rows were all pruned
// (a gateway idle past ledger_retention) keeps its counters, which the
// empty ledger cannot account for. The check took that for damage ("used
// stored 6, derived 0"), and as backup and restore check what they copy,
// no backup of such a store could be taken or restored. It is skipped,
// with the reason, as when the rows before some row were pruned.
func TestCheckAfterEveryRowPruned(t *testing.T) {
	path := storePath(t)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	a := subscribe(t, s, "u1", "svc", prepaid, whole(1000))
	for i := range 3 {
		r, err := s.Reserve(ctx, a, whole(4), t0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Settle(ctx, r, whole(int64(i+1)), entryFor(a, 0, t0)); err != nil {
			t.Fatal(err)
		}
	}
	// The rows reach the ledger when its applier has run.
	if err := s.ScanLedger(ctx, store.LedgerFilter{}, func(store.LedgerEntry) error { return nil }); err != nil {
		t.Fatal(err)
	}
	res, err := s.PruneLedger(ctx, t0.Add(24*time.Hour))
	if err != nil || res.Rows != 3 {
		t.Fatalf("prune: %+v, %v; want the 3 rows", res, err)
	}
	var backup bytes.Buffer
	if _, err := s.Backup(&backup, nil); err != nil {
		t.Fatalf("backup of a store whose rows were all pruned: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := CheckFile(path)
	if err != nil || rep.Cross.Skipped == "" || len(rep.Cross.Mismatches) != 0 {
		t.Fatalf("check of a store whose rows were all pruned: %+v, %v", rep.Cross, err)
	}
	if _, err := Restore(&backup, filepath.Join(t.TempDir(), "restored.db")); err != nil {
		t.Fatalf("restore: %v", err)
	}
}
