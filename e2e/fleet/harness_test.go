// Package fleet runs the built gateway binary as a fleet: several
// processes on loopback sharing one PostgreSQL store (store postgres in
// the platform options, docs/fleet.md), with callers spread over the
// nodes. It judges what the fleet promises: limits exact across nodes,
// nothing acknowledged lost when a node dies, no wrong charge while
// PostgreSQL restarts, revocations and jobs visible on every node.
//
// Ports: node i (0, 1, 2) serves HTTP on FLEET_HTTP_PORT+i (8402 by
// default) and its admin API on FLEET_ADMIN_PORT+i (2402); the private
// PostgreSQL cluster of the restart test listens on FLEET_PG_PORT (25441),
// the failover test's standby on the port after it.
package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/pgtest"
)

const (
	fleetSecret  = "fleet-secret-fleet-secret-000001"
	fleetService = "fleet"
)

// node is one gateway process of the fleet.
type node struct {
	name      string
	admin     string
	base      string
	cfg       string
	log       string
	adminPort int
	httpPort  int
	proc      *e2etest.Process // the run in progress, or the last
}

// fleet is N nodes on one database, a backend they all forward to, and
// the catalog they share.
type fleet struct {
	t       *testing.T
	bin     string
	dir     string
	dsn     string
	nodes   []*node
	backend *httptest.Server
	// jobs receives the envelope of every async job the backend takes.
	jobs chan envelope
	// leaseTTL and leaseMax tune every node's store postgres block.
	leaseTTL string
	leaseMax string
	// settle is every node's settle mode (log or commit); empty: the
	// default (log).
	settle string
	// payments, when set, is a payments block every node's platform
	// block gets, with the webhook endpoint at /stripe/webhook and a
	// product "paid" (USD) its price lines may name.
	payments string
	// products, with payments, are more product blocks of the service
	// (a prepaid one with a currency, whose credits the payments block
	// sells in packs).
	products string

	// echoed are the request ids of the sync calls the backend answered
	// (served calls, whatever their callers were told).
	echoMu sync.Mutex
	echoed map[string]int
	// gate, when set, holds the sync calls the backend takes until it is
	// closed; arrived counts the sync calls the backend took.
	gate    atomic.Pointer[chan struct{}]
	arrived atomic.Int64
}

// served is what echoed holds: the calls the backend served, by request
// id.
func (f *fleet) served() map[string]int {
	f.echoMu.Lock()
	defer f.echoMu.Unlock()
	out := make(map[string]int, len(f.echoed))
	for id := range f.echoed {
		out[id] = 0
	}
	return out
}

type envelope struct {
	RequestID   string `json:"request_id"`
	CallbackURL string `json:"callback_url"`
	ProgressURL string `json:"progress_url"`
}

// catalog is the service every node serves: one endpoint each for sync
// and async calls, and a product of each hard limit the fleet must keep
// exact (100 units each) next to an unlimited one.
func catalog(backend string) string {
	return fmt.Sprintf(`
		service %s {
			backend %s
			secret {env.FLEET_SECRET}
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
				quota 100
			}
			product prepaid {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 1
			}
			product capped {
				billing USAGE_INSTANT
				measurement PER_REQUEST
				unit request
				price 1
				spending_cap 100
			}
			product unlimited {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
			}
		}`, fleetService, backend)
}

