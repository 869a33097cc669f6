package pgstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// rowsAndRollups writes reports of two subscriptions over a few hours of
// two months and returns what the ledger and the rollups then hold.
func writeReports(t *testing.T, s *Store, at ...time.Time) {
	t.Helper()
	ctx := context.Background()
	for i, when := range at {
		for _, user := range []string{"u1", "u2"} {
			a := store.Account{UserID: user, ServiceID: "svc", Product: billing.Product{ID: "p",
				BillingModel: billing.UsageInstant, MeasurementType: billing.PerRequest, Price: billing.Whole(1)}}
			e := store.LedgerEntry{Time: when, UserID: user, ServiceID: "svc", ProductID: "p", EndpointID: fmt.Sprint("ep", i%2),
				Units: units(int64(i + 1)), Source: store.SourceReport}
			if _, err := s.Record(ctx, a, e, func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func scanRollups(t *testing.T, s *Store) string {
	t.Helper()
	var out string
	if err := s.ScanRollups(context.Background(), store.RollupFilter{}, func(r store.Rollup) error {
		out += fmt.Sprintf("%+v\n", r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRollupMigrationBackfills: a database from before the rollups table
// (schema version 1) gets the rollups of the rows it already has when a
// node of this build migrates it.
func TestRollupMigrationBackfills(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	s := openNode(t, dsn, "a")
	subscribe(t, s, "u1", "svc", "p")
	subscribe(t, s, "u2", "svc", "p")
	at := []time.Time{
		time.Date(2024, 1, 31, 23, 30, 0, 0, time.UTC),
		time.Date(2024, 2, 1, 0, 10, 0, 0, time.UTC),
		time.Date(2024, 2, 1, 0, 50, 0, 0, time.UTC),
	}
	writeReports(t, s, at...)
	want := scanRollups(t, s)
	if want == "" {
		t.Fatal("no rollups")
	}
	s.Close()
	// Back to schema version 1.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, ledgerIndexesOfVersion2+"DROP TABLE ledger_rollups; DELETE FROM pgstore_migrations WHERE version >= 2"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	s = openNode(t, dsn, "b")
	if got := scanRollups(t, s); got != want {
		t.Errorf("rollups after the migration:\n%s\nwant\n%s", got, want)
	}
}

// TestFleetPrunesOnce: nodes pruning at once (each node runs
// ledger_retention) drop each partition once, and the results add up to
// the rows there were.
func TestFleetPrunesOnce(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	nodes := []*Store{openNode(t, dsn, "a"), openNode(t, dsn, "b"), openNode(t, dsn, "c")}
	subscribe(t, nodes[0], "u1", "svc", "p")
	subscribe(t, nodes[0], "u2", "svc", "p")
	writeReports(t, nodes[1], time.Date(2024, 1, 5, 1, 0, 0, 0, time.UTC), time.Date(2024, 2, 5, 1, 0, 0, 0, time.UTC),
		time.Date(2024, 3, 5, 1, 0, 0, 0, time.UTC))
	rolls := scanRollups(t, nodes[0])
	cut := time.Date(2024, 3, 10, 0, 0, 0, 0, time.UTC) // March straddles it: its rows stay
	var wg sync.WaitGroup
	results := make([]store.PruneResult, len(nodes))
	errs := make([]error, len(nodes))
	for i, n := range nodes {
		wg.Go(func() { results[i], errs[i] = n.PruneLedger(ctx, cut) })
	}
	wg.Wait()
	var rows int64
	parts := 0
	for i := range nodes {
		if errs[i] != nil {
			t.Fatalf("node %d: %v", i, errs[i])
		}
		rows += results[i].Rows
		parts += results[i].Segments
	}
	if rows != 4 || parts != 2 {
		t.Errorf("the nodes pruned %d rows in %d partitions (%+v), want 4 in 2", rows, parts, results)
	}
	var left int
	if err := nodes[2].ScanLedger(ctx, store.LedgerFilter{}, func(e store.LedgerEntry) error {
		if e.Time.Before(time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("row of %v left", e.Time)
		}
		left++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if left != 2 {
		t.Errorf("%d rows left, want March's 2", left)
	}
	if got := scanRollups(t, nodes[2]); got != rolls {
		t.Errorf("rollups changed by the prune:\n%s\nwant\n%s", got, rolls)
	}
	// Every node writes to a dropped month again (the partition is made
	// anew), the one that dropped it or not.
	for i, n := range []*Store{nodes[1], nodes[0], nodes[2]} { // nodes[1] wrote the month before
		writeReports(t, n, time.Date(2024, 1, 6+i, 1, 0, 0, 0, time.UTC))
	}
}

// A batch's rollup sums go to the database one per rollup row, in the
// table's primary key order (hour, then the texts bytewise), whatever
// order the calls came in: the batches of several nodes lock the rows they
// share in one order.
func TestRollupSumsInKeyOrder(t *testing.T) {
	base := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var r rollupSums
	var want []string
	for i := range 200 {
		e := store.LedgerEntry{Time: base.Add(time.Duration(199-i) % 3 * time.Hour).Add(time.Minute),
			UserID: []string{"b", "a", "B", "é"}[i%4], ServiceID: "svc", EndpointID: fmt.Sprint("e", i/4%2),
			ProductID: "p", Units: units(1)}
		if i%10 == 0 {
			e.UnitsClaimed = units(2)
		}
		r.add(&e)
	}
	args := r.args()
	hours, users, endpoints := args[0].([]time.Time), args[1].([]string), args[3].([]string)
	calls, capped := args[5].([]int64), args[9].([]int64)
	var n, c int64
	for i := range hours {
		want = append(want, fmt.Sprintf("%s %s %s", hours[i].Format(time.RFC3339), users[i], endpoints[i]))
		n += calls[i]
		c += capped[i]
		if hours[i].Location() != time.UTC || hours[i].Minute() != 0 {
			t.Fatalf("hour %v: not a UTC hour", hours[i])
		}
	}
	if len(hours) != 3*4*2 {
		t.Fatalf("%d rollup rows, want 24: %q", len(hours), want)
	}
	if !slices.IsSorted(want) {
		t.Fatalf("not in key order: %q", want)
	}
	if n != 200 || c != 20 {
		t.Fatalf("calls %d, capped %d; want 200 and 20", n, c)
	}
}
