package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	asyncapp "github.com/platformgw/gateway/examples/asyncbackend/app"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/sdk"
)

// startExampleAsync runs the async example on loopback with an SDK client
// whose completions wait at gate (nil: never held).
func startExampleAsync(t *testing.T, step time.Duration, gate *gatedTransport, log *exampleLog) (*asyncapp.Backend, *httptest.Server) {
	t.Helper()
	var opts []sdk.Option
	if gate != nil {
		opts = append(opts, sdk.WithHTTPClient(&http.Client{Transport: gate, Timeout: 30 * time.Second}))
	}
	b := asyncapp.New(asyncapp.Config{
		Verifier: sdk.NewVerifier(exampleJobsSecret),
		Client:   exampleClient(t, "jobs", exampleJobsSecret, log, opts...),
		Step:     step,
	})
	srv := httptest.NewServer(b.Handler())
	t.Cleanup(func() {
		srv.Close()
		exampleShutdown(t, b.Shutdown)
	})
	return b, srv
}

// The async example: the caller's 202, the backend's progress seen while
// the job runs, then its completion, the result and the words charged
// once.
func TestExampleAsyncBackend(t *testing.T) {
	gate := &gatedTransport{hold: "/complete/", open: make(chan struct{})}
	log := &exampleLog{}
	_, be := startExampleAsync(t, 0, gate, log)
	g := startGateway(t, t.TempDir(), examplesCatalog("http://127.0.0.1:1", be.URL, "http://127.0.0.1:1"))
	key, _ := g.newKey("ex-async")
	g.subscribe("ex-async", "jobs", "words", "ACTIVE")

	text := "the quick brown fox jumps"
	resp, body := call(t, "POST", asyncURL("/api", "jobs", "upper"), key, text)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("async invoke: %d %s", resp.StatusCode, body)
	}
	acc := usageJSON(t, body)
	id, _ := acc["requestId"].(string)
	statusURL, _ := acc["progressUrl"].(string)
	if id == "" || statusURL != gwBase+"/api/requests/"+id+"/status" {
		t.Fatalf("202: %s", body)
	}

	// The backend has posted its progress; its completion is held.
	st := exampleStatus(t, statusURL, key, exampleState("RUNNING"))
	if st["currentStage"] != "upper-casing" || st["percentageComplete"] != 50.0 {
		t.Fatalf("running job: %v", st)
	}
	resultURL := gwBase + "/api/requests/" + id + "/result"
	if resp, body := call(t, "GET", resultURL, key, ""); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("result while running: %d %s", resp.StatusCode, body)
	}

	close(gate.open)
	st = exampleStatus(t, statusURL, key, exampleState("COMPLETED"))
	if st["percentageComplete"] != 100.0 || st["errorMessage"] != nil {
		t.Errorf("completed job: %v", st)
	}
	resp, body = call(t, "GET", resultURL, key, "")
	res := usageJSON(t, body)
	if resp.StatusCode != http.StatusOK || res["result"] != strings.ToUpper(text) ||
		res["contentType"] != "text/plain; charset=utf-8" || res["requestId"] != id {
		t.Fatalf("result: %d %s", resp.StatusCode, body)
	}

	// One word, one unit, charged once at completion.
	es := g.ledger("ex-async")
	if len(es) != 1 || es[0].Units != billing.Whole(5) || es[0].Source != store.SourceCompletion ||
		es[0].RequestID != id || es[0].ServiceID != "jobs" || es[0].EndpointID != "upper" {
		t.Errorf("ledger %+v", es)
	}
	recs := log.waitRecords(t, 1)
	if len(recs) != 1 || recs[0]["operation"] != "completion" || recs[0]["status"] != sdk.OutcomeRecorded ||
		recs[0]["platformRequestId"] != id || recs[0]["userId"] != "ex-async" || recs[0]["unitsReported"] != 5.0 ||
		recs[0]["endpoint"] != "POST /upper" {
		t.Errorf("reconciliation log: %s", log)
	}
	if s := log.String(); strings.Contains(s, "signature") || strings.Contains(s, exampleJobsSecret) || strings.Contains(s, key) {
		t.Errorf("reconciliation log holds a secret: %s", s)
	}

	t.Run("an empty text fails the job, charging nothing", func(t *testing.T) {
		resp, body := call(t, "POST", asyncURL("/api", "jobs", "upper"), key, "  ")
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("async invoke: %d %s", resp.StatusCode, body)
		}
		id := usageJSON(t, body)["requestId"].(string)
		st := exampleStatus(t, gwBase+"/api/requests/"+id+"/status", key, exampleState("FAILED"))
		if !strings.Contains(st["errorMessage"].(string), "empty") {
			t.Errorf("failed job: %v", st)
		}
		resp, body = call(t, "GET", gwBase+"/api/requests/"+id+"/result", key, "")
		if resp.StatusCode != http.StatusInternalServerError || usageJSON(t, body)["status"] != "FAILED" {
			t.Errorf("result of a failed job: %d %s", resp.StatusCode, body)
		}
		if es := g.ledger("ex-async"); len(es) != 1 {
			t.Errorf("a failed job was charged: %+v", es)
		}
	})

	t.Run("a sync call is refused", func(t *testing.T) {
		// The endpoint is async only at the gateway; signed like a sync
		// call, the backend's handler still says no rather than leave
		// a job open.
		resp, body := call(t, "POST", invokeURL("jobs", "upper"), key, "x")
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "/invoke/async") {
			t.Errorf("sync call to the async endpoint: %d %s", resp.StatusCode, body)
		}
	})
}

// SIGTERM in the middle of a job: the example stops taking jobs, and a job
// it cannot finish in time ends FAILED at once rather than at its expiry.
func TestExampleAsyncBackendShutdown(t *testing.T) {
	log := &exampleLog{}
	b, be := startExampleAsync(t, time.Hour, nil, log)
	g := startGateway(t, t.TempDir(), examplesCatalog("http://127.0.0.1:1", be.URL, "http://127.0.0.1:1"))
	key, _ := g.newKey("ex-async-stop")
	g.subscribe("ex-async-stop", "jobs", "words", "ACTIVE")

	resp, body := call(t, "POST", asyncURL("/api", "jobs", "upper"), key, "a long job")
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("async invoke: %d %s", resp.StatusCode, body)
	}
	id := usageJSON(t, body)["requestId"].(string)

	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no time left: the running job is given up
	if err := b.Shutdown(ctx); err == nil {
		t.Error("Shutdown with a job running and no time left reported success")
	}
	st := exampleStatus(t, gwBase+"/api/requests/"+id+"/status", key, exampleState("FAILED"))
	if !strings.Contains(st["errorMessage"].(string), "shut down") {
		t.Errorf("abandoned job: %v", st)
	}
	if es := g.ledger("ex-async-stop"); len(es) != 0 {
		t.Errorf("an abandoned job was charged: %+v", es)
	}

	// A job offered after the shutdown is refused, so it fails at once.
	resp, body = call(t, "POST", asyncURL("/api", "jobs", "upper"), key, "too late")
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("job offered after shutdown: %d %s", resp.StatusCode, body)
	}
}
