package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// The optional ledger interfaces of internal/store/ledger_api.go: hourly rollups and
// pruning. A store without them skips these cases.

// rollupKey names a rollup.
type rollupKey struct {
	hour                             time.Time
	user, service, endpoint, product string
}

// rollupsOf sums entries into hourly rollups, as a store must.
func rollupsOf(entries []store.LedgerEntry) map[rollupKey]store.Rollup {
	out := map[rollupKey]store.Rollup{}
	for _, e := range entries {
		h := e.Time.UTC().Truncate(time.Hour)
		k := rollupKey{h, e.UserID, e.ServiceID, e.EndpointID, e.ProductID}
		r := out[k]
		r.UserID, r.ServiceID, r.EndpointID, r.ProductID, r.Hour = e.UserID, e.ServiceID, e.EndpointID, e.ProductID, h
		r.Calls++
		r.Units += e.Units
		r.Overage += e.Overage
		r.Cost += e.Cost
		if e.UnitsClaimed != 0 {
			r.Capped++
		}
		out[k] = r
	}
	return out
}

// rollups reads the rollups matching f, checking their order.
func rollups(t testing.TB, s store.Store, f store.RollupFilter) []store.Rollup {
	t.Helper()
	rr, ok := s.(store.RollupReader)
	if !ok {
		t.Skip("the store keeps no hourly rollups (store.RollupReader)")
	}
	var out []store.Rollup
	if err := rr.ScanRollups(ctx, f, func(r store.Rollup) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatalf("ScanRollups: %v", err)
	}
	if !slices.IsSortedFunc(out, func(a, b store.Rollup) int {
		if c := a.Hour.Compare(b.Hour); c != 0 {
			return c
		}
		return strings.Compare(a.UserID+"\x00"+a.ServiceID+"\x00"+a.EndpointID+"\x00"+a.ProductID,
			b.UserID+"\x00"+b.ServiceID+"\x00"+b.EndpointID+"\x00"+b.ProductID)
	}) {
		t.Errorf("ScanRollups out of (hour, user, service, endpoint, product) order: %+v", out)
	}
	return out
}

// sameRollups fails unless got holds exactly the rollups of want.
func sameRollups(t testing.TB, what string, got []store.Rollup, want map[rollupKey]store.Rollup) {
	t.Helper()
	seen := map[rollupKey]bool{}
	for _, r := range got {
		k := rollupKey{r.Hour, r.UserID, r.ServiceID, r.EndpointID, r.ProductID}
		if seen[k] {
			t.Errorf("%s: rollup %+v twice", what, k)
		}
		seen[k] = true
		if w, ok := want[k]; !ok {
			t.Errorf("%s: rollup %+v, which no row makes", what, r)
		} else if r != w {
			t.Errorf("%s: rollup %+v, the rows sum to %+v", what, r, w)
		}
	}
	for k, w := range want {
		if !seen[k] {
			t.Errorf("%s: no rollup for %+v", what, w)
		}
	}
}

// rollupHours are the times the rollup cases write at: three months,
// several hours of one day, and T0.
var rollupHours = []time.Time{
	time.Date(2024, 1, 10, 9, 15, 0, 0, time.UTC),
	time.Date(2024, 1, 31, 23, 59, 59, 0, time.UTC),
	time.Date(2024, 2, 14, 9, 0, 0, 0, time.UTC),
	T0.Add(-2 * time.Hour),
	T0.Add(-90 * time.Minute),
	T0,
	T0.Add(30 * time.Minute),
}

