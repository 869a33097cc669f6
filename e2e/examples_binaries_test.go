package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	backendapp "github.com/platformgw/gateway/examples/backend/app"
	"github.com/platformgw/gateway/internal/billing"
)

// exampleProcess is an example binary running against the test gateway.
type exampleProcess struct {
	name string
	cmd  *exec.Cmd
	out  *exampleLog
	done chan error
}

// startExample runs bin with env added to the test's environment and
// waits until it listens on addr.
func startExample(t *testing.T, bin, addr string, env ...string) *exampleProcess {
	t.Helper()
	p := &exampleProcess{name: filepath.Base(bin), out: &exampleLog{}, done: make(chan error, 1)}
	p.cmd = exec.Command(bin)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return p
		}
		select {
		case err := <-p.done:
			t.Fatalf("%s exited at start (%v):\n%s", p.name, err, p.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not listen on %s:\n%s", p.name, addr, p.out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends sig and expects a clean exit: status 0, and the line saying
// it stopped.
func (p *exampleProcess) stop(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		if err != nil || !strings.Contains(p.out.String(), "stopped") {
			t.Errorf("%s on %v: exit %v, output:\n%s", p.name, sig, err, p.out)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("%s did not stop on %v:\n%s", p.name, sig, p.out)
	}
}

// exampleAddr is a free loopback address.
func exampleAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The example binaries as an operator runs them: configured by their
// environment, serving one call each against the gateway, and stopping
// cleanly on SIGTERM or SIGINT.
func TestExampleBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the example binaries")
	}
	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin+string(filepath.Separator),
		"./examples/backend", "./examples/asyncbackend", "./examples/reporter")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build the examples: %v\n%s", err, out)
	}

	syncAddr, asyncAddr, reporterAddr := exampleAddr(t), exampleAddr(t), exampleAddr(t)
	g := startGateway(t, t.TempDir(), examplesCatalog("http://"+syncAddr, "http://"+asyncAddr, "http://"+reporterAddr))
	logs := t.TempDir()
	syncBackend := startExample(t, filepath.Join(bin, "backend"), syncAddr,
		"BACKEND_SECRET="+exampleEchoSecret, "BACKEND_ADDR="+syncAddr)
	async := startExample(t, filepath.Join(bin, "asyncbackend"), asyncAddr,
		"BACKEND_SECRET="+exampleJobsSecret, "BACKEND_ADDR="+asyncAddr, "GATEWAY_URL="+gwBase,
		"JOB_STEP=10ms", "RECONCILIATION_LOG="+filepath.Join(logs, "jobs.jsonl"))
	reporter := startExample(t, filepath.Join(bin, "reporter"), reporterAddr,
		"BACKEND_SECRET="+exampleWordcountSecret, "BACKEND_ADDR="+reporterAddr, "GATEWAY_URL="+gwBase,
		"RECONCILIATION_LOG="+filepath.Join(logs, "wordcount.jsonl"))

	key, _ := g.newKey("ex-bin")
	g.subscribe("ex-bin", "echo", "free", "ACTIVE")
	g.subscribe("ex-bin", "jobs", "words", "ACTIVE")
	g.subscribe("ex-bin", "wordcount", "words", "ACTIVE")

	resp, body := call(t, "GET", invokeURL("echo", "hello")+"?name=you", key, "")
	var hello backendapp.Hello
	if err := json.Unmarshal(body, &hello); resp.StatusCode != http.StatusOK || err != nil || hello.Caller.UserID != "ex-bin" {
		t.Fatalf("hello: %d %s", resp.StatusCode, body)
	}

	resp, body = call(t, "POST", asyncURL("/api", "jobs", "upper"), key, "make this loud")
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("async invoke: %d %s", resp.StatusCode, body)
	}
	id := usageJSON(t, body)["requestId"].(string)
	exampleStatus(t, gwBase+"/api/requests/"+id+"/status", key, exampleState("COMPLETED"))
	resp, body = call(t, "GET", gwBase+"/api/requests/"+id+"/result", key, "")
	if resp.StatusCode != http.StatusOK || usageJSON(t, body)["result"] != "MAKE THIS LOUD" {
		t.Fatalf("result: %d %s", resp.StatusCode, body)
	}

	resp, body = call(t, "POST", "http://"+reporterAddr+"/count", key, "count these words please")
	if resp.StatusCode != http.StatusOK || usageJSON(t, body)["words"] != 4.0 {
		t.Fatalf("count: %d %s", resp.StatusCode, body)
	}

	var charged billing.Units
	for _, e := range g.ledger("ex-bin") {
		charged += e.Units
	}
	if charged != billing.Whole(1+3+4) {
		t.Errorf("charged %s, want 8: %+v", charged, g.ledger("ex-bin"))
	}
	for _, f := range []string{"jobs.jsonl", "wordcount.jsonl"} {
		b, err := os.ReadFile(filepath.Join(logs, f))
		if err != nil || strings.Count(string(b), "\n") != 1 || !strings.Contains(string(b), `"status":"recorded"`) {
			t.Errorf("reconciliation log %s: %v %s", f, err, b)
		}
	}

	syncBackend.stop(t, syscall.SIGTERM)
	async.stop(t, syscall.SIGTERM)
	reporter.stop(t, os.Interrupt)
}
