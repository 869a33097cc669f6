package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
)

// outcomeSummary reads GET /platform/outcomes/summary?by=outcome: calls by
// outcome.
func outcomeSummary(t *testing.T, query string) map[string]int64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://localhost:%d/platform/outcomes/summary?by=outcome&%s", adminPort, query))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("outcome summary: %d %s", resp.StatusCode, body)
	}
	var series struct {
		Points []struct {
			Group string
			Calls int64
		}
	}
	if err := json.Unmarshal(body, &series); err != nil {
		t.Fatalf("outcome summary %s: %v", body, err)
	}
	out := map[string]int64{}
	for _, p := range series.Points {
		out[p.Group] = p.Calls
	}
	return out
}

// refused is the calls with an outcome that is an error code.
func refused(byOutcome map[string]int64) int64 {
	var n int64
	for outcome, calls := range byOutcome {
		switch outcome {
		case "1xx", "2xx", "3xx", "4xx", "5xx", "cut_off":
		default:
			n += calls
		}
	}
	return n
}

// TestCallOutcomes: calls through the whole server, charged or not, are in
// the admin API's call outcomes at once, each once: answered, refused for
// the quota, refused for a bad key, the backend's 5xx; and a reload in
// between neither drops nor doubles a count.
func TestCallOutcomes(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	dir := t.TempDir()
	g := startGateway(t, dir, catalogBlock(be.URL))
	key, _ := g.newKey("u-out")
	g.subscribe("u-out", "svc", "sub", "ACTIVE") // quota 5
	send := func(endpoint, key string, n int) {
		for range n {
			resp, _ := call(t, "POST", invokeURL("svc", endpoint), key, `{}`)
			resp.Body.Close()
		}
	}
	// The counter is the process's: compare with what is there already.
	refusedBefore := refused(outcomeSummary(t, ""))
	send("fail", key, 2) // the backend's 503: not charged
	send("echo", key, 3)
	send("echo", "psk_not_a_key", 1)
	before := outcomeSummary(t, "serviceId=svc")
	if before["5xx"] != 2 || before["2xx"] != 3 || len(before) != 2 {
		t.Errorf("service svc's outcomes %v, want 2xx 3, 5xx 2", before)
	}
	if all := outcomeSummary(t, ""); refused(all) != refusedBefore+1 {
		t.Errorf("outcomes %v: want one more call refused for its key", all)
	}

	// A reload: the counter outlives it, and what was flushed is not
	// counted again.
	startGateway(t, dir, catalogBlock(be.URL)+fmt.Sprintf("\n\t\tservice extra {\n\t\t\tbackend %s\n\t\t\tsecret %s\n\t\t\tendpoint echo\n\t\t}", be.URL, testSecret))
	send("echo", key, 3) // the last one over the quota
	after := outcomeSummary(t, "userId=u-out")
	if after["2xx"] != 5 || after["5xx"] != 2 || after["quota_exceeded"] != 1 || len(after) != 3 {
		t.Errorf("u-out's outcomes after a reload %v, want 2xx 5, 5xx 2, quota_exceeded 1", after)
	}
}
