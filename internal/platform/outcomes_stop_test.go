package platform

import (
	"context"
	"os"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// A fleet node stopped while PostgreSQL is down: the outcome flusher's
// last flush at the stop fails ("kept and sent again"), and before, the
// counts it held were in the process's memory only, so they were gone
// with it and the console's analytics undercounted the outage's calls.
// Now the stop keeps them in a file in the node's settlement log
// directory and the next start on that node adds them. It runs the
// flusher the pooled store runs (startOutcomeFlusher, close), on a real
// PostgreSQL of its own that it stops; no Caddy is started.
func TestOutcomesSurviveStopDuringOutage(t *testing.T) {
	c := pgtest.Cluster(t, pgtest.ClusterPort(25438))
	dsn := c.DB("platform")
	logDir := t.TempDir()
	keep := outcomeKeepFile(logDir, true)
	defer func(c *engine.OutcomeCounter, d time.Duration) { sharedOutcomes, OutcomeFlushInterval = c, d }(sharedOutcomes, OutcomeFlushInterval)
	OutcomeFlushInterval = time.Hour // only the start's and the stop's flushes
	ctx := context.Background()
	open := func() *pgstore.Store {
		s, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "a", LogDir: logDir})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	k := engine.OutcomeCall{Hour: time.Now().UTC().Truncate(time.Hour).Unix(), UserID: "u", ServiceID: "svc",
		EndpointID: "e", Product: "q", Outcome: "2xx"}

	// The first process: 5 calls flushed, 7 served during the outage.
	sharedOutcomes = engine.NewOutcomeCounter()
	s := open()
	core, logs := observer.New(zapcore.InfoLevel)
	f := startOutcomeFlusher(s, keep, zap.New(core))
	for range 5 {
		sharedOutcomes.Count(k, time.Millisecond, time.Millisecond)
	}
	if err := f.flush(); err != nil {
		t.Fatal(err)
	}
	c.Stop()
	for range 7 {
		sharedOutcomes.Count(k, time.Millisecond, time.Millisecond)
	}
	f.close() // the stop: its last flush fails
	s.Close()
	if logs.FilterMessageSnippet("kept and added at the next start").Len() != 1 {
		t.Errorf("the stop did not say it kept the counts: %v", logs.All())
	}

	// The next process on the node, once the database is back.
	c.Start()
	sharedOutcomes = engine.NewOutcomeCounter()
	s2 := open()
	defer s2.Close()
	f2 := startOutcomeFlusher(s2, keep, zap.NewNop())
	sharedOutcomes.Count(k, time.Millisecond, 0)
	f2.close()
	var calls int64
	if err := s2.ScanOutcomes(ctx, store.OutcomeFilter{}, func(r store.OutcomeRow) error {
		calls += r.Calls
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if calls != 5+7+1 {
		t.Fatalf("the store counts %d calls after the restart, want %d: the outage's %d calls were lost at the stop",
			calls, 5+7+1, 5+7+1-calls)
	}
	if _, err := os.Stat(keep); !os.IsNotExist(err) {
		t.Fatalf("the kept file is still there once added: %v", err)
	}
}
