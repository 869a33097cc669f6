package fleet

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
)

// TestFleetCommitStopDuringOutage: a `settle commit` node serves calls
// from its lease while PostgreSQL is down, their settlements waiting for
// the database.
//
// First its config is reloaded meanwhile (caddy reload; refused while
// the database is down, the running config going on): the store is
// shared across a reload and stays open, and once the database is back
// the waiting settlements are written, none dropped.
//
// Then, in a second outage, the node is stopped (caddy stop) with the
// settlements still waiting: their callers are answered as the stop
// begins, within its grace period (2 s, shorter than the 10 s wait), none
// cut off by the process's exit. PostgreSQL comes back and the node starts
// again: the settlements it could not commit at stop were kept in its
// settlement log (log_dir, by default under Caddy's data directory) and
// its start ships them, each call once by its id, and logs it. Before,
// the stop made one last attempt and dropped them: served, never charged.
//
// In the end every call the backend served is in the ledger exactly once
// and the counter equals the ledger; and the call outcomes count every
// call made, those the stop could not add kept and added at the start.
func TestFleetCommitStopDuringOutage(t *testing.T) {
	pg := pgtest.Cluster(t, pgPort())
	// A lease outlives the outage (its own deadline is lease_ttl after
	// its last renewal), so the node admits from it meanwhile.
	dsn := pg.DB("fleet")
	f := newFleet(t, dsn, 1, func(f *fleet) { f.settle, f.leaseTTL, f.leaseMax = "commit", "60s", "40" })
	nd := f.nodes[0]
	key, _ := subscribe(t, nd, "u-stop", "quota", 0)
	const calls = 6       // per outage
	var made atomic.Int64 // invoke calls made, each one call outcome
	// warm calls until the node's lease holds units for the outage's
	// calls (its blocks grow, refilled in the background as they run
	// low).
	covered := fmt.Sprintf("SELECT coalesce(sum(units), 0) >= %d FROM leases WHERE user_id = 'u-stop'", int64(billing.Whole(calls)))
	warm := func() {
		t.Helper()
		waitFor(t, 20*time.Second, func() bool {
			made.Add(1)
			if r := invoke(nd.base, key); r.status != 200 {
				t.Fatalf("before the outage: %d %s %v", r.status, r.code, r.err)
			}
			return pgtest.Query(t, dsn, covered) == "t"
		})
	}
	// outage makes calls the lease covers and holds them at the backend,
	// stops PostgreSQL and lets the backend answer them: they are served
	// and their settlements wait for the database (their callers get
	// their answers once the settlement is written, or kept: after 10 s,
	// or at the stop). It returns once each call was served, with a wait
	// for the callers. Every caller gets its answer, at the stop too
	// (checked below).
	outage := func() *sync.WaitGroup {
		t.Helper()
		before := len(f.served())
		gate := make(chan struct{})
		f.gate.Store(&gate)
		arrived := f.arrived.Load()
		var wg sync.WaitGroup
		var answered atomic.Int64
		for range calls {
			wg.Go(func() {
				made.Add(1)
				if r := invoke(nd.base, key); r.status != 200 {
					// Served and charged (kept, written once the
					// database answers): the answer is delivered, at a
					// stop too. Before, a stop with a grace period
					// shorter than the 10 s wait answered these only as
					// the store closed, just before the process exited,
					// and an answer could lose that race: the connection
					// closed without one, the call charged.
					t.Errorf("a call served during the outage was answered %d %s %v", r.status, r.code, r.err)
				}
				answered.Add(1)
			})
		}
		waitFor(t, 10*time.Second, func() bool { return f.arrived.Load()-arrived+answered.Load() >= calls })
		pg.Stop()
		f.gate.Store(nil)
		close(gate)
		waitFor(t, 10*time.Second, func() bool { return len(f.served())-before+int(answered.Load()) >= calls })
		if len(f.served()) != before+calls || answered.Load() != 0 {
			t.Fatalf("%d of %d calls served from the lease while PostgreSQL was down", len(f.served())-before, calls)
		}
		t.Logf("%d calls served while PostgreSQL was down", len(f.served())-before)
		return &wg
	}

	// A reload during the outage.
	warm()
	wg := outage()
	req, _ := http.NewRequest("POST", nd.admin+"/load", strings.NewReader(f.caddyfile(nd)))
	req.Header.Set("Content-Type", "text/caddyfile")
	req.Header.Set("Cache-Control", "must-revalidate") // load it even though it is the same config
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Refused while the database is down (starting a config records its
	// changed settings in the audit log): the running config goes on.
	// Either way the store stays open.
	t.Logf("reload during the outage: %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
	pg.Start()
	wg.Wait()
	served := f.served()
	waitLedger(t, nd, served, 20*time.Second)
	checkLedger(t, nd, served, map[string]int{"u-stop": len(served)})

	// A stop during the outage.
	warm()
	wg = outage()
	logged, _ := os.ReadFile(nd.log)
	nd.stop(t)
	wg.Wait()
	// The stop answers the calls waiting for the database as it begins,
	// so the server's shutdown ends within its grace period (2 s, shorter
	// than the 10 s wait) with no call in flight. Before, the grace
	// period ran out with them waiting ("server shutdown" logged as an
	// error) and their answers were written only as the store closed,
	// racing the process's exit.
	if stopLog, _ := os.ReadFile(nd.log); len(stopLog) > len(logged) {
		for line := range strings.SplitSeq(string(stopLog[len(logged):]), "\n") {
			if strings.Contains(line, `"msg":"server shutdown"`) {
				t.Errorf("the stop's grace period ran out with calls waiting for their settlements: %s", line)
			}
		}
	}
	pg.Start()
	f.start(nd)
	served = f.served()
	t.Logf("%d calls served in all", len(served))
	checkLedger(t, nd, served, map[string]int{"u-stop": len(served)})
	if used := unitsUsed(t, nd, "u-stop"); used != strconv.Itoa(len(served)) {
		t.Errorf("the counter says %s units used; %d calls served", used, len(served))
	}
	log, _ := os.ReadFile(nd.log)
	shipped := false
	for line := range strings.SplitSeq(string(log), "\n") {
		if strings.Contains(line, "at stop") || strings.Contains(line, "at the last stop") || strings.Contains(line, "dropped") || strings.Contains(line, "outcomes") {
			t.Logf("node log: %s", line)
		}
		shipped = shipped || strings.Contains(line, "settlements kept at the last stop shipped")
	}
	if !shipped {
		t.Errorf("the node's start did not log what it shipped")
	}
	// A call whose settlement waits for the database past its 10 s is
	// answered 503, its settlement kept: its hold went with it, so there
	// is nothing to release and nothing to log as an error.
	if n := strings.Count(string(log), `"msg":"release reservation"`); n > 0 {
		t.Errorf("the node logged %d errors releasing the holds of settlements kept for the database", n)
	}
	// The call outcomes count every call made, the second outage's too:
	// the stop could not add them and kept them in call-outcomes.kept in
	// the node's log_dir, and the start added them (before, they were
	// lost with the stopping process). The outage's calls waiting on the
	// database at the stop are answered as it begins, so they end before
	// the counts are kept (before, they ended only as the store closed,
	// after the counts were kept, and were not counted).
	sumOutcomes := "SELECT coalesce(sum(calls), 0) FROM call_outcomes WHERE user_id = 'u-stop'"
	least := made.Load()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := strconv.ParseInt(pgtest.Query(t, dsn, sumOutcomes), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if got > made.Load() {
			t.Fatalf("the call outcomes count %d calls, only %d were made", got, made.Load())
		}
		if got >= least {
			t.Logf("the call outcomes count %d of the %d calls made", got, made.Load())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the call outcomes count %d calls, %d were made", got, made.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
