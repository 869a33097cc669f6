package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// The crash test runs the real binary as a subprocess, drives sync and
// async invokes, usage reports and job completions at it from many
// goroutines, kills it with SIGKILL at a random moment, replays the
// settlement log the dead process left onto its bbolt file (what the next
// start does), and judges the file with an independent reader:
//
//   - every unit acknowledged (a 2xx to a caller, a 200 to a backend) is
//     in the ledger, exactly once;
//   - every job acknowledged with a 202 is in the store;
//   - per subscription, the counters equal the ledger's sums (units and
//     spend), the prepaid balance is its top-up less the ledger's costs,
//     and what the counters hold equals the stored reservations.
//
// Then it restarts the binary on the same file and does it again. It runs
// in both durability modes (sync and write). Reports
// and completions that got no answer are retried after the restart with
// the same Idempotency-Key / the same body, as a backend would, and must
// still count once. Finally it restarts, stops gracefully and checks that
// only the holds of open jobs are left.

const (
	crashSecret  = "crash-secret-crash-secret-000001"
	crashService = "crash"
)

// crashAcks is everything the gateway acknowledged, across rounds.
type crashAcks struct {
	mu          sync.Mutex
	invokes     map[string]billing.Units // platform request id -> units (sync 2xx)
	jobs        map[string]bool          // job id acknowledged with a 202
	reports     map[string]billing.Units // Idempotency-Key -> units (200)
	completions map[string]billing.Units // job id -> units (200)
	// retries carry what got no answer into the next round.
	pendingReports     []crashReport
	pendingCompletions []crashJob
	attempts           map[string]int
}

type crashReport struct {
	key, user string
	units     billing.Units
}

type crashJob struct {
	id, callback string
	units        billing.Units
}

func (a *crashAcks) count(kind string) {
	a.mu.Lock()
	a.attempts[kind]++
	a.mu.Unlock()
}

func crashCatalog(backend string) string {
	return fmt.Sprintf(`
		service %s {
			backend %s
			secret {env.CRASH_SECRET}
			endpoint echo {
				methods GET POST
				path /echo
			}
			endpoint job {
				async
				methods POST
				path /job
			}
			product quota {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100000000
			}
			product prepaid {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 0.001
			}
			product postpaid {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				unit request
				price 0.002
			}
		}`, crashService, backend)
}

// crashBackend answers sync calls with 200 and takes async jobs with 202,
// handing each job's callback URL to the completers.
func crashBackend(t *testing.T, jobs chan<- crashJob) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/job" {
			var env struct {
				RequestID   string `json:"request_id"`
				CallbackURL string `json:"callback_url"`
			}
			if json.Unmarshal(body, &env) != nil || env.RequestID == "" {
				http.Error(w, "not an envelope", 400)
				return
			}
			select {
			case jobs <- crashJob{id: env.RequestID, callback: env.CallbackURL}:
			default: // completers are behind: the job stays open, holding its unit
			}
			w.WriteHeader(http.StatusAccepted)
			return
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestCrashKill9 runs in both durability modes: sync and write both
// promise that a settlement acknowledged survives kill -9 of the gateway.
func TestCrashKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the real binary")
	}
	bin := e2etest.GatewayBinary(t)
	for _, mode := range []string{"sync", "write"} {
		t.Run(mode, func(t *testing.T) { crashKill9(t, bin, mode) })
	}
}

