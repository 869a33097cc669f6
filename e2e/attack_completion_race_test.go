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

// TestAttackCompletionRacesRefusedForward: a backend that posts its job's
// completion (3 units) at the same moment as it answers the forward with
// 500, the two racing through the real server. Whichever the gateway
// takes first decides, and the caller, the job and the ledger agree: the
// caller's 202 with the job COMPLETED, 3 units charged and the completion
// 200; or the caller's 502 with the job FAILED, nothing charged and the
// completion 409. Never a 502 for a charged job, nor a 202 for a failed
// one, nor a hold left behind. Ten jobs, the completion first a little
// later, then a little earlier, than the refusal.
func TestAttackCompletionRacesRefusedForward(t *testing.T) {
	type outcome struct{ completion int }
	outcomes := make(chan outcome, 16)
	var round int
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var env usageEnvelope
		if json.Unmarshal(raw, &env) != nil {
			http.Error(w, "not an envelope", http.StatusBadRequest)
			return
		}
		// Rounds 0-4 post the completion a little after the refusal,
		// rounds 5-9 refuse a little after the completion.
		lateCompletion := time.Duration(max(5-round, 0)) * 200 * time.Microsecond
		lateRefusal := time.Duration(max(round-5, 0)) * 200 * time.Microsecond
		go func() {
			time.Sleep(lateCompletion)
			body := fmt.Sprintf(`{"status":"COMPLETED","result":"done","units":3,"timestamp":%d}`, time.Now().Unix())
			ts := usageURLTimestamp(t, env.CallbackURL)
			req, _ := http.NewRequest("POST", env.CallbackURL, strings.NewReader(body))
			req.Header.Set("X-Platform-Signature", e2etest.UsageSign(usageSecret, []byte(body), ts))
			req.Header.Set("X-Platform-Timestamp", ts)
			code := 0
			if resp, err := client.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			}
			outcomes <- outcome{code}
		}()
		time.Sleep(lateRefusal)
		http.Error(w, "refused", http.StatusInternalServerError)
	}))
	t.Cleanup(be.Close)
	g := startGateway(t, t.TempDir(), usageCatalog(be.URL, be.URL))
	user := "u-race-forward"
	key, _ := g.newKey(user)
	g.subscribe(user, "svc", "basic", "ACTIVE")
	var accepted int
	for round = 0; round < 10; round++ {
		resp, raw := call(t, "POST", asyncURL("/api", "svc", "job"), key, `{"q":1}`, "Content-Type", "application/json")
		o := <-outcomes
		id := resp.Header.Get("X-Platform-Request-Id")
		job := jobStatusOf(t, id, key)
		switch {
		case resp.StatusCode == http.StatusAccepted && job == "COMPLETED" && o.completion == 200:
			accepted++
		case resp.StatusCode == http.StatusBadGateway && job == "FAILED" && o.completion == 409:
		default:
			t.Errorf("round %d: caller %d %s, job %s, completion %d", round, resp.StatusCode, raw, job, o.completion)
		}
	}
	t.Logf("%d of 10 completions taken before the refusal", accepted)
	if got := ledgerSum(g.ledger(user)); got != billing.Whole(int64(3*accepted)) {
		t.Errorf("charged %s for %d completed jobs of 3 units", got, accepted)
	}
	// Nothing is held: the whole quota of 100 less what was charged can
	// be estimated.
	left := 100 - 3*accepted
	resp, raw := call(t, "POST", gwBase+"/api/v1/billing/usage/estimate", key,
		fmt.Sprintf(`{"userId":%q,"serviceId":"svc","estimatedUnits":%d}`, user, left), "Content-Type", "application/json")
	if resp.StatusCode != 200 {
		t.Errorf("estimate of the %d left: %d %s", left, resp.StatusCode, raw)
	}
}
