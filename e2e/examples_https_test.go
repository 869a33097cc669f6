package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	asyncapp "github.com/platformgw/gateway/examples/asyncbackend/app"
	"github.com/platformgw/gateway/sdk"
)

// The gateway on https://localhost with Caddy's local CA and
// skip_install_trust, as Caddyfile.https.example runs it: the async example
// given the CA's root (GATEWAY_CA_FILE, sdk.WithCAFile) completes its jobs;
// without it, its posts fail on the certificate, the job stays PENDING for
// the caller, and the backend's log says why at ERROR, with the job id.
func TestExampleAsyncOverLocalHTTPS(t *testing.T) {
	dir := t.TempDir()
	jobsBackend := &switchHandler{}
	be := httptest.NewServer(jobsBackend)
	t.Cleanup(be.Close)
	base := fmt.Sprintf("https://localhost:%d", gwPort)
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	https_port %d
	auto_https disable_redirects
	skip_install_trust
	storage file_system %s
	platform {
		store %s/platform.db
		public_url %s
%s
	}
}
localhost:%d {
	bind 127.0.0.1
	tls internal
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform
	}
}
`, adminPort, gwPort, caddyStorage(t), dir, base, examplesCatalog("http://127.0.0.1:1", be.URL, "http://127.0.0.1:1"), gwPort)
	tester := newTester(t)
	tester.InitServer(cfg, "caddyfile")
	g := &gateway{t: t, tester: tester, dir: dir}
	key, _ := g.newKey("ex-https")
	g.subscribe("ex-https", "jobs", "words", "ACTIVE")

	rootFile := filepath.Join(caddyStorage(t), "pki", "authorities", "local", "root.crt")
	rootPEM, err := os.ReadFile(rootFile)
	if err != nil {
		t.Fatalf("Caddy's local root: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(rootPEM)
	caller := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		// localhost may resolve to ::1 first; the site listens on 127.0.0.1.
		DialContext: dialLoopback4,
	}}
	// Caddy obtains the site's certificate in the background: wait
	// (bounded) until a handshake succeeds.
	for i := 0; ; i++ {
		resp, err := caller.Get(base + "/api/requests/none/status")
		if err == nil {
			resp.Body.Close()
			break
		}
		if i == 200 {
			t.Fatalf("no TLS handshake with %s: %v", base, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	do := func(method, url, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := caller.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]any
		json.Unmarshal(raw, &m)
		return resp.StatusCode, m
	}
	startJob := func() string {
		t.Helper()
		status, acc := do("POST", base+"/api/service/jobs/endpoint/upper/invoke/async", "make this loud")
		id, _ := acc["requestId"].(string)
		if status != http.StatusAccepted || id == "" {
			t.Fatalf("async invoke: %d %v", status, acc)
		}
		return id
	}
	jobStatus := func(id string) map[string]any {
		_, st := do("GET", base+"/api/requests/"+id+"/status", "")
		return st
	}

	run := func(name string, opts ...sdk.Option) *exampleLog {
		out := &exampleLog{}
		c, err := sdk.NewClient(base, "jobs", exampleJobsSecret, append([]sdk.Option{
			sdk.WithRetry(sdk.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, MaxAttempts: 2}),
			sdk.WithReconciliationLog(sdk.NewJSONLinesLog(io.Discard)),
		}, opts...)...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b := asyncapp.New(asyncapp.Config{Verifier: sdk.NewVerifier(exampleJobsSecret), Client: c, Logger: log.New(out, "", 0)})
		jobsBackend.set(b.Handler())
		t.Cleanup(func() { exampleShutdown(t, b.Shutdown) })
		return out
	}

	// Without the root: the completion never arrives, and the log says so.
	noCA := run("no CA")
	id := startJob()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(noCA.String(), "completion NOT reported") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	logged := noCA.String()
	for _, want := range []string{"ERROR job " + id, "certificate signed by unknown authority", "sdk.WithCAFile", "SSL_CERT_FILE"} {
		if !strings.Contains(logged, want) {
			t.Errorf("the backend's log lacks %q:\n%s", want, logged)
		}
	}
	if st := jobStatus(id); st["status"] != "PENDING" {
		t.Errorf("job without the CA: %v", st)
	}

	// With it (what GATEWAY_CA_FILE does in the example's main).
	withCA := run("with CA", sdk.WithCAFile(rootFile))
	id = startJob()
	deadline = time.Now().Add(10 * time.Second)
	st := jobStatus(id)
	for st["status"] != "COMPLETED" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		st = jobStatus(id)
	}
	if st["status"] != "COMPLETED" || strings.Contains(withCA.String(), "ERROR") {
		t.Errorf("job with the CA: %v; backend log:\n%s", st, withCA.String())
	}
	_, res := do("GET", base+"/api/requests/"+id+"/result", "")
	if res["result"] != "MAKE THIS LOUD" {
		t.Errorf("result: %v", res)
	}
}

// switchHandler serves whichever handler was set last.
type switchHandler struct{ h atomicHandler }

func (s *switchHandler) set(h http.Handler) { s.h.Store(&h) }
func (s *switchHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := s.h.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	http.Error(w, "no backend yet", http.StatusServiceUnavailable)
}

type atomicHandler = atomic.Pointer[http.Handler]

// dialLoopback4 dials 127.0.0.1 whatever host name was asked for.
func dialLoopback4(ctx context.Context, network, addr string) (net.Conn, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", port))
}

// caddyStorage is Caddy's storage (its local CA, certificates) for the
// whole test process: Caddy keeps certificates in a process-wide cache, so
// a second run (-count) with a new CA would be served the first run's
// certificate. It is left in the temp directory.
var caddyStorage = func() func(t *testing.T) string {
	var once sync.Once
	var dir string
	var err error
	return func(t *testing.T) string {
		once.Do(func() { dir, err = os.MkdirTemp("", "platform-e2e-caddy-storage-") })
		if err != nil {
			t.Fatal(err)
		}
		return dir
	}
}()