func crashKill9(t *testing.T, bin, durability string) {
	dir := t.TempDir()
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("CRASH_SEED"), 10, 64); err == nil {
		seed = s
	}
	rounds := e2etest.EnvInt("CRASH_ROUNDS", 6)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	t.Logf("seed %d (CRASH_SEED reproduces the kill points), %d rounds", seed, rounds)

	jobs := make(chan crashJob, 100000)
	be := crashBackend(t, jobs)
	adminPort, httpPort := e2etest.FreePort(t), e2etest.FreePort(t)
	cfg := filepath.Join(dir, "Caddyfile")
	dbPath := filepath.Join(dir, "platform.db")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`{
	admin 127.0.0.1:%d
	http_port %d
	https_port %d
	auto_https off
	grace_period 2s
	platform {
		store %s
		durability %s
%s
	}
}
:%d {
	bind 127.0.0.1
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform
	}
}
`, adminPort, httpPort, e2etest.FreePort(t), dbPath, durability, crashCatalog(be.URL), httpPort)), 0o644)
	logPath := filepath.Join(dir, "caddy.log")
	// Every round's process appends to one log, grepped for secrets at
	// the end.
	run := e2etest.Run{Name: "the binary", Bin: bin, Config: cfg, Home: dir, Env: []string{"CRASH_SECRET=" + crashSecret},
		Log: logPath, AdminPort: adminPort, HTTPPort: httpPort}

	acks := &crashAcks{invokes: map[string]billing.Units{}, jobs: map[string]bool{},
		reports: map[string]billing.Units{}, completions: map[string]billing.Units{}, attempts: map[string]int{}}
	products := map[string]string{"u-quota": "quota", "u-prepaid": "prepaid", "u-postpaid": "postpaid"}
	users := []string{"u-quota", "u-prepaid", "u-postpaid"}
	const topUp = 1_000_000
	keys := map[string]string{}
	var signatures []string
	var sigMu sync.Mutex

	start := time.Now()
	var loadTime time.Duration
	for round := 0; round < rounds; round++ {
		p := e2etest.Start(t, run)
		if round == 0 {
			for _, u := range users {
				var k struct {
					Key string `json:"key"`
				}
				e2etest.AdminJSON(t, "POST", p.Admin+"/platform/keys", map[string]any{"userId": u}, 201, &k)
				keys[u] = k.Key
				e2etest.AdminJSON(t, "PUT", p.Admin+"/platform/subscriptions/"+u+"/"+crashService,
					map[string]any{"productId": products[u]}, 200, nil)
			}
			e2etest.AdminJSON(t, "POST", p.Admin+"/platform/subscriptions/u-prepaid/"+crashService+"/credits",
				map[string]any{"amount": topUp}, 200, nil)
		}
		killAfter := time.Duration(300+rng.IntN(2200)) * time.Millisecond
		before := acks.snapshotCounts()
		loadStart := time.Now()
		stopReads := readOutcomesMeanwhile(p.Admin) // crash_outcomes_test.go: flushes under load, up to the kill
		runCrashLoad(t, p, acks, keys, users, jobs, killAfter, round, &signatures, &sigMu)
		stopReads()
		loadTime += time.Since(loadStart)
		after := acks.snapshotCounts()
		replaySettlements(t, dbPath)
		sf := readStoreFile(t, dbPath)
		settledUnacked := checkCrashStore(t, sf, acks, products, topUp)
		t.Logf("round %d: killed after %v; acknowledged this round: %d invokes, %d jobs, %d reports, %d completions; "+
			"ledger %d entries, %d settled calls never acknowledged so far (in flight at a kill), %d holds left by the crash",
			round, killAfter, after[0]-before[0], after[1]-before[1], after[2]-before[2], after[3]-before[3],
			len(sf.Ledger), settledUnacked, len(sf.Reservations))
		if t.Failed() {
			t.Fatalf("store inconsistent after kill -9 in round %d (seed %d); log in %s", round, seed, logPath)
		}
	}

	// A last start releases the holds of calls the kills cut short; a
	// graceful stop must then leave only the holds of open jobs.
	p := e2etest.Start(t, run)
	resp, body := call(t, "GET", p.Base+"/api/service/"+crashService+"/endpoint/echo/invoke", keys["u-quota"], "")
	if resp.StatusCode != 200 {
		t.Errorf("after the last restart: %d %s", resp.StatusCode, body)
	} else {
		acks.invokes[resp.Header.Get("X-Platform-Request-ID")] = billing.Whole(1)
	}
	p.Stop(t, 20*time.Second)
	sf := readStoreFile(t, dbPath)
	checkCrashStore(t, sf, acks, products, topUp)
	openJobs := 0
	for _, j := range sf.Jobs {
		if j.open() {
			openJobs++
		}
	}
	for _, r := range sf.Reservations {
		if j, ok := sf.Jobs[r.JobID]; r.JobID == "" || !ok || !j.open() {
			t.Errorf("a hold outlived a restart and a graceful stop: %+v", r)
		}
	}
	if len(sf.Reservations) != openJobs {
		t.Errorf("%d holds for %d open jobs", len(sf.Reservations), openJobs)
	}
	acks.mu.Lock()
	sent := acks.attempts["invoke"] + 1 // and the last call
	acks.mu.Unlock()
	checkCrashOutcomes(t, dbPath, sent) // crash_outcomes_test.go

	// Nothing secret in the log of the default configuration.
	needles := []string{crashSecret}
	for _, k := range keys {
		needles = append(needles, k, k[len("psk_"):])
	}
	needles = append(needles, signatures...)
	if found := secretsIn(t, logPath, needles); len(found) > 0 {
		t.Errorf("the server log holds %d keys, secrets or signatures, e.g. %q", len(found), found[0])
	}
	c := acks.snapshotCounts()
	t.Logf("total: %d rounds in %v (%v under load); acknowledged %d invokes, %d jobs, %d reports, %d completions; "+
		"attempts %v; ledger %d entries; %d jobs still open holding their unit",
		rounds, time.Since(start).Round(time.Millisecond), loadTime.Round(time.Millisecond),
		c[0], c[1], c[2], c[3], acks.attempts, len(sf.Ledger), openJobs)
}

