package fleet

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/pgtest"
)

// TestFleetFailover: PostgreSQL fails over under load, in each settle mode.
// A primary and a synchronous streaming standby (private clusters on
// FLEET_PG_PORT and a free port); two nodes on a multi-host DSN with
// target_session_attrs=read-write; callers at a paced rate over both nodes
// on a prepaid subscription (so leases are held across the failover). The
// primary is stopped the hard way (pg_ctl stop -m immediate) and the
// standby promoted 2 s later. Then: callers got only 200 or 503
// store_unavailable; every acknowledged call is in the ledger exactly once
// (with settle log, shipped by the nodes to the new primary), no call id
// twice in the ledger, the counters equal the ledger and the balance its
// top-up less the ledger's charges; a key revoked after the failover is
// refused on every node, and a quota of 100 taken after it serves exactly
// 100 over both nodes. How long calls were refused or slowed, and how
// soon after the promotion each node served again, are measured and
// logged (docs/fleet.md, "Failing PostgreSQL over").
func TestFleetFailover(t *testing.T) {
	for _, mode := range []string{"commit", "log"} {
		t.Run(mode, func(t *testing.T) { testFailover(t, mode) })
	}
}

// primaryDown is how long the fleet has no primary before the standby is
// promoted.
const primaryDown = 2 * time.Second