// writeRollupRows writes rows through Settle (the settlement path) and
// Record (reports), of two users, two services, two endpoints and a
// priced product, at rollupHours.
func writeRollupRows(t *testing.T, s store.Store) {
	t.Helper()
	a := subscribe(t, s, "u1", "svc1", unlimited, 0)
	b := subscribe(t, s, "u2", "svc1", prepaid, whole(1_000_000))
	c := subscribe(t, s, "u1", "svc2", instant, 0)
	for i, at := range rollupHours {
		for j, acc := range []store.Account{a, b, c} {
			res, err := s.Reserve(ctx, acc, whole(3), at)
			if err != nil || !res.Decision.Allowed {
				t.Fatalf("Reserve(%s/%s) = %+v, %v", acc.UserID, acc.ServiceID, res.Decision, err)
			}
			e := EntryFor(acc, 0, at)
			e.EndpointID = fmt.Sprintf("ep%d", (i+j)%2)
			e.Source = store.SourceGateway
			if _, err := s.Settle(ctx, res, whole(int64(1+(i+j)%3)), e); err != nil {
				t.Fatalf("Settle: %v", err)
			}
			r := EntryFor(acc, whole(int64(2+i)), at.Add(time.Second))
			if _, err := s.Record(ctx, acc, r, OKResponse); err != nil {
				t.Fatalf("Record: %v", err)
			}
		}
	}
}

// testRollups: the hourly rollups equal the sums of the raw rows, filtered
// as asked, and still do after a restart.
func testRollups(t *testing.T, c *suite) {
	s := c.store(t)
	rollups(t, s, store.RollupFilter{}) // skips a store without rollups
	writeRollupRows(t, s)
	check := func(s store.Store, when string) {
		all := Ledger(t, s, store.LedgerFilter{})
		if len(all) != 2*3*len(rollupHours) {
			t.Fatalf("%s: %d ledger rows, want %d", when, len(all), 2*3*len(rollupHours))
		}
		sameRollups(t, when+": all", rollups(t, s, store.RollupFilter{}), rollupsOf(all))
		hour := T0.Truncate(time.Hour)
		for _, f := range []store.RollupFilter{
			{UserID: "u1"},
			{ServiceID: "svc1"},
			{UserID: "u1", ServiceID: "svc2"},
			{From: hour.Add(-2 * time.Hour), To: hour},
			{From: hour.Add(-90 * time.Minute)}, // hours starting at or after from
			{To: time.Date(2024, 2, 1, 0, 0, 0, 0, time.UTC)},
			{UserID: "u2", From: time.Date(2024, 2, 1, 0, 0, 0, 0, time.UTC), To: T0.Add(time.Hour)},
			{UserID: "nobody"},
		} {
			from, to := f.From, f.To
			if !from.IsZero() {
				from = from.Truncate(time.Hour)
				if from.Before(f.From) {
					from = from.Add(time.Hour)
				}
			}
			var rows []store.LedgerEntry
			for _, e := range Ledger(t, s, store.LedgerFilter{UserID: f.UserID, ServiceID: f.ServiceID}) {
				h := e.Time.Truncate(time.Hour)
				if (!from.IsZero() && h.Before(from)) || (!to.IsZero() && !h.Before(to)) {
					continue
				}
				rows = append(rows, e)
			}
			sameRollups(t, fmt.Sprintf("%s: filter %+v", when, f), rollups(t, s, f), rollupsOf(rows))
		}
		// store.ScanUsage (the console's and portal's figures) equals the
		// raw rows, whole hours from the rollups, edges from the rows.
		for _, f := range []store.LedgerFilter{
			{},
			{UserID: "u1"},
			{ServiceID: "svc1", From: hour.Add(-100 * time.Minute)},
			{From: hour.Add(-100 * time.Minute), To: hour.Add(10 * time.Minute)},
			{From: hour.Add(-2 * time.Hour), To: hour.Add(time.Hour)},
			{From: hour.Add(5 * time.Minute), To: hour.Add(40 * time.Minute)},
			{UserID: "u2", To: time.Date(2024, 2, 14, 9, 0, 0, 1000, time.UTC)},
		} {
			got, raw := usage(t, s, f, false), usage(t, s, f, true)
			if fmt.Sprint(got) != fmt.Sprint(raw) {
				t.Errorf("%s: ScanUsage(%+v) =\n%+v\nthe raw rows sum to\n%+v", when, f, got, raw)
			}
			var calls int64
			for _, r := range got {
				calls += r.Calls
			}
			if n := len(Ledger(t, s, f)); calls != int64(n) {
				t.Errorf("%s: ScanUsage(%+v) counts %d calls, the ledger has %d rows", when, f, calls, n)
			}
		}
	}
	check(s, "written")
	if c.reopen != nil {
		s = c.restart(t, s)
		check(s, "after a restart")
	}
}

