package platformgw_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/platformgw/gateway/internal/platform"
	_ "github.com/platformgw/gateway/internal/platformgw"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	_ "github.com/platformgw/gateway/internal/usagehandler"
)

// The whole sync invoke chain in process: the real Caddy server (caddytest)
// with the Caddyfile of scripts/bench.sh, a real bbolt store in a temp dir,
// and a loopback stub backend. Every call goes over a keep-alive loopback
// connection through Caddy's HTTP server, platform_usage, platform_gateway
// (key, subscription, rate limit, quota hold, v3 signing), reverse_proxy
// with the platform transport, and the settlement committed to the store
// before the response. The same server has a plain reverse_proxy to the
// same backend under /plain/, the baseline (docs/performance.md).

// chainAllocBudget is the most allocations one serial sync invoke may make
// in this process, counted by TestChainAllocBudget: the server side, the
// store's settlement log and applier (a serial call has an fdatasync of
// its own; the applier's bbolt commits are shared), the stub
// backend's net/http server and the test's raw client (a few). Measured
// on 23 November 2026: 545 a call at commit 733506d, 482 after the request
// path's allocations were trimmed (the request-path trim; plain reverse_proxy on the
// same path: 233, the same in every run); the budget is that + ~5%.
// 317-329 once holds lived in memory and settlements went to the
// settlement log (internal/store/settlelog): budget 350. The count now
// moves a little with the machine's speed: the applier commits to bbolt
// on a timer (every 100 ms, 20 ms until the trim below) whatever the call
// rate, so the slower the calls, the more of its allocations fall to each.
// The runtime refactor took 3 more off (engine.Runtime, the call struct
// holding its observer and the transport's request copy).
// 302 on 23 November 2026 before the settlement path's trim (the charge
// record in one allocation, the account's key on the stack, the settlement
// log's buffers reused, the applier every 100 ms instead of 20), 293-294
// after (plain: 233): budget 310.
// Raise it only with a reason in the commit message (docs/performance.md,
// "Allocation budget").
const chainAllocBudget = 310

const (
	chainSecret = "chain-bench-secret-0123456789abcdef01"
	chainBrand  = "Platform"
)

// Ports of the in-process server, as in the e2e package: E2E_ADMIN_PORT and
// E2E_HTTP_PORT move them off caddytest's defaults.
var (
	chainAdminPort = chainEnvInt("E2E_ADMIN_PORT", 2999)
	chainHTTPPort  = chainEnvInt("E2E_HTTP_PORT", 9080)
)

func chainEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// chain is a running server with a key and a subscription.
type chain struct {
	syncReq, plainReq []byte
	asyncReq          []byte // POST of a job to the async endpoint (202)
	backend           *chainBackend
}

// chainBackend answers every request with the same small JSON body. While
// check is set it also verifies the v3 signature with its own code (the
// setup's first call through the gateway); during the measurement it does
// not, so its own work is the same for both sites.
type chainBackend struct {
	check  atomic.Bool
	unsign atomic.Int64
}

