package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
)

// TestUsageJobTextsWithNUL: a backend's stage, error text, result and
// content type (in a quoted parameter) may
// hold U+0000 (JSON's "\u0000"), which PostgreSQL cannot store in a jsonb
// record. Both stores must take the progress and the completion alike
// (the NUL shown as U+FFFD), and the completion must be charged: a
// completion refused for it with a store error would never be charged,
// whatever the backend retried.
func TestUsageJobTextsWithNUL(t *testing.T) {
	onBothStores(t, func(t *testing.T, be *usageBackend, g *gateway) {
		key, _ := g.newKey("u-nul")
		g.subscribe("u-nul", "svc", "basic", "ACTIVE")
		acc, env := usageStart(t, be, asyncURL("/api", "svc", "job"), key, `{}`)
		ts := usageURLTimestamp(t, env.CallbackURL)

		progress := fmt.Sprintf(`{"stage":"step\u0000one","percentageComplete":10,"errorMessage":"warn\u0000ing","timestamp":%d}`, time.Now().Unix())
		resp, body := usagePost(t, usageSigned{URL: env.ProgressURL, Body: progress, Secret: usageSecret, Timestamp: ts})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("progress with a NUL: %d %s", resp.StatusCode, body)
		}
		resp, body = call(t, "GET", acc.ProgressURL, key, "")
		st := usageJSON(t, body)
		if resp.StatusCode != http.StatusOK || st["currentStage"] != "step\uFFFDone" || st["errorMessage"] != "warn\uFFFDing" {
			t.Errorf("status after a progress with NULs: %d %s", resp.StatusCode, body)
		}

		complete := fmt.Sprintf(`{"status":"COMPLETED","result":"a\u0000b","contentType":"text/plain; x=\"\u0000\"","timestamp":%d}`, time.Now().Unix())
		resp, body = usagePost(t, usageSigned{URL: env.CallbackURL, Body: complete, Secret: usageSecret, Timestamp: ts})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion with a NUL: %d %s", resp.StatusCode, body)
		}
		resp, body = call(t, "GET", gwBase+"/api/requests/"+acc.RequestID+"/result", key, "")
		res := usageJSON(t, body)
		if resp.StatusCode != http.StatusOK || res["result"] != "a\uFFFDb" || res["size"] != float64(len("a\uFFFDb")) || res["truncated"] != false ||
			res["contentType"] != "text/plain; x=\"\uFFFD\"" {
			t.Errorf("result: %d %s", resp.StatusCode, body)
		}
		if es := g.ledger("u-nul"); len(es) != 1 || es[0].Units != billing.Whole(1) {
			t.Errorf("the completion was not charged once: %+v", es)
		}
		// The backend's retry of the same completion is recognised.
		resp, body = usagePost(t, usageSigned{URL: env.CallbackURL, Body: complete, Secret: usageSecret, Timestamp: ts})
		if resp.StatusCode != http.StatusOK {
			t.Errorf("the same completion again: %d %s", resp.StatusCode, body)
		}
	})
}

// startGatewayPostgres is startGateway on a PostgreSQL store (store
// postgres) at dsn instead of the store file.
func startGatewayPostgres(t *testing.T, dir, dsn, platformBlock string) *gateway {
	t.Helper()
	cfg := onPostgres(t, gatewayConfig(dir, platformBlock, "", "", ""), dir, dsn)
	tester := testerFor(t, "")
	tester.InitServer(cfg, "caddyfile")
	return &gateway{t: t, tester: tester, dir: dir}
}

// onPostgres is cfg, a gatewayConfig, with its store file replaced by
// PostgreSQL at dsn. The node keeps its settlement log in dir: the
// default one (by node id, under Caddy's data directory) is shared by
// every test's node, and a node replays what its log still holds (the
// last calls of a test process that exited without stopping its server)
// into whatever database it starts on: rows of another test's users,
// charged 0, in this test's ledger.
func onPostgres(t *testing.T, cfg, dir, dsn string) string {
	t.Helper()
	file := "store " + dir + "/platform.db"
	if !strings.Contains(cfg, file) {
		t.Fatal("the gateway config names no store file")
	}
	return strings.Replace(cfg, file, fmt.Sprintf("store postgres {\n\t\t\tdsn %q\n\t\t\tnode_id e2e\n\t\t\tlog_dir %q\n\t\t}",
		dsn, filepath.Join(dir, "settle")), 1)
}