// newFleet starts n nodes on the database at dsn, after opts changed the
// fleet's settings.
func newFleet(t *testing.T, dsn string, n int, opts ...func(*fleet)) *fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the real binary as a fleet")
	}
	f := &fleet{t: t, bin: e2etest.GatewayBinary(t), dir: t.TempDir(), dsn: dsn, jobs: make(chan envelope, 1000),
		echoed: map[string]int{}, leaseTTL: "5s", leaseMax: "10"}
	for _, o := range opts {
		o(f)
	}
	f.backend = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/job" {
			var env envelope
			if json.Unmarshal(body, &env) != nil || env.RequestID == "" {
				http.Error(w, "not an envelope", http.StatusBadRequest)
				return
			}
			select {
			case f.jobs <- env:
			default:
			}
			w.WriteHeader(http.StatusAccepted)
			return
		}
		f.arrived.Add(1)
		if g := f.gate.Load(); g != nil {
			<-*g
		}
		if id := r.Header.Get("X-Platform-Request-ID"); id != "" {
			f.echoMu.Lock()
			f.echoed[id]++
			f.echoMu.Unlock()
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(f.backend.Close)
	httpBase, adminBase := e2etest.EnvInt("FLEET_HTTP_PORT", 8402), e2etest.EnvInt("FLEET_ADMIN_PORT", 2402)
	for i := range n {
		nd := &node{name: fmt.Sprintf("node-%c", 'a'+i), httpPort: httpBase + i, adminPort: adminBase + i}
		nd.admin = fmt.Sprintf("http://127.0.0.1:%d", nd.adminPort)
		nd.base = fmt.Sprintf("http://127.0.0.1:%d", nd.httpPort)
		nd.cfg = filepath.Join(f.dir, nd.name+".Caddyfile")
		nd.log = filepath.Join(f.dir, nd.name+".log")
		f.nodes = append(f.nodes, nd)
	}
	// Registered before the nodes' own cleanup, so it runs after they
	// are gone and their logs are complete.
	t.Cleanup(func() {
		if t.Failed() {
			for _, nd := range f.nodes {
				t.Logf("%s log (end):\n%s", nd.name, e2etest.Tail(nd.log))
			}
		}
	})
	for _, nd := range f.nodes {
		f.start(nd)
	}
	return f
}

