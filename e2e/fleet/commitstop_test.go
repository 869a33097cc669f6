package fleet

import (
	"io"
	"net/http"
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
// from its lease while PostgreSQL is down, their settlements waiting for
// the database.
//
// First its config is reloaded meanwhile (caddy reload; refused while
// the database is down, the running config going on): the store is
// shared across a reload and stays open, and once the database is back
// the waiting settlements are written, none dropped.
//
// Then, in a second outage, the node is stopped (caddy stop) with the
// settlements still waiting. PostgreSQL comes back and the node starts
// again: the settlements it could not commit at stop were kept in its
// settlement log (log_dir, by default under Caddy's data directory) and
// its start ships them, each call once by its id, and logs it. Before,
// the stop made one last attempt and dropped them: served, never charged.
//
// In the end every call the backend served is in the ledger exactly once
// and the counter equals the ledger.
func TestFleetCommitStopDuringOutage(t *testing.T) {
	pg := pgtest.Cluster(t, pgPort())
	// A lease outlives the outage (its own deadline is lease_ttl after
	// its last renewal), so the node admits from it meanwhile.
	f := newFleet(t, pg.DB("fleet"), 1, func(f *fleet) { f.settle, f.leaseTTL = "commit", "60s" })
	nd := f.nodes[0]
	key, _ := subscribe(t, nd, "u-stop", "quota", 0)
	warm := func() {
		for range 20 { // the lease's blocks grow to lease_max (10)
			if r := invoke(nd.base, key); r.status != 200 {
				t.Fatalf("before the outage: %d %s %v", r.status, r.code, r.err)
			}
		}
	}
	// outage stops PostgreSQL and makes calls: those the lease covers are
	// forwarded and served, their settlements waiting for the database
	// (their callers get 503 store_unavailable after 10 s); any other is
	// refused at once. It returns once each call was served or answered,
	// and a wait for the callers.
	outage := func() *sync.WaitGroup {
		t.Helper()
		before := len(f.served())
		pg.Stop()
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
	nd.stop(t)
	wg.Wait()
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
		if strings.Contains(line, "at stop") || strings.Contains(line, "at the last stop") || strings.Contains(line, "dropped") {
			t.Logf("node log: %s", line)
		}
		shipped = shipped || strings.Contains(line, "settlements kept at the last stop shipped")
	}
	if !shipped {
		t.Errorf("the node's start did not log what it shipped")
	}
}