// replaySettlements brings the store file left by a kill up to date with
// its settlement log, as the next start does (boltstore.Open replays the
// log; Close applies it and removes it), so that the independent reader
// judges everything the dead process acknowledged.
func replaySettlements(t *testing.T, dbPath string) {
	t.Helper()
	s, err := boltstore.Open(dbPath)
	if err != nil {
		t.Fatalf("replaying the settlement log left by the kill: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if segs, _ := filepath.Glob(dbPath + ".*.settle"); len(segs) != 0 {
		t.Fatalf("settlement log segments left after a replay and a clean close: %v", segs)
	}
}

func (a *crashAcks) snapshotCounts() [4]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return [4]int{len(a.invokes), len(a.jobs), len(a.reports), len(a.completions)}
}

// runCrashLoad drives load at p until killAfter, then kills p and waits
// for every worker to notice.
func runCrashLoad(t *testing.T, p *e2etest.Process, acks *crashAcks, keys map[string]string, users []string,
	jobs chan crashJob, killAfter time.Duration, round int, signatures *[]string, sigMu *sync.Mutex) {
	tr := &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 256}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var dead atomic.Bool
	var wg sync.WaitGroup
	worker := func(fn func(n int) bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !dead.Load(); n++ {
				if !fn(n) {
					return
				}
			}
		}()
	}
	post := func(method, u, key, body string, hdr ...string) (*http.Response, []byte, error) {
		req, _ := http.NewRequest(method, u, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}
	sign := func(body string) (string, string) {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		sig := e2etest.UsageSign(crashSecret, []byte(body), ts)
		sigMu.Lock()
		if len(*signatures) < 2000 {
			*signatures = append(*signatures, sig)
		}
		sigMu.Unlock()
		return sig, ts
	}
	// A refusal the load should never meet is a bug, not a crash effect.
	unexpected := func(what string, resp *http.Response, body []byte) {
		if !dead.Load() {
			t.Errorf("%s: unexpected %d %s", what, resp.StatusCode, body)
		}
	}

	// Sync invokes: 48 callers across the three billing models.
	for w := range 48 {
		user := users[w%len(users)]
		worker(func(n int) bool {
			acks.count("invoke")
			resp, body, err := post("POST", p.Base+"/api/service/"+crashService+"/endpoint/echo/invoke", keys[user], "x")
			if err != nil {
				return !dead.Load()
			}
			if resp.StatusCode/100 == 2 {
				acks.mu.Lock()
				acks.invokes[resp.Header.Get("X-Platform-Request-ID")] = billing.Whole(1)
				acks.mu.Unlock()
			} else {
				unexpected("invoke", resp, body)
			}
			return true
		})
	}
	// Async invokes: 8 callers.
	for w := range 8 {
		user := users[w%2] // quota and prepaid
		worker(func(n int) bool {
			acks.count("async")
			resp, body, err := post("POST", p.Base+"/api/service/"+crashService+"/endpoint/job/invoke/async", keys[user], "job")
			if err != nil {
				return !dead.Load()
			}
			if resp.StatusCode == http.StatusAccepted {
				var acc struct {
					RequestID string `json:"requestId"`
				}
				json.Unmarshal(body, &acc)
				acks.mu.Lock()
				acks.jobs[acc.RequestID] = true
				acks.mu.Unlock()
			} else {
				unexpected("async invoke", resp, body)
			}
			return true
		})
	}
	// Completers: 8 backends finishing jobs, retrying the unanswered ones
	// of earlier rounds first with the same body.
	acks.mu.Lock()
	retryJobs := acks.pendingCompletions
	acks.pendingCompletions = nil
	retryReports := acks.pendingReports
	acks.pendingReports = nil
	acks.mu.Unlock()
	var retryMu sync.Mutex
	nextJob := func() (crashJob, bool) {
		retryMu.Lock()
		if len(retryJobs) > 0 {
			j := retryJobs[len(retryJobs)-1]
			retryJobs = retryJobs[:len(retryJobs)-1]
			retryMu.Unlock()
			return j, true
		}
		retryMu.Unlock()
		select {
		case j := <-jobs:
			j.units = billing.Units(1+rand.IntN(5)) * billing.Scale / 2 // 0.5 to 2.5
			return j, true
		case <-time.After(20 * time.Millisecond):
			return crashJob{}, false
		}
	}
	for range 8 {
		worker(func(n int) bool {
			j, ok := nextJob()
			if !ok {
				return true
			}
			acks.count("completion")
			body := fmt.Sprintf(`{"status":"COMPLETED","result":"done","units":%s,"timestamp":%d}`, j.units, time.Now().Unix())
			sig, ts := sign(body)
			resp, rb, err := post("POST", j.callback, "", body, "X-Platform-Signature", sig, "X-Platform-Timestamp", ts,
				"Content-Type", "application/json")
			if err != nil || resp.StatusCode == http.StatusConflict {
				// No answer: the backend retries later. A 409 can only be
				// an earlier attempt of this completion (with another
				// timestamp in its body): retried, it must get 200.
				acks.mu.Lock()
				acks.pendingCompletions = append(acks.pendingCompletions, j)
				acks.mu.Unlock()
				return err == nil || !dead.Load()
			}
			if resp.StatusCode == 200 {
				acks.mu.Lock()
				acks.completions[j.id] = j.units
				acks.mu.Unlock()
			} else {
				unexpected("completion", resp, rb)
			}
			return true
		})
	}
	// Reporters: 8 non-proxied backends reporting usage with an
	// Idempotency-Key, retrying unanswered reports after the restart.
	for w := range 8 {
		user := users[w%len(users)]
		worker(func(n int) bool {
			var rep crashReport
			retryMu.Lock()
			if len(retryReports) > 0 {
				rep = retryReports[len(retryReports)-1]
				retryReports = retryReports[:len(retryReports)-1]
			}
			retryMu.Unlock()
			if rep.key == "" {
				rep = crashReport{key: fmt.Sprintf("r%d-w%d-%d", round, w, n), user: user,
					units: billing.Units(1+n%4) * billing.Scale / 4}
			}
			acks.count("report")
			body := fmt.Sprintf(`{"userId":%q,"serviceId":%q,"unitsUsed":"%s","timestamp":%q}`,
				rep.user, crashService, rep.units, time.Now().UTC().Format(time.RFC3339Nano))
			sig, ts := sign(body)
			resp, rb, err := post("POST", p.Base+"/api/usage/report", "", body, "X-Platform-Signature", sig,
				"X-Platform-Timestamp", ts, "Idempotency-Key", rep.key, "Content-Type", "application/json")
			if err != nil {
				acks.mu.Lock()
				acks.pendingReports = append(acks.pendingReports, rep)
				acks.mu.Unlock()
				return !dead.Load()
			}
			if resp.StatusCode == 200 {
				acks.mu.Lock()
				acks.reports[rep.key] = rep.units
				acks.mu.Unlock()
			} else {
				unexpected("report", resp, rb)
			}
			return true
		})
	}

	time.Sleep(killAfter)
	dead.Store(true)
	p.Kill()
	wg.Wait()
	// Jobs the backend took but nobody completed stay open; completing
	// them in a later round shows jobs survive a crash.
	acks.mu.Lock()
	acks.pendingCompletions = append(acks.pendingCompletions, retryJobs...)
	acks.pendingReports = append(acks.pendingReports, retryReports...)
	acks.mu.Unlock()
}

