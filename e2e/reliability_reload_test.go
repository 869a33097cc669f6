package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
)

// TestReloadUnderLoad reloads a changed catalog (POST /load, what `caddy
// reload` does) every second for about ten seconds while sync invokes,
// async jobs with their completions, and usage reports run without pause.
// It proves:
//
//   - no request that should succeed fails (a connection reset before the
//     request was read, from the listener swap, is retried as clients do,
//     and counted; the ledger proves no retry was charged twice);
//   - every reload takes effect (the new service answers at once);
//   - the store is never closed or reopened: no lock or timeout error in
//     the log, one file descriptor on platform.db throughout;
//   - nothing leaks: after a settle period the process has as many
//     goroutines and file descriptors as after the same load without
//     reloads (within a small tolerance), and exactly as many of the
//     platform's own background goroutines (store commit loop,
//     maintenance) as before.
func TestReloadUnderLoad(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts file descriptors in /proc/self/fd")
	}
	be := newTestBackend(t, testSecret, "Platform")
	jobs := newUsageBackend(t, usageSecret)
	jobs.jobs = make(chan usageEnvelope, 10000)
	dir := t.TempDir()
	logPath := filepath.Join(dir, "caddy.log")
	config := func(generation int) string {
		// Each generation changes the catalog: a new service, another
		// quota, another price.
		extra := ""
		for i := 1; i <= generation; i++ {
			extra += fmt.Sprintf("\n\t\tservice extra%d {\n\t\t\tbackend %s\n\t\t\tsecret %s\n\t\t\tendpoint echo\n\t\t}", i, be.URL, testSecret)
		}
		return fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	https_port 9443
	grace_period 5s
	log {
		output file %s
	}
	platform {
		store %s/platform.db
		job_ttl 1h
		service reload {
			backend %s
			secret %s
			endpoint echo
			product big {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota %d
			}
		}
		service jobs {
			backend %s
			secret %s
			endpoint job {
				async
				path /job
			}
			product tokens {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				unit token
				price 0.00%d
			}
		}%s
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
`, adminPort, gwPort, logPath, dir, be.URL, testSecret, 1_000_000+generation, jobs.URL, usageSecret, generation+1, extra, gwPort)
	}
	tester := newTester(t)
	tester.InitServer(config(0), "caddyfile")
	g := &gateway{t: t, tester: tester, dir: dir}
	key, _ := g.newKey("u-reload")
	g.subscribe("u-reload", "reload", "big", "ACTIVE")
	g.subscribe("u-reload", "jobs", "tokens", "ACTIVE")

	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	hc := &http.Client{Transport: tr, Timeout: 15 * time.Second}
	load := newReloadLoad(t, hc, key, jobs)

	// Warm up with the same load and no reload, so that connection pools
	// and lazily started goroutines are there before the baseline.
	load.runFor(2 * time.Second)
	baseline := settle(t, tr, nil)
	t.Logf("baseline after the same load without reloads: %s", baseline)

	// The load, with a reload every second.
	reloads := 10
	done := make(chan struct{})
	stopLoad := make(chan struct{})
	go func() {
		defer close(done)
		load.run(stopLoad)
	}()
	// Stopped before the next test starts, even when this one fails
	// half way: its requests must not reach the next test's gateway.
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { close(stopLoad); <-done }) }
	t.Cleanup(stop)
	// The check after each reload dials a connection of its own: an idle
	// keep-alive connection to the server a reload just shut down can be
	// closed under a request sent on it (a client's race, not a refusal),
	// which the load's own requests retry.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 15 * time.Second}
	var reloadTimes []time.Duration
	for gen := 1; gen <= reloads; gen++ {
		time.Sleep(time.Second)
		start := time.Now()
		resp, err := loadClient.Post(fmt.Sprintf("http://localhost:%d/load", adminPort), "text/caddyfile", strings.NewReader(config(gen)))
		if err != nil {
			t.Fatalf("reload %d: %v", gen, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("reload %d: %d %s", gen, resp.StatusCode, b)
		}
		reloadTimes = append(reloadTimes, time.Since(start))
		// The new catalog answers at once: the new service exists (this
		// user has no subscription to it).
		req, err := http.NewRequest("GET", invokeURL(fmt.Sprintf("extra%d", gen), "echo"), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp2, err := fresh.Do(req)
		if err != nil {
			t.Fatalf("after reload %d: %v", gen, err)
		}
		body, _ := io.ReadAll(resp2.Body)
		resp2.Body.Close()
		if resp2.StatusCode != 403 || errorCode(t, resp2, body) != "no_subscription" {
			t.Errorf("after reload %d the new service answers %d %s", gen, resp2.StatusCode, body)
		}
	}
	// The last config serves for a while too, so that its connection pools
	// are filled as the baseline's were.
	time.Sleep(time.Second)
	stop()
	after := settle(t, tr, &baseline)
	t.Logf("after %d reloads under load: %s", reloads, after)
	load.check(t, g)
	t.Logf("reload times %v", reloadTimes)

	// The store stayed open the whole time: nothing about locks, timeouts
	// or a closed store in the log.
	logData, _ := os.ReadFile(logPath)
	for _, bad := range []string{"timeout", "lock", "store closed", "database not open", `"level":"error"`, "panic"} {
		if i := bytes.Index(bytes.ToLower(logData), []byte(strings.ToLower(bad))); i >= 0 {
			line := logData[bytes.LastIndexByte(logData[:i], '\n')+1:]
			if j := bytes.IndexByte(line, '\n'); j >= 0 {
				line = line[:j]
			}
			t.Errorf("the log mentions %q: %s", bad, line)
		}
	}
	if after.dbFDs != 1 || baseline.dbFDs != 1 {
		t.Errorf("descriptors on platform.db: %d before, %d after; want exactly 1", baseline.dbFDs, after.dbFDs)
	}
	for fn, n := range after.own {
		if n > baseline.own[fn] {
			t.Errorf("%d goroutines in %s after the reloads, %d before", n, fn, baseline.own[fn])
		}
	}
	if after.goroutines > baseline.goroutines+goroutineSlack {
		t.Errorf("goroutines: %d before, %d after %d reloads", baseline.goroutines, after.goroutines, reloads)
	}
	if after.fds > baseline.fds+fdSlack {
		t.Errorf("file descriptors: %d before, %d after %d reloads (%v → %v)", baseline.fds, after.fds, reloads, baseline.fdKinds, after.fdKinds)
	}
}

// What may be left over after the settle period without being a leak:
// connections the proxy keeps idle to the backends, and their goroutines.
// A leak per reload would pass these over ten reloads.
const goroutineSlack, fdSlack = 8, 6

// procState is what the process holds at one moment.
type procState struct {
	goroutines int
	own        map[string]int // goroutines parked in the platform's own functions
	fds        int
	fdKinds    map[string]int
	dbFDs      int
}

func (s procState) String() string {
	return fmt.Sprintf("%d goroutines (platform's own: %v), %d file descriptors %v", s.goroutines, s.own, s.fds, s.fdKinds)
}

// ownFrame finds the outermost frame of a goroutine that belongs to this
// module's non-test code.
var ownFrame = regexp.MustCompile(`github\.com/platformgw/gateway/([a-z/]+)\.\(?\*?([A-Za-z]+)\)?\.?([A-Za-z]*)`)

// settle closes idle client connections and waits (up to 15s) for the
// goroutine count to come down to the baseline, then reads the state.
func settle(t *testing.T, tr *http.Transport, baseline *procState) procState {
	t.Helper()
	var s procState
	deadline := time.Now().Add(15 * time.Second)
	for {
		tr.CloseIdleConnections()
		client.CloseIdleConnections()
		time.Sleep(300 * time.Millisecond)
		runtime.GC()
		s = readProcState(t)
		if baseline == nil || s.goroutines <= baseline.goroutines+goroutineSlack && s.fds <= baseline.fds+fdSlack || time.Now().After(deadline) {
			return s
		}
	}
}

func readProcState(t *testing.T) procState {
	t.Helper()
	s := procState{goroutines: runtime.NumGoroutine(), own: map[string]int{}, fdKinds: map[string]int{}}
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("_test.go")) || bytes.Contains(g, []byte("testing.tRunner")) {
			continue
		}
		// The last (outermost) frame of ours names what started it.
		ms := ownFrame.FindAll(g, -1)
		if len(ms) > 0 {
			s.own[string(ms[len(ms)-1])]++
		}
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // the directory's own descriptor, closed by now
		}
		s.fds++
		kind := target
		switch {
		case strings.HasSuffix(target, "platform.db"):
			s.dbFDs++
			kind = "platform.db"
		case strings.HasPrefix(target, "socket:"):
			kind = "socket"
			if os.Getenv("RELOAD_DEBUG") != "" {
				kind = "socket " + socketPorts()[target]
			}
		case strings.HasPrefix(target, "pipe:"):
			kind = "pipe"
		case strings.HasPrefix(target, "anon_inode:"):
			kind = target
		default:
			kind = filepath.Base(target)
		}
		s.fdKinds[kind]++
	}
	return s
}

// reloadLoad is the traffic kept running across reloads.
type reloadLoad struct {
	t    *testing.T
	hc   *http.Client
	key  string
	jobs *usageBackend

	invokes200, resets, failures atomic.Int64
	mu                           sync.Mutex
	reports                      map[string]bool // Idempotency-Key answered 200
	jobs202                      map[string]bool
	completed                    map[string]billing.Units
	seq                          atomic.Int64
	failed                       []string
	envelopes                    sync.Map // job id -> usageEnvelope, as the backend got them
}

func newReloadLoad(t *testing.T, hc *http.Client, key string, jobs *usageBackend) *reloadLoad {
	return &reloadLoad{t: t, hc: hc, key: key, jobs: jobs,
		reports: map[string]bool{}, jobs202: map[string]bool{}, completed: map[string]billing.Units{}}
}

// do sends a request, retrying a connection error (nothing was answered)
// up to 5 times; a retried POST is safe here because each one is
// idempotent (a report's Idempotency-Key, the same completion) or checked
// against the store afterwards (an async invoke).
func (l *reloadLoad) do(method, url, body string, hdr ...string) (int, []byte) {
	for try := 0; ; try++ {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := l.hc.Do(req)
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				return resp.StatusCode, b
			}
		}
		if try == 5 {
			return 0, []byte(err.Error())
		}
		l.resets.Add(1)
	}
}

func (l *reloadLoad) fail(what string, status int, body []byte) {
	l.failures.Add(1)
	l.mu.Lock()
	if len(l.failed) < 10 {
		l.failed = append(l.failed, fmt.Sprintf("%s: %d %s", what, status, body))
	}
	l.mu.Unlock()
}

// runFor drives 6 invokers, 2 reporters and 2 async workers (start a job,
// complete it) for d.
func (l *reloadLoad) runFor(d time.Duration) {
	stop := make(chan struct{})
	time.AfterFunc(d, func() { close(stop) })
	l.run(stop)
}

// run drives the load until stop is closed.
func (l *reloadLoad) run(stop <-chan struct{}) {
	var wg sync.WaitGroup
	workersDone := make(chan struct{})
	dispatched := make(chan struct{})
	defer func() { <-dispatched }()
	go func() {
		defer close(dispatched)
		for {
			select {
			case env := <-l.jobs.jobs:
				l.envelopes.Store(env.RequestID, env)
			case <-workersDone:
				return
			}
		}
	}()
	defer close(workersDone)
	worker := func(fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				fn()
			}
		}()
	}
	auth := []string{"Authorization", "Bearer " + l.key}
	for range 6 {
		worker(func() {
			status, body := l.do("GET", invokeURL("reload", "echo"), "", auth...)
			if status != 200 {
				l.fail("invoke", status, body)
				return
			}
			l.invokes200.Add(1)
		})
	}
	for range 2 {
		worker(func() {
			idem := "reload-" + strconv.FormatInt(l.seq.Add(1), 10)
			ts := strconv.FormatInt(time.Now().Unix(), 10)
			body := usageReportBody("u-reload", "jobs", "2", ts)
			status, rb := l.do("POST", usageReportURL, body, "X-Platform-Signature", e2etest.UsageSign(usageSecret, []byte(body), ts),
				"X-Platform-Timestamp", ts, "Idempotency-Key", idem, "Content-Type", "application/json")
			if status != 200 {
				l.fail("report", status, rb)
				return
			}
			l.mu.Lock()
			l.reports[idem] = true
			l.mu.Unlock()
		})
	}
	for range 2 {
		worker(func() {
			status, body := l.do("POST", asyncURL("/api", "jobs", "job"), "work", auth...)
			if status != 202 {
				l.fail("async invoke", status, body)
				return
			}
			var acc usageAccepted
			json.Unmarshal(body, &acc)
			l.mu.Lock()
			l.jobs202[acc.RequestID] = true
			l.mu.Unlock()
			var env usageEnvelope
			for waited := time.Duration(0); ; waited += 10 * time.Millisecond {
				if v, ok := l.envelopes.Load(acc.RequestID); ok {
					env = v.(usageEnvelope)
					break
				}
				if waited > 5*time.Second {
					l.fail("async: backend never got job "+acc.RequestID, 0, nil)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			callback, query, _ := strings.Cut(env.CallbackURL, "?")
			q, _ := url.ParseQuery(query)
			ts := q.Get("timestamp") // as SDKs do: sign with the URL's timestamp
			done := fmt.Sprintf(`{"status":"COMPLETED","units":3,"timestamp":%s}`, ts)
			status, rb := l.do("POST", callback, done, "X-Platform-Signature", e2etest.UsageSign(usageSecret, []byte(done), ts),
				"X-Platform-Timestamp", ts, "Content-Type", "application/json")
			if status != 200 {
				l.fail("completion", status, rb)
				return
			}
			l.mu.Lock()
			l.completed[acc.RequestID] = billing.Whole(3)
			l.mu.Unlock()
		})
	}
	wg.Wait()
}

// check compares what was answered with the ledger.
func (l *reloadLoad) check(t *testing.T, g *gateway) {
	t.Helper()
	if n := l.failures.Load(); n > 0 {
		t.Errorf("%d requests that should have succeeded failed, e.g. %v", n, l.failed)
	}
	var invoked billing.Units
	reports := map[string]int{}
	completions := map[string]int{}
	for _, e := range g.ledger("u-reload") {
		switch e.Source {
		case "gateway":
			invoked += e.Units
		case "report":
			reports[e.IdempotencyKey]++
		case "completion":
			completions[e.RequestID]++
		}
	}
	if invoked != billing.Whole(l.invokes200.Load()) {
		t.Errorf("ledger has %s invoked units, %d invokes were answered 200", invoked, l.invokes200.Load())
	}
	for k := range l.reports {
		if reports[k] != 1 {
			t.Errorf("report %s in the ledger %d times", k, reports[k])
		}
	}
	for id := range l.completed {
		if completions[id] != 1 {
			t.Errorf("completion of %s in the ledger %d times", id, completions[id])
		}
	}
	keys := make([]string, 0, len(reports))
	for k, n := range reports {
		if n != 1 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if len(keys) > 0 {
		t.Errorf("reports counted more than once: %v", keys)
	}
	t.Logf("answered: %d invokes, %d reports, %d jobs started, %d completed; %d connection resets retried; 0 failures",
		l.invokes200.Load(), len(l.reports), len(l.jobs202), len(l.completed), l.resets.Load())
}

// socketPorts maps socket inodes to "local->remote" ports (debug aid).
func socketPorts() map[string]string {
	out := map[string]string{}
	for _, f := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 {
				continue
			}
			port := func(a string) string {
				_, p, _ := strings.Cut(a, ":")
				n, _ := strconv.ParseUint(p, 16, 32)
				return strconv.FormatUint(n, 10)
			}
			out["socket:["+fs[9]+"]"] = port(fs[1]) + "->" + port(fs[2]) + " st" + fs[3]
		}
	}
	return out
}