func (f *fleet) caddyfile(nd *node) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	http_port %d
	https_port %d
	auto_https off
	grace_period 2s
	platform {
		store postgres {
			dsn "%s"
			node_id %s
			lease_ttl %s
			lease_max %s%s
		}
%s
	}
}
:%d {
	bind 127.0.0.1
	%s
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform
	}
}
`, nd.adminPort, nd.httpPort, e2etest.FreePort(f.t), f.dsn, nd.name, f.leaseTTL, f.leaseMax, f.settleLine(), f.catalogAndPayments(), nd.httpPort, f.webhookRoute())
}

// catalogAndPayments is the catalog, with the paid product and the
// payments block when the fleet takes payments.
func (f *fleet) catalogAndPayments() string {
	c := catalog(f.backend.URL)
	if f.payments == "" {
		return c
	}
	paid := "\t\t\tproduct paid {\n\t\t\t\tbilling SUBSCRIPTION\n\t\t\t\tmeasurement PER_REQUEST\n\t\t\t\tunit request\n\t\t\t\tcurrency USD\n\t\t\t}\n\t\t}"
	return strings.TrimSuffix(c, "}") + f.products + strings.TrimPrefix(paid, "") + "\n" + f.payments
}

func (f *fleet) webhookRoute() string {
	if f.payments == "" {
		return ""
	}
	return "handle /stripe/webhook {\n\t\tplatform_stripe_webhook\n\t}"
}

func (f *fleet) settleLine() string {
	if f.settle == "" {
		return ""
	}
	return "\n\t\t\tsettle " + f.settle
}

// start starts (or restarts) a node and waits until it serves.
func (f *fleet) start(nd *node) {
	t := f.t
	t.Helper()
	if err := os.WriteFile(nd.cfg, []byte(f.caddyfile(nd)), 0o600); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(f.dir, nd.name)
	nd.proc = e2etest.Start(t, e2etest.Run{Name: nd.name, Bin: f.bin, Config: nd.cfg, Home: home,
		Env: []string{"FLEET_SECRET=" + fleetSecret}, Log: nd.log, AdminPort: nd.adminPort, HTTPPort: nd.httpPort,
		UpWithin: 60 * time.Second})
}

// kill is kill -9: no settlement flushed, no lease returned.
func (nd *node) kill() { nd.proc.Kill() }

// stop asks the node to exit through its admin API and waits.
func (nd *node) stop(t *testing.T) { nd.proc.Stop(t, 30*time.Second) }

// client makes the callers' calls: many at once, over every node.
var client = &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
	MaxIdleConnsPerHost: 512, MaxConnsPerHost: 512, IdleConnTimeout: 30 * time.Second}}

// subscribe creates a key for user through nd's admin API and subscribes
// the user to the service under product, with credits when not zero.
func subscribe(t *testing.T, nd *node, user, product string, credits int) (key, keyID string) {
	t.Helper()
	var k struct {
		Key   string `json:"key"`
		KeyID string `json:"keyId"`
	}
	e2etest.AdminJSON(t, "POST", nd.admin+"/platform/keys", map[string]any{"userId": user}, 201, &k)
	e2etest.AdminJSON(t, "PUT", nd.admin+"/platform/subscriptions/"+user+"/"+fleetService, map[string]any{"productId": product}, 200, nil)
	if credits != 0 {
		e2etest.AdminJSON(t, "POST", nd.admin+"/platform/subscriptions/"+user+"/"+fleetService+"/credits",
			map[string]any{"amount": credits}, 200, nil)
	}
	return k.Key, k.KeyID
}

// result is one call as its caller saw it.
type result struct {
	status    int
	code      string // the JSON error code of a refusal
	requestID string
	err       error
}

// invoke makes one sync call through nd.
func invoke(base, key string) result { return invokeClient(client, base, key) }

// invokeClient is invoke through the client cl.
func invokeClient(cl *http.Client, base, key string) result {
	req, _ := http.NewRequest("POST", base+"/api/service/"+fleetService+"/endpoint/echo/invoke", strings.NewReader("x"))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := cl.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	r := result{status: resp.StatusCode, requestID: resp.Header.Get("X-Platform-Request-ID")}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Code  string `json:"code"`
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		json.Unmarshal(body, &e)
		r.code = e.Code
		if r.code == "" {
			r.code = e.Error.Code
		}
		if r.code == "" {
			r.code = strings.TrimSpace(string(body))
		}
	}
	return r
}

// ledgerEntry is an entry of the admin API's usage export.
type ledgerEntry struct {
	ID        string          `json:"id"`
	UserID    string          `json:"userId"`
	RequestID string          `json:"requestId"`
	Units     json.RawMessage `json:"units"`
	Cost      json.RawMessage `json:"cost"`
	Source    string          `json:"source"`
}

// exportLedger reads the whole ledger through nd's admin API (every node
// reads the same database).
func exportLedger(t *testing.T, nd *node, user string) []ledgerEntry {
	t.Helper()
	u := nd.admin + "/platform/usage?format=ndjson"
	if user != "" {
		u += "&userId=" + user
	}
	resp, err := client.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("usage export: %d %s", resp.StatusCode, raw)
	}
	var out []ledgerEntry
	for line := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
		if line == "" {
			continue
		}
		var e ledgerEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("usage export line %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// dump logs what the database holds of the allowances, leases and
// balances, for a failure's message.
func (f *fleet) dump() {
	for _, q := range []string{
		"SELECT user_id, period, used, spend, leased_units, leased_spend FROM allowances ORDER BY 1",
		"SELECT holder, user_id, units, spend, credits, expires_at FROM leases ORDER BY 2, 1",
		"SELECT user_id, credits, credits_held FROM subscriptions ORDER BY 1",
		"SELECT user_id, count(*), count(DISTINCT call_id) FROM ledger GROUP BY 1 ORDER BY 1",
	} {
		out, err := pgtest.Exec(context.Background(), f.dsn, q)
		f.t.Logf("%s:\n%s %v", q, out, err)
	}
}

// unitsUsed is the user's units used this period as nd's admin API reads
// the counters (the summary), in whole units.
func unitsUsed(t *testing.T, nd *node, user string) string {
	t.Helper()
	var sum struct {
		Subscriptions []struct {
			ServiceID string      `json:"serviceId"`
			UnitsUsed json.Number `json:"unitsUsed"`
		} `json:"subscriptions"`
	}
	e2etest.AdminJSON(t, "GET", nd.admin+"/platform/users/"+user+"/summary", nil, 200, &sum)
	for _, s := range sum.Subscriptions {
		if s.ServiceID == fleetService {
			return s.UnitsUsed.String()
		}
	}
	t.Fatalf("no current period of %s in the summary", user)
	return ""
}
