package pgstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// outcomeCalls sums the calls of every outcome row s holds.
func outcomeCalls(t *testing.T, s *Store) int64 {
	t.Helper()
	var n int64
	if err := s.ScanOutcomes(context.Background(), store.OutcomeFilter{}, func(r store.OutcomeRow) error {
		n += r.Calls
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// A node stopping while PostgreSQL is down: its last flush of the call
// outcomes fails. The counts it could not add are kept in a file next to
// its settlement log (engine.(*OutcomeCounter).Keep) and the next process
// on that node adds them (LoadKept, then Flush), so the fleet's outcomes
// count every call served during the outage. Before, the counts stayed in
// the stopping process's memory and were gone with it.
func TestOutcomesKeptAtStopDuringOutage(t *testing.T) {
	c := pgtest.Cluster(t, pgtest.ClusterPort(25437))
	dsn := c.DB("pgstore")
	logDir := t.TempDir()
	kept := filepath.Join(logDir, "call-outcomes.kept")
	ctx := context.Background()
	hour := time.Now().UTC().Truncate(time.Hour)
	k := engine.OutcomeCall{Hour: hour.Unix(), UserID: "u", ServiceID: "svc", EndpointID: "e", Product: "q", Outcome: "2xx"}

	// The first process: some calls flushed, then the database goes away.
	a := openNode(t, dsn, "a", func(o *Options) { o.LogDir = logDir })
	first := engine.NewOutcomeCounter()
	for range 5 {
		first.Count(k, time.Millisecond, 2*time.Millisecond)
	}
	if err := first.Flush(ctx, a, time.Now()); err != nil {
		t.Fatal(err)
	}
	c.Stop()
	for range 7 { // served during the outage
		first.Count(k, time.Millisecond, 2*time.Millisecond)
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := first.Flush(fctx, a, time.Now()); err == nil {
		t.Fatal("a flush with the database down succeeded")
	}
	cancel()
	for range 3 { // after the failed flush, before the stop
		first.Count(k, time.Millisecond, 0)
	}
	// The stop: one last attempt fails, the rest is kept.
	fctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	if err := first.Flush(fctx, a, time.Now()); err == nil {
		t.Fatal("the last flush with the database down succeeded")
	}
	cancel()
	calls, dropped, err := first.Keep(kept, time.Now())
	if err != nil || calls != 10 || dropped != 0 {
		t.Fatalf("Keep = %d calls, %d dropped, %v; want 10, 0, nil", calls, dropped, err)
	}
	a.Close()

	copied := kept + ".copy"
	if data, err := os.ReadFile(kept); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(copied, data, 0o600); err != nil {
		t.Fatal(err)
	}

	// The next process on the node, the database back.
	c.Start()
	a2 := openNode(t, dsn, "a", func(o *Options) { o.LogDir = logDir })
	next := engine.NewOutcomeCounter()
	if n, calls, err := next.LoadKept(kept); err != nil || n != 2 || calls != 10 {
		t.Fatalf("LoadKept = %d batches, %d calls, %v; want 2, 10, nil", n, calls, err)
	}
	next.Count(k, time.Millisecond, 0)
	if err := next.Flush(ctx, a2, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := outcomeCalls(t, a2); got != 5+7+3+1 {
		t.Fatalf("the store counts %d calls, want %d (every call, the outage's once)", got, 5+7+3+1)
	}
	if _, err := os.Stat(kept); !os.IsNotExist(err) {
		t.Fatalf("the kept file is still there once applied: %v", err)
	}
	// Sent again (a crash before the file was removed): the store adds
	// nothing, each batch keeping its writer and number.
	again := engine.NewOutcomeCounter()
	if n, _, err := again.LoadKept(copied); err != nil || n != 2 {
		t.Fatalf("LoadKept of the copy = %d batches, %v", n, err)
	}
	if err := again.Flush(ctx, a2, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := outcomeCalls(t, a2); got != 16 {
		t.Fatalf("after the kept batches were sent again the store counts %d calls, want 16", got)
	}
}
