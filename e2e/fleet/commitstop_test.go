package fleet

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
)

// TestFleetCommitStopDuringOutage: a `settle commit` node serves calls
// from its lease while PostgreSQL is down, and is stopped (caddy stop)
// with their settlements still waiting for the database. PostgreSQL comes
// back and the node starts again: every call the backend served is in the
// ledger exactly once, the counter equals the ledger, and the node's start
// logs what it shipped. The settlements it could not commit at stop were
// kept in its settlement log (log_dir, by default under Caddy's data
// directory) and shipped at its start, each call once by its id. Before,
// the stop made one last attempt and dropped them: served, never charged.
func TestFleetCommitStopDuringOutage(t *testing.T) {
	pg := pgtest.Cluster(t, pgPort())
	// A lease outlives the outage (its own deadline is lease_ttl after
	// its last renewal), so the node admits from it meanwhile.
	f := newFleet(t, pg.DB("fleet"), 1, func(f *fleet) { f.settle, f.leaseTTL = "commit", "60s" })
	nd := f.nodes[0]
	key, _ := subscribe(t, nd, "u-stop", "quota", 0)
	for range 30 { // the lease's blocks grow to lease_max (10)
		if r := invoke(nd.base, key); r.status != 200 {
			t.Fatalf("before the outage: %d %s %v", r.status, r.code, r.err)
		}
	}
	before := len(f.served())

	pg.Stop()
	// Calls the lease covers are forwarded and served; their settlements
	// wait for the database (their callers get 503 store_unavailable
	// after 10 s, or nothing once the node stops).
	// A call the lease cannot cover is refused at once.
	const calls = 6
	var wg sync.WaitGroup
	var answered atomic.Int64
	for range calls {
		wg.Go(func() {
			invoke(nd.base, key)
			answered.Add(1)
		})
	}
	waitFor(t, 10*time.Second, func() bool { return len(f.served())-before+int(answered.Load()) >= calls })
	if len(f.served()) == before {
		t.Fatal("no call served from the lease while PostgreSQL was down")
	}
	nd.stop(t)
	wg.Wait()
	served := f.served()
	t.Logf("%d calls served, %d of them while PostgreSQL was down", len(served), len(served)-before)

	pg.Start()
	f.start(nd)
	checkLedger(t, nd, served, map[string]int{"u-stop": len(served)})
	if used := unitsUsed(t, nd, "u-stop"); used != strconv.Itoa(len(served)) {
		t.Errorf("the counter says %s units used; %d calls served", used, len(served))
	}
	log, _ := os.ReadFile(nd.log)
	shipped := false
	for line := range strings.SplitSeq(string(log), "\n") {
		if strings.Contains(line, "kept") || strings.Contains(line, "dropped") {
			t.Logf("node log: %s", line)
		}
		shipped = shipped || strings.Contains(line, "settlements kept at the last stop shipped")
	}
	if !shipped {
		t.Errorf("the node's start did not log what it shipped")
	}
}