// pruner returns s's LedgerPruner and RollupPruner, skipping a store
// without them.
func pruner(t *testing.T, s store.Store) (store.LedgerPruner, store.RollupPruner) {
	t.Helper()
	lp, ok1 := s.(store.LedgerPruner)
	rp, ok2 := s.(store.RollupPruner)
	if !ok1 || !ok2 {
		t.Skip("the store cannot prune its ledger (store.LedgerPruner, store.RollupPruner)")
	}
	return lp, rp
}

// testPruneLedger: a prune removes only rows older than its cutoff,
// reports what it removed, and leaves the rollups; a cutoff past every
// row's month removes them all; writing goes on after.
func testPruneLedger(t *testing.T, c *suite) {
	s := c.store(t)
	lp, _ := pruner(t, s)
	writeRollupRows(t, s)
	all := Ledger(t, s, store.LedgerFilter{})
	roll := rollups(t, s, store.RollupFilter{})

	prune := func(before time.Time) {
		t.Helper()
		was := Ledger(t, s, store.LedgerFilter{})
		res, err := lp.PruneLedger(ctx, before)
		if err != nil {
			t.Fatalf("PruneLedger(%v): %v", before, err)
		}
		if !res.Before.Equal(before) {
			t.Errorf("PruneLedger(%v) reports before %v", before, res.Before)
		}
		now := Ledger(t, s, store.LedgerFilter{})
		kept := map[uint64]bool{}
		for _, e := range now {
			kept[e.Seq] = true
		}
		removed := int64(0)
		for _, e := range was {
			if kept[e.Seq] {
				continue
			}
			removed++
			if !e.Time.Before(before) {
				t.Errorf("PruneLedger(%v) removed row %s of %v, not older", before, e.ID, e.Time)
			}
		}
		if res.Rows != removed || (removed > 0) != (res.Segments > 0) {
			t.Errorf("PruneLedger(%v) = %+v; %d rows went", before, res, removed)
		}
		// The rollups outlive the rows.
		sameRollups(t, fmt.Sprintf("after PruneLedger(%v)", before), rollups(t, s, store.RollupFilter{}), rollupsOf(all))
	}
	prune(time.Date(2024, 2, 1, 0, 0, 0, 0, time.UTC))
	prune(T0.Add(time.Hour))
	// A month past every row: none is left.
	prune(time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC))
	if rest := Ledger(t, s, store.LedgerFilter{}); len(rest) != 0 {
		t.Errorf("%d rows left after a prune a month past them all", len(rest))
	}
	if len(roll) == 0 {
		t.Fatal("no rollups")
	}

	// Writing goes on, in a month already pruned too.
	a := store.Account{UserID: "u1", ServiceID: "svc1", Product: unlimited}
	if _, err := s.Record(ctx, a, EntryFor(a, whole(7), T0.Add(time.Minute)), OKResponse); err != nil {
		t.Fatalf("Record after a prune: %v", err)
	}
	if rows := Ledger(t, s, store.LedgerFilter{}); len(rows) != 1 || rows[0].Units != whole(7) {
		t.Errorf("ledger after a prune and a write: %+v", rows)
	}
	want := rollupsOf(append(all, store.LedgerEntry{Time: T0.Add(time.Minute), UserID: "u1", ServiceID: "svc1",
		ProductID: unlimited.ID, Units: whole(7)}))
	sameRollups(t, "a write after the prunes", rollups(t, s, store.RollupFilter{}), want)
	if c.reopen != nil {
		s = c.restart(t, s)
		sameRollups(t, "after the prunes and a restart", rollups(t, s, store.RollupFilter{}), want)
		if rows := Ledger(t, s, store.LedgerFilter{}); len(rows) != 1 {
			t.Errorf("ledger after the prunes and a restart: %+v", rows)
		}
	}
}