func testFailover(t *testing.T, mode string) {
	const standbyName = "fleet_standby"
	primary := pgtest.Cluster(t, pgPort())
	// The standby's port is one free now (FLEET_PG_STANDBY_PORT sets it):
	// a fixed one in the kernel's ephemeral range (32768–60999) was once
	// taken by a connection of the package run just before, and the
	// standby could not bind it.
	standbyPort := e2etest.EnvInt("FLEET_PG_STANDBY_PORT", 0)
	if standbyPort == 0 {
		standbyPort = e2etest.FreePort(t)
	}
	standby := primary.Standby(standbyPort, standbyName)
	primary.SyncStandby(standbyName)
	primary.DB("fleet")
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/fleet?sslmode=disable&target_session_attrs=read-write",
		primary.Port, standby.Port)
	f := newFleet(t, dsn, 2, func(f *fleet) { f.settle = mode })

	const topUp = 1000000
	key, _ := subscribe(t, f.nodes[0], "u-fo", "prepaid", topUp)
	qkey, _ := subscribe(t, f.nodes[1], "u-fo-quota", "quota", 0)
	rkey, rkeyID := subscribe(t, f.nodes[0], "u-fo-revoke", "unlimited", 0)
	for _, nd := range f.nodes {
		if r := invoke(nd.base, rkey); r.status != 200 {
			t.Fatalf("before the failover %s answered %d %s %v", nd.name, r.status, r.code, r.err)
		}
	}

	// 30 callers, each at most 10 calls a second: 300 calls a second
	// over the two nodes.
	l := startPacedLoad(f.nodes, key, 30, 100*time.Millisecond)
	waitFor(t, 30*time.Second, func() bool { return l.served() > 600 })
	killed := time.Now()
	primary.Kill()
	// No primary for a while, as while a failover manager decides the
	// primary is gone (scenario, not a wait for anything): the nodes
	// admit from their leases, or refuse, or wait for the database.
	time.Sleep(primaryDown)
	promoting := time.Now()
	standby.Promote()
	promoted := time.Now()
	// Every node serves calls begun after the promotion, then the load
	// goes on for a while (about two seconds) at the restored rate.
	waitFor(t, 60*time.Second, func() bool { return l.servedSince(promoted) >= 2 })
	back := l.served()
	waitFor(t, 60*time.Second, func() bool { return l.served() > back+600 })
	calls := l.finish()

	m := measure(calls, killed, promoting, promoted, len(f.nodes))
	t.Logf("settle %s: %d calls, %d served; answers %v; %d calls begun after the kill served before the promote command",
		mode, len(calls), m.served, m.answers, m.servedDown)
	t.Logf("settle %s: kill → promote command %v → promoted %v; refused %d calls, from %v to %v after the kill (a window of %v); served calls slower than 500ms: %d, slowest %v",
		mode, promoting.Sub(killed).Round(time.Millisecond), promoted.Sub(killed).Round(time.Millisecond), m.refused, m.refusedFrom, m.refusedTo, m.refusedWindow(),
		m.slow, m.slowest.Round(time.Millisecond))
	for i, nd := range f.nodes {
		t.Logf("settle %s: %s: first served call begun after the promotion answered %v after it (%v after the kill); longest time without a served call %v",
			mode, nd.name, m.firstOK[i].Sub(promoted).Round(time.Millisecond), m.firstOK[i].Sub(killed).Round(time.Millisecond),
			m.longestGap[i].Round(time.Millisecond))
	}
	for answer, n := range m.answers {
		if answer != "200" && answer != "503 store_unavailable" {
			t.Errorf("%d answers %q: want only 200 or 503 store_unavailable", n, answer)
		}
	}

	// Every acknowledged call in the ledger of the new primary, once.
	// With settle log the nodes ship what their logs took while the
	// database was away once they reach the new primary.
	ids := map[string]int{}
	for _, c := range calls {
		if c.ok {
			ids[c.requestID] = 0
		}
	}
	shipStart := time.Now()
	waitLedger(t, f.nodes[1], ids, 30*time.Second)
	t.Logf("settle %s: every acknowledged call in the new primary's ledger %v after the load stopped", mode, time.Since(shipStart).Round(time.Millisecond))
	checkLedger(t, f.nodes[1], ids, nil)
	if dup := pgtest.Query(t, dbDSN(t, standby), "SELECT count(*) - count(DISTINCT call_id) FROM ledger"); dup != "0" {
		t.Errorf("%s call ids in the ledger more than once", dup)
	}

	// A revocation made after the failover reaches every node.
	e2etest.AdminJSON(t, "DELETE", f.nodes[0].admin+"/platform/keys/"+rkeyID, nil, 200, nil)
	revoked := time.Now()
	for _, nd := range f.nodes {
		for {
			r := invoke(nd.base, rkey)
			if r.status == 401 {
				t.Logf("settle %s: %s refuses the key revoked after the failover %v after its revocation", mode, nd.name, time.Since(revoked).Round(time.Millisecond))
				break
			}
			if r.status != 200 {
				t.Fatalf("revoked key on %s: %d %s %v", nd.name, r.status, r.code, r.err)
			}
			// Bounded: 1s is the promise, 5s leaves a loaded machine room.
			if time.Since(revoked) > 5*time.Second {
				t.Fatalf("%s still serves a key revoked 5s ago (after the failover)", nd.name)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// A hard limit taken after the failover is exact: leases work on the
	// new primary.
	qacked := exhaustQuota(t, f.nodes, qkey)
	if len(qacked) != 100 {
		t.Errorf("quota of 100 after the failover: %d served", len(qacked))
	}
	for _, nd := range f.nodes {
		if r := invoke(nd.base, qkey); r.code != "quota_exceeded" {
			t.Errorf("past the quota on %s after the failover: %d %s %v", nd.name, r.status, r.code, r.err)
		}
	}
	// With settle log the other node's calls are in the ledger once it
	// shipped them (a ship_interval).
	waitLedger(t, f.nodes[0], qacked, 10*time.Second)
	checkLedger(t, f.nodes[0], qacked, map[string]int{"u-fo-quota": 100})

	// The counters equal the ledger (every call one unit, one credit).
	entries := len(exportLedger(t, f.nodes[0], "u-fo"))
	if used := unitsUsed(t, f.nodes[1], "u-fo"); used != strconv.Itoa(entries) || entries < len(ids) {
		t.Errorf("u-fo: the counter says %s units used, the ledger holds %d entries of one (%d acknowledged)", used, entries, len(ids))
	}
	// The balance once the nodes stopped gracefully (settling and giving
	// back what they hold): the top-up less what the ledger charged.
	for _, nd := range f.nodes {
		nd.stop(t)
	}
	f.start(f.nodes[0])
	var sub struct {
		Credits json.Number `json:"credits"`
	}
	e2etest.AdminJSON(t, "GET", f.nodes[0].admin+"/platform/subscriptions/u-fo/"+fleetService, nil, 200, &sub)
	entries = len(exportLedger(t, f.nodes[0], "u-fo"))
	if credits, err := strconv.ParseFloat(sub.Credits.String(), 64); err != nil || int(credits) != topUp-entries {
		t.Errorf("balance %s after %d ledger entries of 1 credit from %d: a wrong charge", sub.Credits, entries, topUp)
	}
	if t.Failed() {
		f.dump()
	}
}

// dbDSN is the fleet database's DSN on one cluster.
func dbDSN(t *testing.T, c *pgtest.Instance) string {
	dsn, err := pgtest.WithDatabase(c.DSN(), "fleet")
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// exhaustQuota calls with key over the nodes (ten callers each) until
// the quota is used up everywhere, and returns the request ids of the
// calls served.
func exhaustQuota(t *testing.T, nodes []*node, key string) map[string]int {
	t.Helper()
	var (
		mu       sync.Mutex
		served   = map[string]int{}
		failures []string
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(30 * time.Second)
	for c := range 10 * len(nodes) {
		nd := nodes[c%len(nodes)]
		wg.Go(func() {
			for time.Now().Before(deadline) {
				r := invoke(nd.base, key)
				mu.Lock()
				switch {
				case r.err == nil && r.status/100 == 2:
					served[r.requestID] = 0
				case r.err == nil && r.code == "quota_exceeded":
				default:
					failures = append(failures, fmt.Sprintf("%s: %d %s %v", nd.name, r.status, r.code, r.err))
				}
				done := len(served) >= 100 || len(failures) > 0
				mu.Unlock()
				if done {
					return
				}
				if r.code == "quota_exceeded" {
					// Another node may still hold a few units: ask again.
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	for _, msg := range failures[:min(len(failures), 10)] {
		t.Errorf("quota after the failover, unexpected answer: %s", msg)
	}
	return served
}

// call is one call of a paced load as its caller saw it.
type call struct {
	node       int
	start, end time.Time
	ok         bool
	answer     string // "200", "503 store_unavailable", "transport error"
	requestID  string
}

// pacedLoad runs callers that each make at most one call a period
// (caller i on node i%len(nodes)) until finish, recording every call.
type pacedLoad struct {
	mu    sync.Mutex
	calls []call
	wg    sync.WaitGroup
	stop  chan struct{}
}

func startPacedLoad(nodes []*node, key string, callers int, period time.Duration) *pacedLoad {
	l := &pacedLoad{stop: make(chan struct{})}
	// A bound of its own, should the test never call finish.
	deadline := time.Now().Add(3 * time.Minute)
	for c := range callers {
		i := c % len(nodes)
		nd := nodes[i]
		l.wg.Go(func() {
			next := time.Now()
			for time.Now().Before(deadline) {
				select {
				case <-l.stop:
					return
				default:
				}
				c := call{node: i, start: time.Now()}
				r := invoke(nd.base, key)
				c.end = time.Now()
				switch {
				case r.err != nil:
					c.answer = "transport error"
				case r.status/100 == 2:
					c.ok, c.answer, c.requestID = true, "200", r.requestID
				default:
					c.answer = strconv.Itoa(r.status) + " " + r.code
				}
				l.mu.Lock()
				l.calls = append(l.calls, c)
				l.mu.Unlock()
				// Pacing, not a wait for something: the next call's turn.
				next = next.Add(period)
				if d := time.Until(next); d > 0 {
					select {
					case <-l.stop:
						return
					case <-time.After(d):
					}
				} else {
					next = time.Now()
				}
			}
		})
	}
	return l
}

func (l *pacedLoad) served() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.calls {
		if c.ok {
			n++
		}
	}
	return n
}

// servedSince is the fewest calls begun at or after since that a node
// served, over the nodes.
func (l *pacedLoad) servedSince(since time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	per := map[int]int{}
	nodes := map[int]bool{}
	for _, c := range l.calls {
		nodes[c.node] = true
		if c.ok && !c.start.Before(since) {
			per[c.node]++
		}
	}
	least := -1
	for n := range nodes {
		if least < 0 || per[n] < least {
			least = per[n]
		}
	}
	return max(least, 0)
}

func (l *pacedLoad) finish() []call {
	close(l.stop)
	l.wg.Wait()
	return l.calls
}

// failoverFigures are what the callers saw of a failover.
type failoverFigures struct {
	served, refused int
	answers         map[string]int
	// servedDown: calls begun after the kill and served before the
	// standby was told to promote itself (from the nodes' leases, with
	// no primary anywhere).
	servedDown int
	// refusedFrom and refusedTo: from the start of the first refused
	// call to the answer of the last, after the kill.
	refusedFrom, refusedTo time.Duration
	// slow: served calls that took 500ms or more; slowest: the longest.
	slow    int
	slowest time.Duration
	// Per node: the answer of its first served call begun after the
	// promotion, and its longest time between two served calls' answers
	// (the second after the kill).
	firstOK    []time.Time
	longestGap []time.Duration
}

func (m failoverFigures) refusedWindow() time.Duration {
	return (m.refusedTo - m.refusedFrom).Round(time.Millisecond)
}

func measure(calls []call, killed, promoting, promoted time.Time, nodes int) failoverFigures {
	m := failoverFigures{answers: map[string]int{}, firstOK: make([]time.Time, nodes), longestGap: make([]time.Duration, nodes)}
	sorted := append([]call(nil), calls...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].end.Before(sorted[j].end) })
	var first, last time.Time
	lastOK := make([]time.Time, nodes)
	for _, c := range sorted {
		m.answers[c.answer]++
		if !c.ok {
			m.refused++
			if first.IsZero() || c.start.Before(first) {
				first = c.start
			}
			last = c.end
			continue
		}
		m.served++
		if c.start.After(killed) && c.end.Before(promoting) {
			m.servedDown++
		}
		if d := c.end.Sub(c.start); d >= 500*time.Millisecond {
			m.slow++
		}
		m.slowest = max(m.slowest, c.end.Sub(c.start))
		if !c.start.Before(promoted) && m.firstOK[c.node].IsZero() {
			m.firstOK[c.node] = c.end
		}
		if c.end.After(killed) && !lastOK[c.node].IsZero() {
			m.longestGap[c.node] = max(m.longestGap[c.node], c.end.Sub(lastOK[c.node]))
		}
		lastOK[c.node] = c.end
	}
	if !first.IsZero() {
		m.refusedFrom, m.refusedTo = first.Sub(killed).Round(time.Millisecond), last.Sub(killed).Round(time.Millisecond)
	}
	return m
}