// checkCrashStore judges the file a killed process left; it returns how
// many sync calls were settled but never acknowledged (the caller's answer
// was cut by the kill), which is allowed: durability promises at least
// what was acknowledged, and the ledger stays consistent with the counters.
func checkCrashStore(t *testing.T, sf storeFile, acks *crashAcks, products map[string]string, topUp int64) int {
	t.Helper()
	acks.mu.Lock()
	defer acks.mu.Unlock()
	byRequest := map[string][]fileLedgerEntry{}
	byIdem := map[string][]fileLedgerEntry{}
	units := map[string]billing.Units{}
	spend := map[string]billing.Units{}
	for _, e := range sf.Ledger {
		switch e.Source {
		case "gateway", "completion":
			byRequest[e.Source+"/"+e.RequestID] = append(byRequest[e.Source+"/"+e.RequestID], e)
		case "report":
			byIdem[e.IdempotencyKey] = append(byIdem[e.IdempotencyKey], e)
		}
		if e.ProductID != "" {
			units[accountKey(e.UserID, e.ServiceID)] += e.Units
			spend[accountKey(e.UserID, e.ServiceID)] += e.Cost
		}
	}
	for key, es := range byRequest {
		if len(es) != 1 {
			t.Errorf("%s metered %d times", key, len(es))
		}
	}
	for key, es := range byIdem {
		if key == "" || len(es) != 1 {
			t.Errorf("report %q metered %d times", key, len(es))
		}
	}
	missing := 0
	for id, u := range acks.invokes {
		es := byRequest["gateway/"+id]
		if len(es) == 0 || es[0].Units != u {
			missing++
			if missing <= 5 {
				t.Errorf("acknowledged invoke %s (%s units) not in the ledger: %+v", id, u, es)
			}
		}
	}
	for key, u := range acks.reports {
		es := byIdem[key]
		if len(es) == 0 || es[0].Units != u {
			missing++
			if missing <= 5 {
				t.Errorf("acknowledged report %s (%s units) not in the ledger: %+v", key, u, es)
			}
		}
	}
	for id, u := range acks.completions {
		es := byRequest["completion/"+id]
		if len(es) == 0 || es[0].Units != u || sf.Jobs[id].Status != "COMPLETED" {
			missing++
			if missing <= 5 {
				t.Errorf("acknowledged completion %s (%s units) not in the ledger: %+v, job %+v", id, u, es, sf.Jobs[id])
			}
		}
	}
	for id := range acks.jobs {
		if _, ok := sf.Jobs[id]; !ok {
			missing++
			if missing <= 5 {
				t.Errorf("acknowledged job %s not in the store", id)
			}
		}
	}
	if missing > 0 {
		t.Errorf("%d acknowledged items lost", missing)
	}

	// Counters against the ledger and the holds.
	held := map[string]billing.Units{}
	heldCost := map[string]billing.Units{}
	for _, r := range sf.Reservations {
		held[accountKey(r.UserID, r.ServiceID)] += r.Decision.Units
		heldCost[accountKey(r.UserID, r.ServiceID)] += r.Decision.Cost
		if r.JobID != "" {
			if j, ok := sf.Jobs[r.JobID]; !ok || !j.open() {
				t.Errorf("a hold names job %s, which is %+v", r.JobID, j)
			}
		}
	}
	for user, product := range products {
		k := accountKey(user, crashService)
		c := sf.Counters[k]
		if c.Used != units[k] || c.Spend != spend[k] {
			t.Errorf("%s: counters used %s spend %s, ledger %s units %s spend", user, c.Used, c.Spend, units[k], spend[k])
		}
		if c.Reserved != held[k] || c.ReservedSpend != heldCost[k] {
			t.Errorf("%s: counters reserve %s (spend %s), the stored holds %s (%s)", user, c.Reserved, c.ReservedSpend, held[k], heldCost[k])
		}
		if product == "prepaid" {
			sub := sf.Subs[k]
			if sub.Credits != billing.Whole(topUp)-spend[k] || sub.CreditsHeld != heldCost[k] {
				t.Errorf("%s: credits %s held %s; top-up less ledger costs %s, holds %s",
					user, sub.Credits, sub.CreditsHeld, billing.Whole(topUp)-spend[k], heldCost[k])
			}
		}
	}
	// Open jobs each hold their unit, named both ways.
	for _, j := range sf.Jobs {
		if j.open() && !j.Free && j.ReservationID == "" {
			t.Errorf("open job %s holds nothing", j.ID)
		}
	}
	settled := 0
	for key := range byRequest {
		if id, ok := strings.CutPrefix(key, "gateway/"); ok {
			if _, acked := acks.invokes[id]; !acked {
				settled++
			}
		}
	}
	return settled
}