func (b *chainBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if b.check.Load() && !chainSignatureOK(r.Header, body) {
		b.unsign.Add(1)
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{"11"}
	io.WriteString(w, `{"ok":true}`)
}

// chainSignatureOK checks a v3 signature as written out in
// docs/wire-contract.md, not with the signing package:
// Base64(HMAC-SHA256(secret, body + timestamp + context)).
func chainSignatureOK(h http.Header, body []byte) bool {
	x := "X-" + chainBrand + "-"
	g := func(n string) string { return h.Get(x + n) }
	m := hmac.New(sha256.New, []byte(chainSecret))
	m.Write(body)
	m.Write([]byte(g("Timestamp")))
	m.Write([]byte("3" + g("User-ID") + g("Service-Product-ID") + g("Roles") + g("Subscription-Status") +
		g("Billing-Model") + g("Measurement-Type") + g("Unit-Label")))
	want := base64.StdEncoding.EncodeToString(m.Sum(nil))
	return g("Signing-Version") == "3" && hmac.Equal([]byte(want), []byte(g("Signature")))
}

func startChain(tb testing.TB) *chain { return startChainDurability(tb, "sync") }

// startChainDurability is startChain with the store's durability mode
// (docs/reliability.md, §1): "sync" or "write".
func startChainDurability(tb testing.TB, durability string) *chain {
	tb.Helper()
	if testing.Short() {
		tb.Skip("starts a Caddy server")
	}
	dir := tb.TempDir()
	be := &chainBackend{}
	srv := httptest.NewServer(be)
	tb.Cleanup(srv.Close)
	backend := strings.TrimPrefix(srv.URL, "http://")
	admin := fmt.Sprintf("localhost:%d", chainAdminPort)
	unload := func() {
		// A reload never switches stores: leave no config behind that
		// serves another test's store.
		resp, err := http.Post("http://"+admin+"/load", "application/json",
			strings.NewReader(fmt.Sprintf(`{"admin": {"listen": %q}}`, admin)))
		if err == nil {
			resp.Body.Close()
		}
	}
	unload()
	cfg := fmt.Sprintf(`{
	admin %s
	http_port %d
	auto_https off
	grace_period 1s
	log {
		level WARN
	}
	platform {
		store %s/platform.db
		durability %s
		service bench {
			backend http://%s
			secret %s
			endpoint instant {
				methods GET POST
				path /instant
			}
			endpoint job {
				methods POST
				path /job
				async
			}
			product bench {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 1000000000000 per month
				overage block
				rate_limit 10000000/s burst 10000000
			}
		}
	}
}

http://127.0.0.1:%d {
	handle /plain/* {
		reverse_proxy %s {
			transport http {
				keepalive_idle_conns_per_host 128
			}
		}
	}
	handle {
		platform_usage
		platform_gateway
		reverse_proxy {
			dynamic platform
			transport platform {
				keepalive_idle_conns_per_host 128
			}
		}
	}
}
`, admin, chainHTTPPort, dir, durability, backend, chainSecret, chainHTTPPort, backend)
	tester := caddytest.NewTester(tb).WithDefaultOverrides(caddytest.Config{AdminPort: chainAdminPort})
	tester.InitServer(cfg, "caddyfile")
	if tb.Failed() {
		tb.FailNow()
	}
	tb.Cleanup(unload)

	a, err := caddy.ActiveContext().App("platform")
	if err != nil {
		tb.Fatal(err)
	}
	st := a.(*platform.App).DataStore()
	key, hash, err := servicekey.Generate()
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now().UTC()
	if err := st.CreateKey(ctx, store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: "bench-user", Created: now}); err != nil {
		tb.Fatal(err)
	}
	if _, err := st.PutSubscription(ctx, store.Subscription{
		UserID: "bench-user", ServiceID: "bench", ProductID: "bench", Status: "ACTIVE", UpdatedAt: now,
	}); err != nil {
		tb.Fatal(err)
	}

	host := fmt.Sprintf("127.0.0.1:%d", chainHTTPPort)
	c := &chain{
		syncReq: []byte("GET /api/service/bench/endpoint/instant/invoke HTTP/1.1\r\nHost: " + host +
			"\r\nAuthorization: Bearer " + key + "\r\n\r\n"),
		plainReq: []byte("GET /plain/instant HTTP/1.1\r\nHost: " + host + "\r\n\r\n"),
		asyncReq: []byte("POST /api/service/bench/endpoint/job/invoke/async HTTP/1.1\r\nHost: " + host +
			"\r\nAuthorization: Bearer " + key + "\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"q\":1}"),
		backend: be,
	}
	// One signed call through the whole chain, and its ledger entry.
	be.check.Store(true)
	conn := dialRaw(tb, host)
	defer conn.close()
	if st, body := conn.do(c.syncReq); st != http.StatusOK || string(body) != `{"ok":true}` {
		tb.Fatalf("sync invoke answered %d %q", st, body)
	}
	if n := be.unsign.Load(); n != 0 {
		tb.Fatalf("the backend got %d unsigned calls", n)
	}
	be.check.Store(false)
	if st, body := conn.do(c.plainReq); st != http.StatusOK || string(body) != `{"ok":true}` {
		tb.Fatalf("plain reverse_proxy answered %d %q", st, body)
	}
	entries := 0
	if err := st.ScanLedger(ctx, store.LedgerFilter{UserID: "bench-user"}, func(store.LedgerEntry) error {
		entries++
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	if entries != 1 {
		tb.Fatalf("%d ledger entries after one call, want 1", entries)
	}
	return c
}

// BenchmarkChain is one call at a time over one connection (the path's own
// cost; every settlement has a commit of its own) and 64 callers at once
// (what make bench's peak rows do: commits shared by the calls of a batch).
// Run it with -benchmem: allocs/op counts everything the process allocated
// per call, the stub backend and the client included, so compare sync with
// plain.
func BenchmarkChain(b *testing.B) {
	benchmarkChain(b, startChain(b), "sync")
}

// BenchmarkChainWrite is BenchmarkChain with durability write: a
// settlement is acknowledged once written, not fdatasync'd. Compare its
// sync invoke with the plain rows of the same run.
func BenchmarkChainWrite(b *testing.B) {
	benchmarkChain(b, startChainDurability(b, "write"), "write")
}

// BenchmarkChainAsync is BenchmarkChain's rows for async invoke: the job
// created with its hold, the envelope forwarded, the 202 (make bench's
// async row). Compare it with the plain rows of the same run.
func BenchmarkChainAsync(b *testing.B) {
	c := startChain(b)
	benchmarkChainRows(b, []chainRow{{"plain", c.plainReq, http.StatusOK}, {"async", c.asyncReq, http.StatusAccepted}})
}

// chainRow is one request of a chain benchmark and the status it answers.
type chainRow struct {
	name   string
	req    []byte
	status int
}

func benchmarkChain(b *testing.B, c *chain, invoke string) {
	benchmarkChainRows(b, []chainRow{{"plain", c.plainReq, http.StatusOK}, {invoke, c.syncReq, http.StatusOK}})
}

func benchmarkChainRows(b *testing.B, rows []chainRow) {
	host := fmt.Sprintf("127.0.0.1:%d", chainHTTPPort)
	for _, s := range rows {
		b.Run(s.name+"/serial", func(b *testing.B) {
			conn := dialRaw(b, host)
			defer conn.close()
			b.ReportAllocs()
			defer reportChainCPU(b)()
			for b.Loop() {
				if st, _ := conn.do(s.req); st != s.status {
					b.Fatalf("status %d", st)
				}
			}
		})
		b.Run(s.name+"/64callers", func(b *testing.B) {
			b.ReportAllocs()
			defer reportChainCPU(b)()
			b.SetParallelism((64 + caddyProcs() - 1) / caddyProcs())
			b.RunParallel(func(pb *testing.PB) {
				conn := dialRaw(b, host)
				defer conn.close()
				for pb.Next() {
					if st, _ := conn.do(s.req); st != s.status {
						b.Errorf("status %d", st)
						return
					}
				}
			})
		})
	}
}

// reportChainCPU reports the process's CPU time (user + system: server,
// backend and client together) per call as cpu-us/op; compare sync with
// plain.
func reportChainCPU(b *testing.B) func() {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	return func() { b.ReportMetric(float64(cpu()-start)/float64(time.Microsecond)/float64(b.N), "cpu-us/op") }
}

// caddyProcs is GOMAXPROCS: RunParallel starts parallelism times as many
// callers.
func caddyProcs() int { return runtime.GOMAXPROCS(0) }

// TestChainAllocBudget fails when one serial sync invoke allocates more
// than chainAllocBudget times (docs/performance.md, "Allocation budget").
// Allocation counts are deterministic enough for pass/fail; timings are
// not, and none is checked here.
func TestChainAllocBudget(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts (sync.Pool drops items at random); make test and make bench-micro run this without it")
	}
	c := startChain(t)
	conn := dialRaw(t, fmt.Sprintf("127.0.0.1:%d", chainHTTPPort))
	defer conn.close()
	measure := func(req []byte) float64 {
		return testing.AllocsPerRun(300, func() {
			if st, _ := conn.do(req); st != http.StatusOK {
				t.Fatalf("status %d", st)
			}
		})
	}
	plain := measure(c.plainReq)
	sync := measure(c.syncReq)
	t.Logf("allocations per call: plain reverse_proxy %.0f, sync invoke %.0f (budget %d), the gateway's %.0f",
		plain, sync, chainAllocBudget, sync-plain)
	if sync > chainAllocBudget {
		t.Errorf("a sync invoke made %.0f allocations, over the budget of %d (plain reverse_proxy: %.0f); "+
			"find the new ones with go test -bench Chain/sync/serial -memprofile, or raise the budget with a reason",
			sync, chainAllocBudget, plain)
	}
}