// testPruneRollups: rollups of hours before the cutoff's go, counted; the
// others stay.
func testPruneRollups(t *testing.T, c *suite) {
	s := c.store(t)
	_, rp := pruner(t, s)
	writeRollupRows(t, s)
	before := rollups(t, s, store.RollupFilter{})
	cut := time.Date(2024, 2, 14, 9, 30, 0, 0, time.UTC) // within an hour that has rollups: it stays
	n, err := rp.PruneRollups(ctx, cut)
	if err != nil {
		t.Fatalf("PruneRollups: %v", err)
	}
	var want []store.Rollup
	gone := 0
	for _, r := range before {
		if r.Hour.Before(cut.Truncate(time.Hour)) {
			gone++
			continue
		}
		want = append(want, r)
	}
	if n != gone || gone == 0 {
		t.Errorf("PruneRollups = %d, want %d", n, gone)
	}
	if got := rollups(t, s, store.RollupFilter{}); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("rollups after PruneRollups:\n%+v\nwant\n%+v", got, want)
	}
	if n, err := rp.PruneRollups(ctx, cut); err != nil || n != 0 {
		t.Errorf("PruneRollups again = %d, %v; want 0", n, err)
	}
	// The raw rows are not the rollups' business.
	if rows := Ledger(t, s, store.LedgerFilter{}); len(rows) != 2*3*len(rollupHours) {
		t.Errorf("%d ledger rows after PruneRollups", len(rows))
	}
}

// testPruneBadCutoff: a zero or future cutoff is ErrBadCutoff and removes
// nothing.
func testPruneBadCutoff(t *testing.T, c *suite) {
	s := c.store(t)
	lp, rp := pruner(t, s)
	writeRollupRows(t, s)
	rows := Ledger(t, s, store.LedgerFilter{})
	roll := rollups(t, s, store.RollupFilter{})
	for _, bad := range []time.Time{{}, time.Now().Add(time.Hour), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)} {
		if res, err := lp.PruneLedger(ctx, bad); !errors.Is(err, store.ErrBadCutoff) || res.Rows != 0 {
			t.Errorf("PruneLedger(%v) = %+v, %v; want ErrBadCutoff", bad, res, err)
		}
		if n, err := rp.PruneRollups(ctx, bad); !errors.Is(err, store.ErrBadCutoff) || n != 0 {
			t.Errorf("PruneRollups(%v) = %d, %v; want ErrBadCutoff", bad, n, err)
		}
	}
	if got := Ledger(t, s, store.LedgerFilter{}); len(got) != len(rows) {
		t.Errorf("%d ledger rows after refused prunes, want %d", len(got), len(rows))
	}
	if got := rollups(t, s, store.RollupFilter{}); fmt.Sprint(got) != fmt.Sprint(roll) {
		t.Errorf("rollups changed by refused prunes")
	}
}

// usage reads store.ScanUsage of s, or of s without its rollups (the raw
// rows summed) when raw.
func usage(t testing.TB, s store.Store, f store.LedgerFilter, raw bool) []store.Rollup {
	t.Helper()
	var out []store.Rollup
	var src store.Store = s
	if raw {
		src = struct{ store.Store }{s} // hides RollupReader
	}
	if err := store.ScanUsage(ctx, src, f, func(r store.Rollup) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatalf("ScanUsage: %v", err)
	}
	return out
}
