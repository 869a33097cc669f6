package fleet

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/pgtest"
)

// TestFleetExactLimits: 300 callers spread over three nodes race for a
// quota of 100, a prepaid balance of 100 credits and a spending cap of 100:
// exactly 100 calls of each are served, whichever node served them, and the
// ledger holds exactly those.
func TestFleetExactLimits(t *testing.T) {
	f := newFleet(t, fleetDB(t), 3)
	accounts := []struct {
		user, product string
		credits       int
		refusal       string
	}{
		{"u-quota", "quota", 0, "quota_exceeded"},
		{"u-prepaid", "prepaid", 100, "insufficient_credits"},
		{"u-capped", "capped", 0, "quota_exceeded"},
	}
	keys := make([]string, len(accounts))
	for i, a := range accounts {
		keys[i], _ = subscribe(t, f.nodes[i%len(f.nodes)], a.user, a.product, a.credits)
	}

	const callers, limit = 300, 100
	var (
		served   [3]atomic.Int64
		refused  [3]atomic.Int64
		mu       sync.Mutex
		acked    = map[string]int{} // request id -> account
		failures []string
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(60 * time.Second)
	for c := range callers {
		acc := c % len(accounts)
		nd := f.nodes[(c/len(accounts))%len(f.nodes)]
		wg.Go(func() {
			// A refusal may be a node whose leases ran dry while another
			// node still holds units: keep asking (bounded) until the
			// account is used up everywhere or the deadline passes.
			for time.Now().Before(deadline) && served[acc].Load() < limit {
				r := invoke(nd.base, keys[acc])
				switch {
				case r.err == nil && r.status/100 == 2:
					served[acc].Add(1)
					mu.Lock()
					acked[r.requestID] = acc
					mu.Unlock()
				case r.err == nil && r.code == accounts[acc].refusal:
					refused[acc].Add(1)
					time.Sleep(20 * time.Millisecond)
				default:
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s on %s: %d %s %v", accounts[acc].user, nd.name, r.status, r.code, r.err))
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	for _, msg := range failures[:min(len(failures), 10)] {
		t.Errorf("unexpected answer: %s", msg)
	}
	for i, a := range accounts {
		t.Logf("%s: %d served, %d refused", a.user, served[i].Load(), refused[i].Load())
		if served[i].Load() != limit {
			t.Errorf("%s: %d calls served, want exactly %d", a.user, served[i].Load(), limit)
		}
		// Used up on every node: one more call is refused everywhere.
		for _, nd := range f.nodes {
			if r := invoke(nd.base, keys[i]); r.err != nil || r.code != a.refusal {
				t.Errorf("%s: one more call on %s: %d %s %v, want %s", a.user, nd.name, r.status, r.code, r.err, a.refusal)
			}
		}
	}
	waitLedger(t, f.nodes[0], acked, 10*time.Second)
	checkLedger(t, f.nodes[0], acked, map[string]int{"u-quota": limit, "u-prepaid": limit, "u-capped": limit})
	// The counters equal the ledger (every call is one unit).
	for _, a := range accounts {
		entries := len(exportLedger(t, f.nodes[1], a.user))
		if used := unitsUsed(t, f.nodes[2], a.user); used != strconv.Itoa(entries) {
			t.Errorf("%s: the counter says %s units used, the ledger holds %d entries of one", a.user, used, entries)
		}
	}
	if t.Failed() {
		f.dump()
	}
	// The balance as every node's admin API shows it. A node caches a
	// subscription and learns of other nodes' charges when its cached
	// copy ages out (about a second): wait that long, bounded, and log it.
	settled := time.Now()
	for _, nd := range f.nodes {
		var sub struct {
			Credits json.Number `json:"credits"`
		}
		for {
			e2etest.AdminJSON(t, "GET", nd.admin+"/platform/subscriptions/u-prepaid/"+fleetService, nil, 200, &sub)
			if sub.Credits.String() == "0" || time.Since(settled) > 5*time.Second {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if sub.Credits.String() != "0" {
			t.Errorf("prepaid balance on %s after 100 calls of 1 credit: %s, want 0", nd.name, sub.Credits)
		}
	}
	t.Logf("every node showed the prepaid balance at 0 within %v of the checks' start", time.Since(settled).Round(time.Millisecond))
}

// checkLedger: every request a caller saw served is in the ledger exactly
// once, and each user's entries number want[user] when given.
// waitLedger waits until every acknowledged request is in the ledger, or
// d passed (checkLedger then says what is missing).
func waitLedger(t *testing.T, nd *node, acked map[string]int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		seen := map[string]bool{}
		for _, e := range exportLedger(t, nd, "") {
			seen[e.RequestID] = true
		}
		missing := 0
		for id := range acked {
			if !seen[id] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func checkLedger(t *testing.T, nd *node, acked map[string]int, want map[string]int) {
	t.Helper()
	entries := exportLedger(t, nd, "")
	seen := map[string]int{}
	perUser := map[string]int{}
	for _, e := range entries {
		if e.RequestID != "" {
			seen[e.RequestID]++
		}
		perUser[e.UserID]++
	}
	lost := 0
	for id := range acked {
		switch seen[id] {
		case 1:
		case 0:
			lost++
			if lost <= 5 {
				t.Errorf("request %s was served (2xx) but is not in the ledger", id)
			}
		default:
			t.Errorf("request %s is in the ledger %d times", id, seen[id])
		}
	}
	if lost > 0 {
		t.Errorf("%d acknowledged calls missing from the ledger", lost)
	}
	for user, n := range want {
		if perUser[user] != n {
			t.Errorf("%s: %d ledger entries, want %d", user, perUser[user], n)
		}
	}
}

// loadUntil runs callers invoking through the nodes (caller i on node
// i%len(nodes)) until stop is closed, recording each answer.
type load struct {
	mu       sync.Mutex
	acked    map[string]bool // request ids answered 2xx
	statuses map[string]int  // "status code" -> count
	wg       sync.WaitGroup
	stop     chan struct{}
}

func startLoad(nodes []*node, key string, callers int) *load {
	l := &load{acked: map[string]bool{}, statuses: map[string]int{}, stop: make(chan struct{})}
	for c := range callers {
		nd := nodes[c%len(nodes)]
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				r := invoke(nd.base, key)
				l.mu.Lock()
				switch {
				case r.err != nil:
					l.statuses["transport error"]++
				case r.status/100 == 2:
					l.acked[r.requestID] = true
					l.statuses["200"]++
				default:
					l.statuses[strconv.Itoa(r.status)+" "+r.code]++
				}
				l.mu.Unlock()
				if r.err != nil || r.status/100 != 2 {
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	return l
}

func (l *load) finish() map[string]bool {
	close(l.stop)
	l.wg.Wait()
	return l.acked
}

func (l *load) served() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// TestFleetKill9: a node killed with kill -9 under load loses nothing a
// caller was told was served: every 2xx of every node, the dead one's
// included, is in the ledger, and the quota counters equal the ledger.
func TestFleetKill9(t *testing.T) {
	f := newFleet(t, fleetDB(t), 3)
	key, _ := subscribe(t, f.nodes[0], "u-kill", "unlimited", 0)
	qkey, _ := subscribe(t, f.nodes[0], "u-kill-quota", "quota", 0)
	l := startLoad(f.nodes, key, 60)
	ql := startLoad(f.nodes, qkey, 30)
	waitFor(t, 30*time.Second, func() bool { return l.served() > 300 })
	f.nodes[1].kill()
	before := l.served()
	waitFor(t, 30*time.Second, func() bool { return l.served() > before+300 })
	// The killed node comes back: it ships what its settlement log
	// acknowledged and PostgreSQL did not have yet (settle log), before it
	// serves again.
	f.start(f.nodes[1])
	restarted := l.served()
	waitFor(t, 30*time.Second, func() bool { return l.served() > restarted+100 })
	acked, qacked := l.finish(), ql.finish()
	t.Logf("unlimited: %d served, answers %v; quota: %d served, answers %v", len(acked), l.statuses, len(qacked), ql.statuses)
	all := map[string]int{}
	for id := range acked {
		all[id] = 0
	}
	for id := range qacked {
		all[id] = 1
	}
	// Calls in flight on the killed node may be in the ledger without a
	// caller having seen their answer: only the acknowledged ones must be
	// (the other nodes ship theirs within a ship interval).
	waitLedger(t, f.nodes[0], all, 10*time.Second)
	checkLedger(t, f.nodes[0], all, nil)
	if len(qacked) > 100 {
		t.Errorf("quota of 100: %d served across a kill", len(qacked))
	}
	// The dead node's leases expire (lease_ttl 5s): its unused units come
	// back to the others, so the whole quota is charged in the end, never
	// more (calls the dead node settled without its caller seeing the
	// answer count too).
	nd := f.nodes[0]
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		r := invoke(nd.base, qkey)
		if r.err == nil && r.status/100 == 2 {
			qacked[r.requestID] = true
			continue
		}
		if r.code == "quota_exceeded" && len(exportLedger(t, nd, "u-kill-quota")) >= 100 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := len(exportLedger(t, nd, "u-kill-quota")); n != 100 {
		t.Errorf("after the kill and lease expiry, %d of the quota of 100 charged", n)
	}
	if r := invoke(nd.base, qkey); r.code != "quota_exceeded" {
		t.Errorf("past the quota after a kill: %d %s %v", r.status, r.code, r.err)
	}
	checkLedger(t, f.nodes[2], map[string]int{}, map[string]int{"u-kill-quota": 100})
	for user, n := range map[string]int{"u-kill": len(acked), "u-kill-quota": 100} {
		entries := len(exportLedger(t, nd, user))
		if used := unitsUsed(t, f.nodes[2], user); used != strconv.Itoa(entries) || entries < n {
			t.Errorf("%s: the counter says %s units used, the ledger holds %d entries of one (%d acknowledged)", user, used, entries, n)
		}
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFleetPostgresRestart: PostgreSQL restarts under load. Callers get
// either a served call or 503 store_unavailable, never another error;
// every served call is in the ledger and the prepaid balance is its top-up
// less what the ledger charged (no wrong charge); the nodes recover by
// themselves once the database is back.
func TestFleetPostgresRestart(t *testing.T) {
	pg := pgtest.Cluster(t, pgPort())
	f := newFleet(t, pg.DB("fleet"), 2)
	const topUp = 100000
	key, _ := subscribe(t, f.nodes[0], "u-pg", "prepaid", topUp)
	l := startLoad(f.nodes, key, 40)
	waitFor(t, 30*time.Second, func() bool { return l.served() > 200 })
	pg.Stop()
	time.Sleep(2 * time.Second)
	during := l.served()
	pg.Start()
	// Recovery without restarting the gateways: calls are served again.
	waitFor(t, 60*time.Second, func() bool { return l.served() > during+200 })
	acked := l.finish()
	t.Logf("answers across the restart: %v", l.statuses)
	for status, n := range l.statuses {
		if status != "200" && status != "503 store_unavailable" && status != "transport error" {
			t.Errorf("%d answers %q: want only 200 or 503 store_unavailable", n, status)
		}
	}
	ids := map[string]int{}
	for id := range acked {
		ids[id] = 0
	}
	// What the nodes acknowledged from their settlement logs while the
	// database was down is shipped once it is back (within a few
	// seconds: the shipper retries with a backoff of up to 2s).
	waitLedger(t, f.nodes[1], ids, 20*time.Second)
	checkLedger(t, f.nodes[1], ids, nil)
	// Every call costs exactly one credit. The nodes stop gracefully
	// first, settling what they hold, so the balance is final.
	for _, nd := range f.nodes {
		nd.stop(t)
	}
	f.start(f.nodes[0])
	var sub struct {
		Credits json.Number `json:"credits"`
	}
	e2etest.AdminJSON(t, "GET", f.nodes[0].admin+"/platform/subscriptions/u-pg/"+fleetService, nil, 200, &sub)
	entries := exportLedger(t, f.nodes[0], "u-pg")
	credits, err := strconv.ParseFloat(sub.Credits.String(), 64)
	if err != nil || int(credits) != topUp-len(entries) {
		t.Errorf("balance %s after %d ledger entries of 1 credit from %d: a wrong charge", sub.Credits, len(entries), topUp)
	}
}

// TestFleetRevokeAcrossNodes: a key revoked through node A's admin API is
// refused by nodes B and C, which served it a moment before, within the
// key cache's bound (the time is logged).
func TestFleetRevokeAcrossNodes(t *testing.T) {
	f := newFleet(t, fleetDB(t), 3)
	key, keyID := subscribe(t, f.nodes[0], "u-revoke", "unlimited", 0)
	for _, nd := range f.nodes {
		if r := invoke(nd.base, key); r.status != 200 {
			t.Fatalf("before the revocation %s answered %d %s %v", nd.name, r.status, r.code, r.err)
		}
	}
	e2etest.AdminJSON(t, "DELETE", f.nodes[0].admin+"/platform/keys/"+keyID, nil, 200, nil)
	revoked := time.Now()
	for _, nd := range f.nodes[1:] {
		var took time.Duration
		for {
			r := invoke(nd.base, key)
			if r.status == 401 {
				took = time.Since(revoked)
				break
			}
			if r.status != 200 {
				t.Fatalf("%s answered %d %s %v", nd.name, r.status, r.code, r.err)
			}
			// Bounded: 1s is the promise, 5s leaves a loaded machine room.
			if time.Since(revoked) > 5*time.Second {
				t.Fatalf("%s still serves a key revoked 5s ago on %s", nd.name, f.nodes[0].name)
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("%s refuses the key %v after its revocation on %s", nd.name, took.Round(time.Millisecond), f.nodes[0].name)
	}
}

// TestFleetJobAcrossNodes: a job started on A is seen on B and completed
// through C; the completion is charged once and every node shows it.
func TestFleetJobAcrossNodes(t *testing.T) {
	f := newFleet(t, fleetDB(t), 3)
	key, _ := subscribe(t, f.nodes[0], "u-job", "quota", 0)
	a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]

	req, _ := http.NewRequest("POST", a.base+"/api/service/"+fleetService+"/endpoint/job/invoke/async", strings.NewReader("job"))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("async invoke on %s: %d %s", a.name, resp.StatusCode, body)
	}
	var acc struct {
		RequestID string `json:"requestId"`
	}
	json.Unmarshal(body, &acc)
	var env envelope
	select {
	case env = <-f.jobs:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend got no job")
	}
	if env.RequestID != acc.RequestID {
		t.Fatalf("backend got job %s, caller %s", env.RequestID, acc.RequestID)
	}

	status := func(nd *node) string {
		t.Helper()
		req, _ := http.NewRequest("GET", nd.base+"/api/requests/"+acc.RequestID+"/status", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st struct {
			Status string `json:"status"`
		}
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || json.Unmarshal(raw, &st) != nil {
			t.Fatalf("status on %s: %d %s", nd.name, resp.StatusCode, raw)
		}
		return st.Status
	}
	if s := status(b); s != "PENDING" {
		t.Errorf("status on %s: %s, want PENDING", b.name, s)
	}

	// The backend completes through C: the callback's path on C's address.
	cb, err := url.Parse(env.CallbackURL)
	if err != nil {
		t.Fatal(err)
	}
	complete := func() int {
		body := fmt.Sprintf(`{"status":"COMPLETED","result":"done","units":1,"timestamp":%d}`, time.Now().Unix())
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		req, _ := http.NewRequest("POST", c.base+cb.Path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Platform-Signature", e2etest.UsageSign(fleetSecret, []byte(body), ts))
		req.Header.Set("X-Platform-Timestamp", ts)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Logf("completion on %s: %d %s", c.name, resp.StatusCode, raw)
		}
		return resp.StatusCode
	}
	if code := complete(); code != 200 {
		t.Fatalf("completion through %s: %d", c.name, code)
	}
	for _, nd := range f.nodes {
		if s := status(nd); s != "COMPLETED" {
			t.Errorf("status on %s after the completion: %s", nd.name, s)
		}
	}
	entries := exportLedger(t, b, "u-job")
	if len(entries) != 1 || entries[0].RequestID != acc.RequestID || entries[0].Source != "completion" {
		t.Errorf("ledger after the completion: %+v, want one completion entry", entries)
	}
}

// fleetDB is a fresh database for a fleet test. Three nodes open 50
// connections or more, past what a server shared with other tests may have
// free, so by default each test gets a private cluster (pgtest.Cluster on
// FLEET_PG_PORT); FLEET_PG_SHARED=1 uses a database on the server of
// PLATFORM_TEST_PG_DSN instead.
func fleetDB(t *testing.T) string {
	if os.Getenv("FLEET_PG_SHARED") == "1" {
		return pgtest.DB(t)
	}
	return pgtest.Cluster(t, pgPort()).DB("fleet")
}

// pgPort is the fleet cluster's port: below the kernel's ephemeral range
// (32768–60999), so that no outgoing connection of another test can hold
// it when the cluster starts.
func pgPort() int { return e2etest.EnvInt("FLEET_PG_PORT", 25441) }
