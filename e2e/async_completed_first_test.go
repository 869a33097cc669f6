package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
)

// TestAsyncCompletedBeforeRefusedForward: a backend that completes its job
// (posting the completion to the callback URL, which the gateway takes and
// charges) and then answers the forward with an error. The wire contract
// lets a backend post its completion before it answers the forward, and
// the job keeps what it posted: the completion stands and is charged. The
// caller must then be told the job was accepted (202), as its status says
// COMPLETED with the result, not 502 service_error "the service backend
// refused the job", which reads as a failure a caller retries, paying a
// second time for work it has already been charged for.
func TestAsyncCompletedBeforeRefusedForward(t *testing.T) {
	for _, tc := range []struct {
		name       string
		completion string // its status and units
		forward    int    // what the backend answers the forward
		late       bool   // it answers after the proxy's response_header_timeout
		wantStatus int    // the caller's answer
		wantJob    string
		wantUnits  billing.Units
	}{
		{"completed then 500", `"status":"COMPLETED","result":"done","units":3`, 500, false, http.StatusAccepted, "COMPLETED", billing.Whole(3)},
		{"completed then 404", `"status":"COMPLETED","result":"done"`, 404, false, http.StatusAccepted, "COMPLETED", billing.Whole(1)},
		{"completed then timed out", `"status":"COMPLETED","result":"done","units":2`, 200, true, http.StatusAccepted, "COMPLETED", billing.Whole(2)},
		// A job the backend failed itself stays a refusal: nothing charged.
		{"failed then 500", `"status":"FAILED","errorMessage":"no"`, 500, false, http.StatusBadGateway, "FAILED", 0},
		{"failed then timed out", `"status":"FAILED","errorMessage":"no"`, 200, true, http.StatusGatewayTimeout, "FAILED", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			completed := make(chan int, 1)
			be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				raw, _ := io.ReadAll(r.Body)
				var env usageEnvelope
				if json.Unmarshal(raw, &env) != nil {
					http.Error(w, "not an envelope", http.StatusBadRequest)
					return
				}
				body := fmt.Sprintf(`{%s,"timestamp":%d}`, tc.completion, time.Now().Unix())
				ts := usageURLTimestamp(t, env.CallbackURL)
				req, _ := http.NewRequest("POST", env.CallbackURL, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Platform-Signature", e2etest.UsageSign(usageSecret, []byte(body), ts))
				req.Header.Set("X-Platform-Timestamp", ts)
				resp, err := client.Do(req)
				code := 0
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				completed <- code
				if tc.late {
					time.Sleep(time.Second)
				}
				http.Error(w, "something went wrong after all", tc.forward)
			}))
			t.Cleanup(be.Close)
			g := startGatewayWithTransport(t, t.TempDir(), usageCatalog(be.URL, be.URL), "\t\t\tresponse_header_timeout 300ms")
			user := "u-first"
			key, _ := g.newKey(user)
			g.subscribe(user, "svc", "basic", "ACTIVE")

			resp, raw := call(t, "POST", asyncURL("/api", "svc", "job"), key, `{"q":1}`, "Content-Type", "application/json")
			if code := <-completed; code != 200 {
				t.Fatalf("the backend's completion: %d", code)
			}
			id := resp.Header.Get("X-Platform-Request-Id")
			if st := jobStatusOf(t, id, key); st != tc.wantJob {
				t.Fatalf("job %s, want %s", st, tc.wantJob)
			}
			if got := ledgerSum(g.ledger(user)); got != tc.wantUnits {
				t.Errorf("charged %s, want %s", got, tc.wantUnits)
			}
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("caller's answer %d %s, want %d: the job is %s and charged %s", resp.StatusCode, raw, tc.wantStatus, tc.wantJob, tc.wantUnits)
			}
			if tc.wantStatus == http.StatusAccepted {
				var acc usageAccepted
				if json.Unmarshal(raw, &acc) != nil || acc.Status != "ACCEPTED" || acc.RequestID != id ||
					resp.Header.Get("Location") != gwBase+"/api/requests/"+id+"/status" {
					t.Errorf("202 body %s, Location %q", raw, resp.Header.Get("Location"))
				}
			}
		})
	}
}

// jobStatusOf is the job's status as its caller polls it.
func jobStatusOf(t *testing.T, id, key string) string {
	t.Helper()
	resp, raw := call(t, "GET", gwBase+"/api/requests/"+id+"/status", key, "")
	var st struct {
		Status string `json:"status"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(raw, &st) != nil {
		t.Fatalf("status of %s: %d %s", id, resp.StatusCode, raw)
	}
	return st.Status
}
