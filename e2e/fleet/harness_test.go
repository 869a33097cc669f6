// Package fleet runs the built gateway binary as a fleet: several
// processes on loopback sharing one PostgreSQL store (store postgres in
// the platform options, docs/fleet.md), with callers spread over the
// nodes. It judges what the fleet promises: limits exact across nodes,
// nothing acknowledged lost when a node dies, no wrong charge while
// PostgreSQL restarts, revocations and jobs visible on every node.
//
// Ports: node i (0, 1, 2) serves HTTP on FLEET_HTTP_PORT+i (8402 by
// default) and its admin API on FLEET_ADMIN_PORT+i (2402); the private
// PostgreSQL cluster of the restart test listens on FLEET_PG_PORT (55441).
package fleet

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
)

const (
	fleetSecret  = "fleet-secret-fleet-secret-000001"
	fleetService = "fleet"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// gatewayBinary builds ./caddy once per test binary (E2E_CADDY_BIN names
// a binary built already).
func gatewayBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("E2E_CADDY_BIN"); p != "" {
		return p
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "platformgw-fleet-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "caddy")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binPath, "./caddy")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./caddy: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// node is one gateway process of the fleet.
type node struct {
	name      string
	admin     string
	base      string
	cfg       string
	log       string
	adminPort int
	httpPort  int
	cmd       *exec.Cmd
	done      chan struct{}
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

// newFleet starts n nodes on the database at dsn.
func newFleet(t *testing.T, dsn string, n int) *fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the real binary as a fleet")
	}
	f := &fleet{t: t, bin: gatewayBinary(t), dir: t.TempDir(), dsn: dsn, jobs: make(chan envelope, 1000),
		leaseTTL: "5s", leaseMax: "10"}
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
		io.WriteString(w, "ok")
	}))
	t.Cleanup(f.backend.Close)
	httpBase, adminBase := envInt("FLEET_HTTP_PORT", 8402), envInt("FLEET_ADMIN_PORT", 2402)
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
				t.Logf("%s log (end):\n%s", nd.name, tail(nd.log))
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
			lease_max %s
		}
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
`, nd.adminPort, nd.httpPort, freePort(f.t), f.dsn, nd.name, f.leaseTTL, f.leaseMax, catalog(f.backend.URL), nd.httpPort)
}

// start starts (or restarts) a node and waits until it serves.
func (f *fleet) start(nd *node) {
	t := f.t
	t.Helper()
	if err := os.WriteFile(nd.cfg, []byte(f.caddyfile(nd)), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.OpenFile(nd.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	nd.cmd = exec.Command(f.bin, "run", "--config", nd.cfg, "--adapter", "caddyfile")
	home := filepath.Join(f.dir, nd.name)
	nd.cmd.Env = append(os.Environ(), "FLEET_SECRET="+fleetSecret,
		"XDG_CONFIG_HOME="+filepath.Join(home, "config"), "XDG_DATA_HOME="+filepath.Join(home, "data"), "HOME="+home)
	nd.cmd.Stdout, nd.cmd.Stderr = logFile, logFile
	if err := nd.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	nd.done = make(chan struct{})
	cmd, done := nd.cmd, nd.done
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-done:
			t.Fatalf("%s exited at start: %v\n%s", nd.name, cmd.ProcessState, tail(nd.log))
		default:
		}
		if resp, err := client.Get(nd.admin + "/platform/keys?userId=probe"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				if r2, err := client.Get(nd.base + "/"); err == nil {
					r2.Body.Close()
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not come up in 60s\n%s", nd.name, tail(nd.log))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill is kill -9: no settlement flushed, no lease returned.
func (nd *node) kill() {
	nd.cmd.Process.Kill()
	<-nd.done
}

// stop asks the node to exit through its admin API and waits.
func (nd *node) stop(t *testing.T) {
	t.Helper()
	if resp, err := client.Post(nd.admin+"/stop", "", nil); err == nil {
		resp.Body.Close()
	}
	select {
	case <-nd.done:
	case <-time.After(30 * time.Second):
		t.Errorf("%s did not stop within 30s; killing it", nd.name)
		nd.kill()
	}
}

// tail is the end of a log file, for failure messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

var client = &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
	MaxIdleConnsPerHost: 512, MaxConnsPerHost: 512, IdleConnTimeout: 30 * time.Second}}

// adminJSON sends a JSON request to an admin API and decodes the answer.
func adminJSON(t *testing.T, method, url string, body any, wantStatus int, out any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantStatus {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, url, err, raw)
		}
	}
}

// subscribe creates a key for user through nd's admin API and subscribes
// the user to the service under product, with credits when not zero.
func subscribe(t *testing.T, nd *node, user, product string, credits int) (key, keyID string) {
	t.Helper()
	var k struct {
		Key   string `json:"key"`
		KeyID string `json:"keyId"`
	}
	adminJSON(t, "POST", nd.admin+"/platform/keys", map[string]any{"userId": user}, 201, &k)
	adminJSON(t, "PUT", nd.admin+"/platform/subscriptions/"+user+"/"+fleetService, map[string]any{"productId": product}, 200, nil)
	if credits != 0 {
		adminJSON(t, "POST", nd.admin+"/platform/subscriptions/"+user+"/"+fleetService+"/credits",
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
func invoke(base, key string) result {
	req, _ := http.NewRequest("POST", base+"/api/service/"+fleetService+"/endpoint/echo/invoke", strings.NewReader("x"))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
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

// usageSign signs a backend's request to the usage service (the
// X-Platform-Signature of a report or completion).
func usageSign(secret string, body []byte, ts string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	m.Write([]byte(ts))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
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
	adminJSON(t, "GET", nd.admin+"/platform/users/"+user+"/summary", nil, 200, &sum)
	for _, s := range sum.Subscriptions {
		if s.ServiceID == fleetService {
			return s.UnitsUsed.String()
		}
	}
	t.Fatalf("no current period of %s in the summary", user)
	return ""
}