// TestJobIDNotUTF8: a job id in the path that is not UTF-8 (%ff) names no
// job: 404 request_not_found on both stores, for the caller's status and
// result and for a backend's progress and completion, never a store error
// (PostgreSQL refuses such a text parameter).
func TestJobIDNotUTF8(t *testing.T) {
	onBothStores(t, func(t *testing.T, be *usageBackend, g *gateway) {
		key, _ := g.newKey("u-utf8")
		for _, url := range []string{gwBase + "/api/requests/a%ffb/status", gwBase + "/api/requests/a%ffb/result", gwBase + "/api/usage/progress/a%ffb"} {
			resp, body := call(t, "GET", url, key, "")
			if resp.StatusCode != http.StatusNotFound || errorCode(t, resp, body) != "request_not_found" {
				t.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
			}
		}
		body := fmt.Sprintf(`{"stage":"x","percentageComplete":1,"timestamp":%d}`, time.Now().Unix())
		for _, url := range []string{gwBase + "/api/usage/progress/a%ffb", gwBase + "/api/usage/complete/a%ffb"} {
			resp, got := usagePost(t, usageSigned{URL: url, Body: body, Secret: usageSecret})
			if resp.StatusCode != http.StatusNotFound || errorCode(t, resp, got) != "request_not_found" {
				t.Errorf("POST %s: %d %s", url, resp.StatusCode, got)
			}
		}
	})
}

// TestJobResultSizeNotUTF8: a result that is a JSON value rather than a
// string is kept as its JSON text; bytes in it that are not UTF-8 are
// kept as U+FFFD, as in a string result, and size counts the text the
// caller gets, not the bytes the store never kept.
func TestJobResultSizeNotUTF8(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	other := newUsageBackend(t, usageSecret2)
	g := startGateway(t, t.TempDir(), usageCatalog(be.URL, other.URL))
	key, _ := g.newKey("u-raw")
	g.subscribe("u-raw", "svc", "basic", "ACTIVE")
	acc, env := usageStart(t, be, asyncURL("/api", "svc", "job"), key, `{}`)
	complete := fmt.Sprintf("{\"result\":{\"a\":\"x\xff\xfey\"},\"timestamp\":%d}", time.Now().Unix())
	resp, body := usagePost(t, usageSigned{URL: env.CallbackURL, Body: complete, Secret: usageSecret})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d %s", resp.StatusCode, body)
	}
	resp, body = call(t, "GET", gwBase+"/api/requests/"+acc.RequestID+"/result", key, "")
	res := usageJSON(t, body)
	want := "{\"a\":\"x\uFFFD\uFFFDy\"}"
	if resp.StatusCode != http.StatusOK || res["result"] != want || res["size"] != float64(len(want)) || res["truncated"] != false {
		t.Errorf("result: %d %s; want result %q size %d", resp.StatusCode, body, want, len(want))
	}
}

// onBothStores runs f against a gateway on an embedded store file and one
// on PostgreSQL, each serving usageCatalog with be as the service's
// backend.
func onBothStores(t *testing.T, f func(t *testing.T, be *usageBackend, g *gateway)) {
	for _, pg := range []bool{false, true} {
		name := "file"
		if pg {
			name = "postgres"
		}
		t.Run(name, func(t *testing.T) {
			be := newUsageBackend(t, usageSecret)
			other := newUsageBackend(t, usageSecret2)
			var g *gateway
			if pg {
				g = startGatewayPostgres(t, t.TempDir(), pgtest.DB(t), usageCatalog(be.URL, other.URL))
			} else {
				g = startGateway(t, t.TempDir(), usageCatalog(be.URL, other.URL))
			}
			f(t, be, g)
		})
	}
}
