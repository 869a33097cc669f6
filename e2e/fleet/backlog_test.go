package fleet

import (
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
)

// TestFleetCommitBacklogDuringOutage: a `settle commit` node has more
// calls served at once than its group commit holds (2,048 settlements:
// one batch being retried and a full queue) when PostgreSQL goes away.
// The calls passed the key lookup and were admitted before the stop (held
// at the backend until it); the backend answers them all after it.
//
// Every caller gets its answer within the documented wait (10 s, then the
// settlement is kept and written once the database is back), and once it
// is back every call answered 200 is in the ledger exactly once, and
// nothing else: no call served and charged without an answer. Before, the
// settlements past the 2,048th waited to be queued with no bound: their
// callers hung until the database answered (or gave up, the call charged
// all the same once it did).
func TestFleetCommitBacklogDuringOutage(t *testing.T) {
	pg := pgtest.Cluster(t, pgPort())
	dsn := pg.DB("fleet")
	f := newFleet(t, dsn, 1, func(f *fleet) { f.settle, f.leaseTTL = "commit", "60s" })
	nd := f.nodes[0]
	key, _ := subscribe(t, nd, "u-backlog", "unlimited", 0)
	if r := invoke(nd.base, key); r.status != 200 {
		t.Fatalf("before the outage: %d %s %v", r.status, r.code, r.err)
	}
	const calls = 2300
	gate := make(chan struct{})
	f.gate.Store(&gate)
	arrived := f.arrived.Load()
	cl := &http.Client{Timeout: 40 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: calls}}
	type answer struct {
		result
		at time.Time
	}
	answers := make([]answer, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			r := invokeClient(cl, nd.base, key)
			answers[i] = answer{r, time.Now()}
		})
	}
	waitFor(t, 90*time.Second, func() bool { return f.arrived.Load()-arrived >= calls })
	pg.Stop()
	released := time.Now()
	f.gate.Store(nil)
	close(gate)
	wg.Wait()

	ok := map[string]int{}
	statuses := map[string]int{}
	var late []time.Duration
	for _, a := range answers {
		took := a.at.Sub(released)
		switch {
		case a.err != nil:
			statuses["transport error"]++
		case a.status == 200:
			statuses["200"]++
			ok[a.requestID] = 0
		default:
			statuses[http.StatusText(a.status)+" "+a.code]++
		}
		// settleWait (10 s) and room for a loaded machine.
		if took > 15*time.Second {
			late = append(late, took)
		}
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	t.Logf("answers after the stop: %v", statuses)
	if len(late) > 0 {
		t.Errorf("%d of %d callers waited past 15 s for their answers (the first %v, the last %v)",
			len(late), calls, late[0].Round(time.Millisecond), late[len(late)-1].Round(time.Millisecond))
	}
	for s, n := range statuses {
		if s != "200" {
			t.Errorf("%d calls served while PostgreSQL was down were answered %s", n, s)
		}
	}

	pg.Start()
	served := f.served()
	waitLedger(t, nd, served, 60*time.Second)
	// Every call answered 200 is charged once, and only those: the
	// backend served every call, so a call charged without a 200 is one
	// its caller paid for and never got.
	checkLedger(t, nd, ok, map[string]int{"u-backlog": len(ok) + 1})
	if len(served) != len(ok)+1 {
		t.Errorf("the backend served %d calls, %d were answered 200", len(served), len(ok)+1)
	}
}
