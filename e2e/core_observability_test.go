package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
)

// observedConfig is the standard site with Caddy's metrics handler at
// /metrics, the default log (DEBUG, to catch what Caddy itself logs about
// forwarded requests) written to dir/caddy.log and an access log to
// dir/access.log, both with the field filters docs/operations.md
// recommends.
func observedConfig(dir, platformBlock string) string {
	return fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	https_port 9443
	grace_period 10s
	log {
		output file %s/caddy.log
		format filter {
			wrap json
			request>headers>X-Platform-Signature delete
		}
		level DEBUG
	}
	platform {
		store %s/platform.db
%s
	}
}
:%d {
	bind 127.0.0.1
	log {
		output file %s/access.log
		format filter {
			wrap json
			request>headers>X-Platform-Signature delete
			request>headers>Stripe-Signature delete
			resp_headers>X-Platform-Signature delete
			request>uri query {
				delete signature
				delete code
				delete state
			}
		}
	}
	metrics /metrics
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform
	}
}
`, adminPort, gwPort, dir, dir, platformBlock, gwPort, dir)
}

func observedCatalog(syncBackend, asyncBackend, extra string) string {
	return fmt.Sprintf(`
		service obs {
			backend %s
			secret %s
			owners owner-1
			endpoint call {
				path /call
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
			}
		}
		service jobs {
			backend %s
			secret %s
			endpoint job {
				async
				path /job
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
			}
		}%s`, syncBackend, coreSecret, asyncBackend, coreSecret2, extra)
}

// metricSamples scrapes a Prometheus text endpoint into series → value.
func metricSamples(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape %s: %d %s", url, resp.StatusCode, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// TestCoreMetricsAndLogs drives every kind of traffic through the real
// server, then scrapes the platform_* series through Caddy's metrics
// handler and the admin endpoint (before and after a reload), and greps
// the logs for every key, secret and signature the traffic carried.
func TestCoreMetricsAndLogs(t *testing.T) {
	syncBE := newTestBackend(t, coreSecret, "Platform")
	asyncBE := newUsageBackend(t, coreSecret2)
	dir := t.TempDir()
	cfg := observedConfig(dir, observedCatalog(syncBE.URL, asyncBE.URL, ""))
	tester := newTester(t)
	tester.InitServer(cfg, "caddyfile")
	g := &gateway{t: t, tester: tester, dir: dir}

	key, _ := g.newKey("u-obs")
	g.subscribe("u-obs", "obs", "basic", "ACTIVE")
	g.subscribe("u-obs", "jobs", "basic", "ACTIVE")
	revoked, revokedRec := g.newKey("u-obs")
	if _, err := g.store().RevokeKey(t.Context(), revokedRec.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Everything secret the traffic below carries; none may reach a log.
	secrets := []string{key, revoked, coreSecret, coreSecret2}
	signed := func(s usageSigned) (*http.Response, []byte) {
		t.Helper()
		ts := s.Timestamp
		if ts == "" {
			ts = fmt.Sprint(time.Now().Unix())
			s.Timestamp = ts
		}
		if s.Secret != "" {
			body := s.Body
			if s.SignBody != nil {
				body = *s.SignBody
			}
			secrets = append(secrets, e2etest.UsageSign(s.Secret, []byte(body), ts))
		}
		resp, out := usagePost(t, s)
		if sig := resp.Header.Get("X-Platform-Signature"); sig != "" {
			secrets = append(secrets, sig)
		}
		return resp, out
	}

	metricsURL := gwBase + "/metrics"
	adminURL := fmt.Sprintf("http://localhost:%d/metrics", adminPort)
	before := metricSamples(t, metricsURL)

	// Sync invokes: one good, refusals, one for a made-up service.
	if resp, body := call(t, "POST", invokeURL("obs", "call"), key, "{}"); resp.StatusCode != 200 {
		t.Fatalf("invoke: %d %s", resp.StatusCode, body)
	}
	secrets = append(secrets, syncBE.last(t).Header.Get("X-Platform-Signature"))
	call(t, "POST", invokeURL("obs", "call"), revoked, "{}")
	call(t, "POST", invokeURL("obs", "call"), "sk_live_notakey", "{}")
	call(t, "POST", invokeURL("made-up-service", "whatever"), key, "{}")
	call(t, "POST", invokeURL("obs", "made-up-endpoint"), key, "{}")
	if resp, body := call(t, "GET", gwBase+"/api/service/obs/not-an-invoke-path", key, ""); resp.StatusCode != 404 || resp.Header.Get("X-Platform-Request-ID") == "" {
		t.Errorf("bad invoke path: %d %v %s", resp.StatusCode, resp.Header, body)
	}

	// An async job: progress through the progress URL (signature in its
	// query), completion with units.
	acc, env := usageStart(t, asyncBE, invokeURL("jobs", "job")+"/async", key, `{"q":1}`)
	secrets = append(secrets, env.Header.Get("X-Platform-Signature"))
	for _, u := range []string{env.ProgressURL, env.CallbackURL} {
		secrets = append(secrets, strings.TrimPrefix(regexp.MustCompile(`signature=[^&]+`).FindString(u), "signature="))
	}
	ts := usageURLTimestamp(t, env.ProgressURL)
	if resp, body := signed(usageSigned{URL: env.ProgressURL, Secret: coreSecret2, Timestamp: ts,
		Body: `{"stage":"working","percentageComplete":50,"timestamp":` + ts + `}`}); resp.StatusCode != 200 {
		t.Fatalf("progress: %d %s", resp.StatusCode, body)
	}
	if resp, body := signed(usageSigned{URL: env.CallbackURL, Secret: coreSecret2, Timestamp: ts,
		Body: `{"status":"COMPLETED","result":"ok","units":2,"timestamp":` + ts + `}`}); resp.StatusCode != 200 {
		t.Fatalf("complete: %d %s", resp.StatusCode, body)
	}
	call(t, "GET", gwBase+"/api/requests/"+acc.RequestID+"/status", key, "")

	// Reports: one good, one forged.
	report := usageReportBody("u-obs", "obs", "1.5", time.Now().Unix())
	if resp, body := signed(usageSigned{URL: usageReportURL, Secret: coreSecret, Body: report, Header: []string{"Idempotency-Key", "obs-1"}}); resp.StatusCode != 200 {
		t.Fatalf("report: %d %s", resp.StatusCode, body)
	}
	resp, _ := signed(usageSigned{URL: usageReportURL, Secret: "forged-forged-forged-forged-0001", Body: report})
	forgedID := resp.Header.Get("X-Platform-Request-ID")

	// Core routes: validate good and refused, estimates allowed and denied,
	// a wrong serviceSecret in a body.
	if resp, body := signed(usageSigned{URL: coreValidateURL, Secret: coreSecret, Body: coreBody(t, "serviceKey", key, "serviceId", "obs")}); resp.StatusCode != 200 {
		t.Fatalf("validate: %d %s", resp.StatusCode, body)
	}
	signed(usageSigned{URL: coreValidateURL, Secret: coreSecret, Body: coreBody(t, "serviceKey", revoked, "serviceId", "obs")})
	signed(usageSigned{URL: coreValidateURL, Body: coreBody(t, "serviceKey", key, "serviceSecret", coreSecret2+"x")})
	secrets = append(secrets, coreSecret2+"x")
	signed(usageSigned{URL: coreEstimateURL, Body: coreBody(t, "serviceKey", key, "serviceSecret", coreSecret, "estimatedUnits", 1)})
	signed(usageSigned{URL: coreEstimateURL, Secret: coreSecret, Body: coreBody(t, "serviceKey", key, "serviceId", "obs", "estimatedUnits", 1000)})
	call(t, "POST", coreBillingURL, key, coreBody(t, "userId", "someone-else", "serviceId", "obs", "estimatedUnits", 1))

	after := metricSamples(t, metricsURL)
	delta := func(series string) float64 { return after[series] - before[series] }
	for series, want := range map[string]float64{
		`platform_invokes_total{endpoint="call",mode="sync",outcome="ok",service="obs"}`:           1,
		`platform_invokes_total{endpoint="call",mode="sync",outcome="rejected",service="obs"}`:     2,
		`platform_invokes_total{endpoint="",mode="sync",outcome="rejected",service=""}`:            1,
		`platform_invokes_total{endpoint="",mode="sync",outcome="rejected",service="obs"}`:         1,
		`platform_invokes_total{endpoint="job",mode="async",outcome="ok",service="jobs"}`:          1,
		`platform_rejections_total{code="key_revoked"}`:                                            2, // invoke, validate
		`platform_rejections_total{code="invalid_key"}`:                                            1,
		`platform_rejections_total{code="service_not_found"}`:                                      1,
		`platform_rejections_total{code="endpoint_not_found"}`:                                     1,
		`platform_rejections_total{code="invalid_signature"}`:                                      2, // forged report, wrong serviceSecret
		`platform_rejections_total{code="forbidden"}`:                                              1,
		`platform_units_metered_total{service="obs",source="gateway"}`:                             1,
		`platform_units_metered_total{service="obs",source="report"}`:                              1.5,
		`platform_units_metered_total{service="jobs",source="completion"}`:                         2,
		`platform_signature_failures_total{route="report"}`:                                        1,
		`platform_signature_failures_total{route="validate"}`:                                      1,
		`platform_job_transitions_total{state="PENDING"}`:                                          1,
		`platform_job_transitions_total{state="RUNNING"}`:                                          1,
		`platform_job_transitions_total{state="COMPLETED"}`:                                        1,
		`platform_preflights_total{outcome="ok",route="validate",service="obs"}`:                   1,
		`platform_preflights_total{outcome="key_revoked",route="validate",service="obs"}`:          1,
		`platform_preflights_total{outcome="invalid_signature",route="validate",service=""}`:       1,
		`platform_preflights_total{outcome="ok",route="estimate_usage",service="obs"}`:             1,
		`platform_preflights_total{outcome="quota_exceeded",route="estimate_usage",service="obs"}`: 1,
		`platform_preflights_total{outcome="forbidden",route="billing_estimate",service=""}`:       1,
	} {
		if got := delta(series); got != want {
			t.Errorf("%s went up by %v, want %v", series, got, want)
		}
	}
	if delta("platform_store_commit_seconds_count") < 4 || delta("platform_store_commit_writes_sum") < 4 {
		t.Errorf("store commits not observed: %v commits, %v writes", delta("platform_store_commit_seconds_count"), delta("platform_store_commit_writes_sum"))
	}
	for series := range after {
		if strings.Contains(series, "made-up") {
			t.Errorf("a caller's made-up id became a label: %s", series)
		}
	}
	// The admin endpoint serves the same registry.
	if adm := metricSamples(t, adminURL); adm[`platform_units_metered_total{service="obs",source="report"}`] != after[`platform_units_metered_total{service="obs",source="report"}`] {
		t.Errorf("admin /metrics differs: %v", adm[`platform_units_metered_total{service="obs",source="report"}`])
	}

	// A reload registers the collectors in the new config's registry: no
	// duplicate-registration panic, and the counts carry on.
	for i := range 2 {
		tester.InitServer(observedConfig(dir, observedCatalog(syncBE.URL, asyncBE.URL, fmt.Sprintf(`
		service extra%d {
			backend %s
			secret %s
			endpoint call
		}`, i, syncBE.URL, coreSecret))), "caddyfile")
	}
	if resp, body := call(t, "POST", invokeURL("obs", "call"), key, "{}"); resp.StatusCode != 200 {
		t.Fatalf("invoke after reload: %d %s", resp.StatusCode, body)
	}
	reloaded := metricSamples(t, metricsURL)
	if got := reloaded[`platform_invokes_total{endpoint="call",mode="sync",outcome="ok",service="obs"}`] -
		after[`platform_invokes_total{endpoint="call",mode="sync",outcome="ok",service="obs"}`]; got != 1 {
		t.Errorf("after reload the invoke counter went up by %v", got)
	}
	if metricSamples(t, adminURL)[`platform_units_metered_total{service="obs",source="gateway"}`] == 0 {
		t.Error("admin /metrics lost the platform series after reload")
	}

	// Every refusal is logged with its code and request id; no line holds
	// a key, secret or signature, in our logs or in Caddy's own.
	tester.InitServer(fmt.Sprintf("{\n\tadmin localhost:%d\n}\n", adminPort), "caddyfile") // flush and close the log files
	logs := map[string][]byte{}
	for _, name := range []string{"caddy.log", "access.log"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		logs[name] = b
	}
	for _, s := range secrets {
		if len(s) < 8 {
			t.Fatalf("secret list holds %q: the test lost a value", s)
		}
		for name, b := range logs {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s contains %q", name, s)
			}
		}
	}
	refusals := map[string]int{}
	for _, line := range bytes.Split(logs["caddy.log"], []byte("\n")) {
		var entry map[string]any
		if len(line) == 0 || json.Unmarshal(line, &entry) != nil {
			continue
		}
		msg, _ := entry["msg"].(string)
		if !strings.HasSuffix(msg, "refused") {
			continue
		}
		code, _ := entry["code"].(string)
		id, _ := entry["request_id"].(string)
		if code == "" || len(id) < 32 {
			t.Errorf("refusal logged without code or request id: %s", line)
		}
		refusals[msg]++
	}
	t.Logf("logs: caddy.log %d bytes, access.log %d bytes; refusals %v; %d secrets checked", len(logs["caddy.log"]), len(logs["access.log"]), refusals, len(secrets))
	if forgedID == "" || !bytes.Contains(logs["caddy.log"], []byte(`"request_id":"`+forgedID+`"`)) {
		t.Errorf("the refused report's X-Platform-Request-ID %q is not in the log", forgedID)
	}
	for _, msg := range []string{"invoke refused", "usage request refused", "core request refused"} {
		if refusals[msg] == 0 {
			t.Errorf("no %q line in the log; saw %v", msg, refusals)
		}
	}
	if !bytes.Contains(logs["access.log"], []byte(`"uri":"/api/usage/progress/`)) {
		t.Error("the access log did not record the progress call")
	}
}
